"""Issue 16 on a GPU: what real programs use (expandable segments, memory pools, host functions,
host memory kernels read, torch.compile with its caches gone), each example captured with
``python -m replayfmt.capture``, then replayed, verified and benchmarked in other processes."""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import pytest
from numba_env import require_numba_runs
from test_capture_gpu import EXAMPLES, SCRIPTS, capture, capture_ready, dump, needs, run, verified  # noqa: F401 - a fixture

pytestmark = pytest.mark.usefixtures("capture_ready")


def captured(
    out: Path, script: Path, *flags: str, env: dict[str, str] | None = None, args: tuple[str, ...] = ()
) -> str:
    """Capture ``script`` (with ``args``); the recorder's own verdict must be 'replayable: yes'."""
    if env:
        args = (sys.executable, "-m", "replayfmt.capture", "-o", str(out), *flags, str(script), *args)
        saved = dict(os.environ)
        os.environ.update(env)
        try:
            result = run(list(args))
        finally:
            os.environ.clear()
            os.environ.update(saved)
        assert result.returncode == 0, result.stderr[-3000:]
    else:
        result = capture(out, script, *flags, args=args)
    assert "replayable: yes" in result.stderr, result.stderr[-3000:]
    return result.stderr


def benchmarked(path: Path) -> str:
    result = run([sys.executable, "-m", "replayfmt_tools.benchmark_replay", "--repetitions=3", str(path)])
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return result.stdout


def test_torch_expandable_segments(tmp_path):
    needs("torch")
    out = tmp_path / "expandable.kreplay"
    captured(out, EXAMPLES / "torch_expandable_segments.py")
    text = dump(out, "--format=jsonl")
    assert '"label":"cuMemMap"' in text  # buffers over mapped extents
    verified(out, "--tolerance")
    benchmarked(out)


def test_cupy_memory_pool(tmp_path):
    needs("cupy")
    out = tmp_path / "pool.kreplay"
    captured(out, EXAMPLES / "cupy_memory_pool.py")
    assert "cuMemAlloc" in dump(out, "--format=jsonl") and "Async" in dump(out, "--format=jsonl")
    verified(out)
    benchmarked(out)


def test_cupy_host_function(tmp_path):
    needs("cupy")
    out = tmp_path / "host.kreplay"
    captured(out, EXAMPLES / "cupy_host_function.py")
    text = dump(out)
    assert "host_function" in text
    verified(out)
    benchmarked(out)


@pytest.mark.parametrize(
    "flags",
    [
        (),
        ("--registered",),  # registered NumPy memory below 4 GiB: passed on the H100 once the fix landed
    ],
)
def test_numba_host_memory(tmp_path, flags):
    needs("numba")
    require_numba_runs(run([sys.executable, str(EXAMPLES / "numba_host_memory.py"), *flags]))
    out = tmp_path / "hostmem.kreplay"
    result = run(
        [sys.executable, "-m", "replayfmt.capture", "-o", str(out), str(EXAMPLES / "numba_host_memory.py"), *flags]
    )
    assert result.returncode == 0 and "replayable: yes" in result.stderr, result.stderr[-3000:]
    text = dump(out, "--format=jsonl")
    assert '"memory":"host_pinned"' in text and '"memory":"managed"' in text, text[:3000]
    verified(out)


def test_torch_compile_replays_with_its_caches_gone(tmp_path):
    needs("torch")
    cache = tmp_path / "caches"
    env = {"TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"), "TRITON_CACHE_DIR": str(cache / "triton")}
    out = tmp_path / "compiled.kreplay"
    report = captured(out, EXAMPLES / "torch_compile.py", "--scope", "step", env=env)
    assert "needs nothing from the host" in report
    assert any(cache.rglob("*.cubin"))  # Inductor did compile into the cache
    shutil.rmtree(cache)  # as on any other machine
    assert "host needs    nothing" in dump(out, "--summary")
    verified(out, "--tolerance")
    benchmarked(out)


def test_an_unreplayable_capture_exits_1_unless_kept(tmp_path):
    needs("torch")
    script = tmp_path / "ipc.py"
    script.write_text(
        "import torch\nx = torch.ones(4, device='cuda')\n"
        "import cuda.bindings.driver as cu\nprint(cu.cuIpcGetMemHandle(x.data_ptr()))\n"
    )
    out = tmp_path / "ipc.kreplay"
    base = [sys.executable, "-m", "replayfmt.capture", "-o", str(out)]
    refused = run([*base, str(script)])
    assert refused.returncode == 1 and not out.exists(), refused.stderr[-2000:]
    assert "cannot be replayed (" in refused.stderr and "--keep-partial" in refused.stderr
    kept = run([*base, "--keep-partial", str(script)])
    assert kept.returncode == 0 and out.exists() and "replayable: no: " in kept.stderr, kept.stderr[-2000:]


