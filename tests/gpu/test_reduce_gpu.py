"""reduce-replay and --jit-from-ptx on a GPU: a capture of kernel-mode style regions (each launch
with its state and checkpoint) reduced under --fails-verify with a substitute that computes wrong,
and under --faults with a launch that reads through a bad pointer; a Triton program's capture
keeps its kernels' PTX and replays from it with run-replay --jit-from-ptx --verify; and --faults
with a substitute that reads out of bounds keeps what the faulting launch reads."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_replay_gpu import AXPY, FAULT, SCALE, Capture, f32, i32, ints

import replayfmt
from replayfmt.format import model as m

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
N = 4096


def tool(name: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", f"replayfmt_tools.{name}", *args], capture_output=True, text=True, timeout=timeout
    )


def steps_capture(tmp_path: Path, kernels, *, fault_at: int | None = None, steps: int = 24) -> tuple[Path, int]:
    """``steps`` launches (axpy and scale in turn), each a region with its state and checkpoint;
    with ``fault_at``, that step is a write through a pointer nothing maps instead."""
    c = Capture(tmp_path / "steps.kreplay", kernels["replay_kernels"])
    x, y = c.buffer(4 * N, dtype=m.DType.FLOAT32, shape=(N,)), c.buffer(4 * N, dtype=m.DType.FLOAT32, shape=(N,))
    xs, ys = ints(N, 1), ints(N, 2)
    grid, block = (N // 256, 1, 1), (256, 1, 1)
    for k in range(steps):
        with c.w.scope(f"step#{k}"):
            c.w.state(buffer=x, data=xs)
            c.w.state(buffer=y, data=ys)
            if k == fault_at:
                c.launch(FAULT, (1, 1, 1), (32, 1, 1), (0xDEAD0000).to_bytes(8, "little"))
                continue
            if k % 2 == 0:
                c.launch(AXPY, grid, block, f32(2) + bytes(20) + i32(N) + bytes(4), [
                    m.Relocation(0, x, 8, 0), m.Relocation(0, y, 16, 0)])  # fmt: skip
                ys = (2 * xs + ys).astype(np.float32)
            else:
                c.launch(SCALE, grid, block, bytes(8) + f32(0.5) + i32(N), [m.Relocation(0, y, 0, 0)])
                ys = (ys * np.float32(0.5)).astype(np.float32)
            c.w.checkpoint({x: xs, y: ys}, name=f"step#{k}")
    return c.close(), c.exe


def device_work(path: Path) -> list[str]:
    with replayfmt.open(path) as cap:
        return [
            cap.object(op.executable).functions[op.function].name
            if op.kind == m.OperationKind.LAUNCH
            else op.kind.label
            for op in cap
            if op.kind in m.DEVICE_WORK
        ]


def test_fails_verify_reduces_to_one_wrong_kernel(tmp_path, kernels):
    path, exe = steps_capture(tmp_path, kernels)
    wrong = tmp_path / "wrong.cubin"
    wrong.write_bytes(kernels["replay_kernels_wrong"])  # axpy computes a * x + y + 1
    out = tmp_path / "small.kreplay"
    res = tool("reduce_replay", str(path), "-o", str(out), "--fails-verify", f"--executable-substitution={exe}={wrong}")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "launches 24 -> 1" in res.stdout, res.stdout
    assert device_work(out) == ["axpy"]
    with replayfmt.open(out) as cap:
        props = dict(cap.metadata.properties)
    new_id = props["reduce.result_substitutions"].split("=")[0]
    assert tool("run_replay", "--verify", str(out)).returncode == 0  # the captured kernel is right
    bad = tool("run_replay", "--verify", f"--executable-substitution={new_id}={wrong}", str(out))
    assert bad.returncode == 1 and "failed" in bad.stdout + bad.stderr


def test_faults_reduces_to_the_faulting_launch(tmp_path, kernels):
    path, _ = steps_capture(tmp_path, kernels, fault_at=17)
    out = tmp_path / "small.kreplay"
    res = tool("reduce_replay", str(path), "-o", str(out), "--faults=CUDA_ERROR_ILLEGAL_ADDRESS")
    assert res.returncode == 0, res.stderr[-3000:]
    assert device_work(out) == ["write_through"]
    replayed = tool("run_replay", str(out))
    assert replayed.returncode == 1 and "CUDA_ERROR_ILLEGAL_ADDRESS" in replayed.stderr


def test_faults_with_a_substitution_keeps_what_the_faulting_launch_reads(tmp_path, kernels):
    """A substitute axpy reads 1 TiB out of bounds, which faults whatever the data: the reduction
    keeps one axpy launch and the x and y it reads (each candidate of the inputs phase verified as
    captured), so the result faults with the substitution and verifies without it."""
    path, exe = steps_capture(tmp_path, kernels, steps=8)
    oob = tmp_path / "oob.cubin"
    oob.write_bytes(kernels["replay_kernels_oob"])
    out = tmp_path / "small.kreplay"
    res = tool(
        "reduce_replay", str(path), "-o", str(out), "--faults=CUDA_ERROR_ILLEGAL_ADDRESS",
        f"--executable-substitution={exe}={oob}",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    assert device_work(out) == ["axpy"], res.stdout
    assert f"inputs given {8 * N} -> {8 * N} bytes" in res.stdout, res.stdout  # x and y, all read
    with replayfmt.open(out) as cap:
        new_id = dict(cap.metadata.properties)["reduce.result_substitutions"].split("=")[0]
    assert tool("run_replay", "--verify", str(out)).returncode == 0, "the result lost what axpy reads"
    faulted = tool("run_replay", f"--executable-substitution={new_id}={oob}", str(out))
    assert faulted.returncode == 1 and "CUDA_ERROR_ILLEGAL_ADDRESS" in faulted.stderr


def test_a_capture_that_passes_is_refused(tmp_path, kernels):
    path, _ = steps_capture(tmp_path, kernels, steps=4)
    res = tool("reduce_replay", str(path), "-o", str(tmp_path / "o.kreplay"), "--faults")
    assert res.returncode == 1 and "the original capture passes the test" in res.stderr


def test_triton_capture_keeps_ptx_and_replays_from_it(tmp_path, gpu_arch):
    for module in ("cupti", "triton", "torch"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed")
    out = tmp_path / "softmax.kreplay"
    script = ROOT / "tests" / "gpu" / "capture_scripts" / "triton_softmax_repeated.py"
    captured = subprocess.run(
        # kernel mode: the Triton kernel alone (PyTorch's own kernels, which make its input, ship
        # cubins without PTX, and dump-replay lists them as such)
        [
            sys.executable,
            "-m",
            "replayfmt.capture",
            "-o",
            str(out),
            "--mode",
            "kernel",
            "--kernels",
            "softmax_kernel",
            str(script),
            "3",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert captured.returncode == 0, captured.stderr[-3000:]
    rows = [json.loads(line) for line in tool("dump_replay", "--format=jsonl", str(out)).stdout.splitlines()]
    exes = [r for r in rows if r["kind"] == "executable"]
    assert exes and all(r["has_ptx"] for r in exes), exes
    res = tool("run_replay", "--jit-from-ptx", "--verify", str(out))
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]


def test_slower_reduces_to_one_slow_kernel(tmp_path, kernels):
    path, exe = steps_capture(tmp_path, kernels, steps=8)
    slow = tmp_path / "slow.cubin"
    slow.write_bytes(kernels["replay_kernels_slow"])  # axpy, the same answer, far slower
    out = tmp_path / "small.kreplay"
    # 20,000 iterations measured 2.3x alone on an H200 but 1.4x beside the GPU suite's other work;
    # 200,000 make each axpy ~10x as long, so 1.5 holds with the GPU shared
    res = tool("reduce_replay", str(path), "-o", str(out), "--slower=1.5", f"--executable-substitution={exe}={slow}")
    assert res.returncode == 0, res.stderr[-3000:]
    assert device_work(out) == ["axpy"], res.stdout
