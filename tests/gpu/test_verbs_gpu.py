"""The verbs on a real GPU: the recorder's self-check (the verify verb in a child process, its
typed result read back) and run-replay --verify give the same verdict on the same file, for a
capture that verifies, one whose checkpoint disagrees with what its kernel computes, and one with
nothing to compare; and the verify verb called from Python agrees with both."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_replay_gpu import AXPY, F32, Capture, f32, i32, ints

from replayfmt.capture.self_check import Outcome, replay_check
from replayfmt.format import model as m
from replayfmt.verbs import VerifyOptions, verify

pytestmark = pytest.mark.gpu
N = 1 << 16


def axpy_capture(path: Path, kernels, *, expected_off_by: float | None) -> Path:
    """y = 3 x + y, checkpointed as computed (plus ``expected_off_by``); None: no checkpoint."""
    x, y = ints(N, 21), ints(N, 22)
    c = Capture(path, kernels["replay_kernels"])
    bx, by = (c.buffer(4 * N, dtype=F32, shape=(N,)) for _ in range(2))
    c.w.copy_h2d(dst_buffer=bx, data=x)
    c.w.copy_h2d(dst_buffer=by, data=y)
    params = f32(3) + bytes(4) + bytes(16) + i32(N) + bytes(4)
    c.launch(AXPY, (N // 256, 1, 1), (256, 1, 1), params, [m.Relocation(0, bx, 8, 0), m.Relocation(0, by, 16, 0)])
    if expected_off_by is not None:
        c.w.checkpoint({by: (3 * x + y + np.float32(expected_off_by)).astype(np.float32)})
    return c.close()


@pytest.mark.parametrize(
    ("off_by", "outcome", "code"),
    [(0.0, "verified", 0), (1.0, "mismatch", 1), (None, "nothing to verify", 1)],
    ids=["verifies", "wrong-checkpoint", "nothing-to-compare"],
)
def test_the_self_check_and_run_replay_verify_agree(tmp_path, kernels, off_by, outcome, code):
    path = axpy_capture(tmp_path / "c.kreplay", kernels, expected_off_by=off_by)
    cli = subprocess.run(
        [sys.executable, "-m", "replayfmt_tools.run_replay", "--verify", "--format=json", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    check = replay_check(path, fixed_addresses=False, timeout_s=300)
    direct = verify(path, VerifyOptions())
    assert cli.returncode == code == direct.exit_code, cli.stderr[-3000:]
    assert check.outcome.value == direct.outcome.value == outcome, check.detail
    said = json.loads(cli.stdout)["verification"]
    assert (said is not None and said["verified"]) == (check.outcome is Outcome.VERIFIED)
    if outcome == "verified":
        assert check.ranges == direct.compared == said["compared"] > 0