def graph_launches(path: Path) -> int:
    """GraphLaunch operations: each cuGraphLaunch replays as a graph."""
    text = dump(path, "--format=jsonl")
    return sum(1 for line in text.splitlines() if '"kind":"graph_launch"' in line)


def test_torch_reduce_overhead_graph_launches(tmp_path):
    needs("torch")
    out = tmp_path / "graphs.kreplay"
    report = captured(out, EXAMPLES / "torch_reduce_overhead.py")
    assert "cuGraphLaunch" not in report  # nothing unsupported
    assert graph_launches(out) >= 2, dump(out, "--summary")
    assert "    node    " in dump(out) and " kernel " in dump(out)  # a graph's nodes, kernels among them
    verified(out, "--tolerance")
    benchmarked(out)
    per_kernel = run(
        [sys.executable, "-m", "replayfmt_tools.benchmark_replay", "--repetitions=3", "--per-kernel", str(out)]
    )
    assert per_kernel.returncode == 0 and "(graph " in per_kernel.stdout, (per_kernel.stdout + per_kernel.stderr)[
        -3000:
    ]


def test_cupy_stream_capture_graph(tmp_path):
    needs("cupy")
    out = tmp_path / "captured_graph.kreplay"
    captured(out, EXAMPLES / "cupy_stream_capture.py")
    assert graph_launches(out) >= 2
    verified(out)


def test_cuda_python_explicit_graph(tmp_path, request):
    arch = request.getfixturevalue("capture_ready")
    out = tmp_path / "graph.kreplay"
    result = run(
        [sys.executable, "-m", "replayfmt.capture", "-o", str(out), str(EXAMPLES / "cuda_python_graph.py"), arch]
    )
    assert result.returncode == 0 and "replayable: yes" in result.stderr, result.stderr[-3000:]
    assert graph_launches(out) == 3
    text = dump(out)
    for kind in ("memset", "kernel", "memcpy", "event_record", "child_graph"):
        assert f" {kind} " in text, text
    verified(out)
    benchmarked(out)


def snapshot_figures(report: str) -> tuple[int, int]:
    """(bytes snapshotted, bytes skipped outside live buffers) from the capture report."""
    taken = re.search(r"snapshots: (\d+) bytes", report)
    skipped = re.search(r"snapshots skipped (\d+) bytes outside live buffers", report)
    assert taken, report[-3000:]
    return int(taken[1]), int(skipped[1]) if skipped else 0


def test_jax_jit_default_arena(tmp_path):
    """XLA's default settings: one arena of most of the device; the capture snapshots the live
    arrays in it (a few MB), replays, verifies and benchmarks."""
    needs("jax")
    out = tmp_path / "jax.kreplay"
    report = captured(out, EXAMPLES / "jax_jit.py")
    taken, skipped = snapshot_figures(report)
    assert taken < 256 << 20 and skipped > 4 << 30, report[-3000:]  # the arena is tens of GB
    assert "(jax)" in report
    verified(out, "--tolerance")
    benchmarked(out)


def test_jax_jit_donated_params(tmp_path):
    """Donated parameters (a training loop's usual jit) are live arrays too."""
    needs("jax")
    out = tmp_path / "jax_donate.kreplay"
    report = captured(out, EXAMPLES / "jax_jit.py", args=("3", "--donate"))
    taken, skipped = snapshot_figures(report)
    assert taken < 256 << 20 and skipped > 4 << 30, report[-3000:]
    verified(out, "--tolerance")


def test_torch_bounded_snapshot_skips_free_blocks(tmp_path):
    needs("torch")
    out = tmp_path / "free_blocks.kreplay"
    report = captured(out, SCRIPTS / "torch_free_blocks.py", "--scope", "step")
    taken, skipped = snapshot_figures(report)
    # state and checkpoint of the 64 MiB tensor; the segment's 192 MiB of free blocks skipped each time
    assert taken == 2 * (64 << 20) and skipped == 2 * (192 << 20), report[-3000:]
    assert "(torch)" in report
    verified(out)
