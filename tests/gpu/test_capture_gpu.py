"""The recorder end to end on a GPU: each example program captured with
``python -m replayfmt.capture``, then replayed and verified with run-replay in another process."""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
from driver_refusals import skip_when_the_range_is_refused
from numba_env import require_numba_runs

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "capture"
SCRIPTS = Path(__file__).parent / "capture_scripts"


@pytest.fixture(scope="module")
def capture_ready(gpu_arch) -> str:
    if importlib.util.find_spec("cupti") is None:
        pytest.skip("cupti-python is not installed (pip install 'replayfmt[capture]')")
    return gpu_arch


def needs(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed")


def run(args: list[str], *, no_aslr: bool = False, timeout: int = 300) -> subprocess.CompletedProcess:
    if no_aslr:
        args = ["setarch", platform.machine(), "-R", *args]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


def capture(out: Path, script: Path, *flags: str, args: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    result = run([sys.executable, "-m", "replayfmt.capture", "-o", str(out), *flags, str(script), *args])
    assert result.returncode == 0, result.stderr[-3000:]
    assert out.exists()
    return result


def replay(path: Path, *flags: str, no_aslr: bool = False) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "replayfmt_tools.run_replay", str(path), *flags], no_aslr=no_aslr)


def dump(path: Path, *flags: str) -> str:
    result = run([sys.executable, "-m", "replayfmt_tools.dump_replay", *flags, str(path)])
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def verified(path: Path, *flags: str, no_aslr: bool = False) -> str:
    """Replay with --verify: exit 0, and the JSON report says N > 0 ranges were compared, some with
    evidence, none failed (docs/VERIFY.md). Returns the text lines (stderr) and the JSON."""
    result = replay(path, "--verify", "--format=json", *flags, no_aslr=no_aslr)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    report = json.loads(result.stdout)["verification"]
    assert report["verified"] and report["compared"] > 0 and report["evidence"] > 0, report
    assert all(r["passed"] for r in report["ranges"])
    return result.stderr + result.stdout


def test_cuda_python_saxpy_two_streams_with_an_event_edge(tmp_path, capture_ready):
    out = tmp_path / "saxpy.kreplay"
    report = capture(out, EXAMPLES / "cuda_python_saxpy.py", args=(capture_ready,)).stderr
    assert "saxpy" in report
    text = dump(out)
    for kind in ("launch", "event_record", "stream_wait_event", "checkpoint"):
        assert kind in text, text
    verified(out)


def test_kernel_mode_big_shared_memory(tmp_path, capture_ready, kernels):
    cubin = tmp_path / "replay_kernels.cubin"
    cubin.write_bytes(kernels["replay_kernels"])
    out = tmp_path / "reverse.kreplay"
    report = capture(
        out,
        SCRIPTS / "big_shared.py",
        "--mode",
        "kernel",
        "--kernels",
        "reverse",
        "--skip-first",
        "1",
        "--max-per-kernel",
        "2",
        args=(str(cubin),),
    ).stderr
    assert "reverse_in_shared" in report
    text = dump(out)
    assert "reverse_in_shared#1" in text and "reverse_in_shared#2" in text and "reverse_in_shared#0" not in text
    assert "98304" in text  # the dynamic shared memory of the launch
    verified(out)


def test_torch_eager_mlp(tmp_path, capture_ready):
    needs("torch")
    out = tmp_path / "mlp.kreplay"
    capture(out, EXAMPLES / "torch_mlp.py")
    verified(out, "--tolerance")


def test_torch_eager_mlp_scope_only(tmp_path, capture_ready):
    needs("torch")
    out = tmp_path / "step.kreplay"
    capture(out, EXAMPLES / "torch_mlp.py", "--scope", "step")
    text = dump(out, "--summary")
    assert "step" in text
    verified(out, "--tolerance")


def test_torch_compile(tmp_path, capture_ready):
    needs("torch")
    out = tmp_path / "compiled.kreplay"
    capture(out, EXAMPLES / "torch_compile.py", "--scope", "step")
    text = dump(out)
    assert "triton" in text
    verified(out, "--tolerance")


