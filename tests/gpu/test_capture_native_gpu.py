"""Programs that are not Python, recorded through CUDA's injection entry point (issue 28): each
C++ program under native/ is built with nvcc, run bare (it checks its own results), captured with
``python -m replayfmt.capture`` (the same command as for Python scripts), then replayed,
verified and benchmarked in other processes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from driver_refusals import skip_when_the_range_is_refused
from test_capture_gpu import ROOT, dump, replay, run

NATIVE = Path(__file__).parent / "native"


@pytest.fixture(scope="module")
def native_ready(gpu_arch) -> str:
    import importlib.util

    if importlib.util.find_spec("cupti") is None:
        pytest.skip("cupti-python is not installed (pip install 'replayfmt[capture]')")
    from replayfmt.capture.injection import shared_libpython
    from replayfmt.errors import ReplayUsageError

    try:
        shared_libpython()
    except ReplayUsageError as exc:
        pytest.skip(str(exc))
    return gpu_arch


def _cuda_library_flags() -> list[str]:
    """-I/-L for the CUDA libraries pip wheels hold (nvidia-cublas...), where the toolkit lacks them."""
    flags = []
    try:
        import nvidia  # type: ignore[import-not-found]

        for root in getattr(nvidia, "__path__", []):
            for base in [Path(root), *Path(root).glob("*")]:
                if (base / "include" / "cublas_v2.h").is_file():
                    flags += [f"-I{base / 'include'}", f"-L{base / 'lib'}", f"-Xlinker=-rpath={base / 'lib'}"]
    except ImportError:
        pass
    return flags


def build(name: str, arch: str, folder: Path, *libraries: str) -> Path:
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    out = folder / name
    command = [nvcc, f"-arch={arch}", "-O2", "-o", str(out), str(NATIVE / f"{name}.cu"), f"-I{NATIVE}", "-ldl"]
    result = subprocess.run([*command, *libraries], capture_output=True, text=True)
    if result.returncode != 0 and libraries:
        result = subprocess.run([*command, *_cuda_library_flags(), *libraries], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def bare(program: Path, *args: str) -> str:
    result = subprocess.run([str(program), *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def capture_native(out: Path, program: Path, *flags: str, args: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    result = run([sys.executable, "-m", "replayfmt.capture", "-o", str(out), *flags, str(program), *args])
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert "replayable: yes" in result.stderr, result.stderr[-3000:]
    assert out.exists()
    return result


def verify(out: Path, report: str) -> str:
    fixed = ("--fixed-addresses",) if "with --fixed-addresses" in report else ()
    result = replay(out, "--verify", *fixed, no_aslr=bool(fixed))
    skip_when_the_range_is_refused(result)
    text = result.stdout + result.stderr
    assert result.returncode == 0, text[-4000:]
    assert "verified:" in text and "verified: 0 " not in text  # something was compared
    return text


def benchmark(out: Path, *flags: str) -> dict:
    path = out.with_suffix(".json")
    result = run(
        [
            sys.executable,
            "-m",
            "replayfmt_tools.benchmark_replay",
            *flags,
            "--format=json",
            f"--output={path}",
            "--repetitions=20",
            str(out),
        ]
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    data = json.loads(path.read_text())
    assert data["device_ms"]["median"] > 0
    return data


def launches(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in dump(out, "--format=jsonl").splitlines() if line.strip()]
    return [r for r in rows if r.get("kind") == "launch"]


def kinds(out: Path) -> dict[str, int]:
    """Operations by kind (dump-replay's JSON summary)."""
    return json.loads(dump(out, "--format=json"))["operations"]


def test_runtime_api_streams_and_events(tmp_path, native_ready):
    program = build("streams", native_ready, tmp_path)
    assert "streams ok" in bare(program)
    out = tmp_path / "streams.kreplay"
    result = capture_native(out, program)
    assert "streams ok" in result.stdout  # the program ran as it does bare, and checked its result
    counts = kinds(out)
    assert counts.get("launch", 0) == 12, counts  # 4 iterations x 3 kernels
    assert counts.get("event_record", 0) >= 12 and counts.get("stream_wait_event", 0) >= 16, counts
    assert len({r["stream"] for r in launches(out)}) == 3
    verify(out, result.stderr)
    assert benchmark(out).get("original"), "the original program's device times were not stored"


def test_original_times_cover_every_launch(tmp_path, native_ready):
    program = build("streams", native_ready, tmp_path)
    out = tmp_path / "streams.kreplay"
    capture_native(out, program)
    original = benchmark(out)["original"]
    assert original["timed"] >= 12 and original["untimed_device_ops"] == 0, original


def test_cublas_sgemm_and_gemm_ex(tmp_path, native_ready):
    program = build("gemm", native_ready, tmp_path, "-lcublas")
    assert "gemm ok" in bare(program)
    out = tmp_path / "gemm.kreplay"
    result = capture_native(out, program)
    assert kinds(out).get("launch", 0) >= 2
    verify(out, result.stderr)
    benchmark(out)


def test_cublaslt_matmul_with_bias_in_a_loop(tmp_path, native_ready):
    program = build("gemm_lt", native_ready, tmp_path, "-lcublasLt")
    assert "gemm_lt ok" in bare(program)
    out = tmp_path / "gemm_lt.kreplay"
    result = capture_native(out, program)
    assert "gemm_lt ok" in result.stdout
    assert kinds(out).get("launch", 0) >= 20  # every step's kernel, repeats included
    verify(out, result.stderr)
    assert benchmark(out).get("original"), "the original program's device times were not stored"


def test_cuda_graph(tmp_path, native_ready):
    program = build("graph", native_ready, tmp_path)
    assert "graph ok" in bare(program)
    out = tmp_path / "graph.kreplay"
    result = capture_native(out, program)
    assert kinds(out).get("graph_launch", 0) == 5
    verify(out, result.stderr)
    benchmark(out)


def test_nvtx_range_as_scope(tmp_path, native_ready):
    program = build("nvtx_step", native_ready, tmp_path)
    assert "nvtx step ok" in bare(program)
    out = tmp_path / "step.kreplay"
    result = capture_native(out, program, "--scope", "step")
    names = [r["function"] for r in launches(out)]
    assert len(names) == 6 and all("warm" not in n for n in names), names  # only the step's launches
    verify(out, result.stderr)
    assert benchmark(out, "--scope=step").get("original")


def test_kernel_mode(tmp_path, native_ready):
    program = build("streams", native_ready, tmp_path)
    out = tmp_path / "k.kreplay"
    result = capture_native(out, program, "--mode", "kernel", "--kernels", "add", "--max-per-kernel", "2")
    assert kinds(out).get("launch", 0) == 2
    verify(out, result.stderr)


def test_children_that_use_cuda_are_listed(tmp_path, native_ready):
    program = build("streams", native_ready, tmp_path)
    script = tmp_path / "twice.sh"
    script.write_text(f'#!/bin/sh\n"{program}" 1 && "{program}" 2\n')
    script.chmod(0o755)
    out = tmp_path / "first.kreplay"
    result = capture_native(out, script)
    assert result.stdout.count("streams ok") == 2
    assert "not recorded: process" in result.stderr  # the second program: listed, not recorded
    assert kinds(out).get("launch", 0) == 3  # the first program's one iteration


def test_program_without_cuda_is_a_one_line_error(tmp_path, native_ready):
    out = tmp_path / "none.kreplay"
    result = run([sys.executable, "-m", "replayfmt.capture", "-o", str(out), shutil.which("true") or "/bin/true"])
    assert result.returncode == 1 and "never initialised CUDA" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not out.exists()


def test_benchmark_script_runs(tmp_path, native_ready):
    result = run([sys.executable, str(ROOT / "benchmarks" / "native_capture_bench.py"), "--launches", "2000"])
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert "per launch" in result.stdout and "GPU busy" in result.stdout
    print(result.stdout)
    assert os.path.exists(ROOT / "benchmarks" / "native_capture_bench.py")