def test_triton_kernel(tmp_path, capture_ready):
    needs("triton")
    out = tmp_path / "add.kreplay"
    capture(out, EXAMPLES / "triton_add.py")
    verified(out)


def test_triton_tensor_descriptors_on_hopper(tmp_path, capture_ready):
    needs("triton")
    if not capture_ready.startswith("sm_9"):
        pytest.skip("tensor descriptors (TMA) need Hopper")
    out = tmp_path / "tma.kreplay"
    capture(out, EXAMPLES / "triton_tma.py")
    text = dump(out, "--format=jsonl")
    launch = next(line for line in text.splitlines() if '"launch"' in line and "scale_tma" in line)
    assert launch.count('"target_buffer"') >= 2  # both descriptors' addresses are relocated
    verified(out)


def test_cupy_rawkernel(tmp_path, capture_ready):
    needs("cupy")
    out = tmp_path / "cupy.kreplay"
    capture(out, EXAMPLES / "cupy_rawkernel.py")
    verified(out)


def test_numba_kernel(tmp_path, capture_ready):
    needs("numba")
    require_numba_runs(run([sys.executable, str(EXAMPLES / "numba_kernel.py")]))
    out = tmp_path / "numba.kreplay"
    capture(out, EXAMPLES / "numba_kernel.py")
    verified(out)


def test_cublas_gemm_with_fixed_addresses(tmp_path, capture_ready):
    needs("torch")
    out = tmp_path / "gemm.kreplay"
    # the recorder's own check replays at the recorded addresses too: the driver may refuse them there
    recorded = run(
        [
            sys.executable,
            "-m",
            "replayfmt.capture",
            "-o",
            str(out),
            "--fixed-addresses",
            str(SCRIPTS / "cublas_gemm.py"),
        ]
    )
    skip_when_the_range_is_refused(recorded)
    assert recorded.returncode == 0 and out.exists(), recorded.stderr[-3000:]
    refused = replay(out, "--verify")
    assert refused.returncode != 0 and "--fixed-addresses" in refused.stderr
    # the recording process held PyTorch's libraries, this one does not: run-replay moves the
    # driver's address range onto the recorded one (address_space.steer_device_arena)
    result = replay(out, "--verify", "--fixed-addresses")
    skip_when_the_range_is_refused(result)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]


def test_host_function_keeps_its_place_and_replays(tmp_path, capture_ready):
    needs("cupy")
    out = tmp_path / "host.kreplay"
    report = capture(out, SCRIPTS / "host_function.py").stderr
    assert "unsupported" not in report and "replayable: yes" in report
    assert "host_function" in dump(out)
    verified(out)


def test_another_cupti_subscriber_is_a_clear_error(tmp_path, capture_ready):
    needs("torch")
    result = run([sys.executable, str(SCRIPTS / "profiler_conflict.py"), str(tmp_path / "x.kreplay")])
    assert result.returncode == 0, result.stderr[-2000:]
    assert "refused: another CUPTI client" in result.stdout


def test_in_process_record_api_region_and_kernel_modes(tmp_path, capture_ready):
    needs("torch")
    script = tmp_path / "inproc.py"
    script.write_text(f"""
import torch, replayfmt.capture
rec = replayfmt.capture.record({str(tmp_path / "region.kreplay")!r}, start=False)
x = torch.arange(1 << 16, device="cuda", dtype=torch.float32)
with rec.region("step"):
    x.mul_(3).add_(1)
report = rec.close()
assert report.kernels, report.lines()
rec = replayfmt.capture.record({str(tmp_path / "kernel.kreplay")!r}, mode="kernel", kernels="sin")
for _ in range(3):
    y = torch.sin(x)  # a kernel first loaded under this recorder
report = rec.close()
assert sum(s.captured for s in report.kernels.values()) == 1, report.lines()
""")
    result = run([sys.executable, str(script)])
    assert result.returncode == 0, result.stderr[-3000:]
    verified(tmp_path / "region.kreplay")
    verified(tmp_path / "kernel.kreplay")
