"""The recorder's self-check: what run-replay --verify's output earns, the child process within
its time bound, and what is not replayed (too large, no device memory to spare). No GPU: the
child is a stand-in printing what run-replay prints."""

from __future__ import annotations

import sys

import pytest

from replayfmt.capture import self_check
from replayfmt.capture.self_check import Outcome, judge, replay_check, replay_command, skip_reason

VERIFIED = (
    "device        #1 on cuda:0 NVIDIA H100 sm_90\n"
    "op     12 buffer 3: ok 64 float32 compared\n"
    "verified: 3 buffer range(s) match\n"
)
ILLEGAL = "operation 33 (device_synchronize): cuCtxSynchronize failed: CUDA_ERROR_ILLEGAL_ADDRESS"
NOTHING = (
    "repetition 1: 0.1 ms device time\nverify: the capture holds no checkpoints or expected downloads to compare\n"
)
MISMATCH_OUT = "op     12 buffer 3: MISMATCH 64 float32 compared (exact), 3 mismatching, first at index 7\n"


@pytest.mark.parametrize(
    ("code", "stdout", "stderr", "outcome", "ranges", "detail"),
    [
        (0, VERIFIED, "", Outcome.VERIFIED, 3, ""),
        # an operation failed, then verification found nothing or a difference: a failed replay
        (
            1,
            "NOT verified: 3 range(s) compared\n",
            f"run-replay: error: {ILLEGAL}\nrun-replay: error: verification: 1 of 3 compared range(s) failed\n",
            Outcome.FAILED,
            0,
            ILLEGAL,
        ),
        # what run-replay --verify prints today (docs/VERIFY.md): the verdict line, then the problem
        (0, "verified: 21 range(s) compared (21 typed) over 1 replay(s): 21 exact\n", "", Outcome.VERIFIED, 21, ""),
        (
            1,
            "NOT verified: 193 range(s) compared (40 typed) over 4 replay(s): 21 exact, 172 wrong\n",
            "run-replay: error: verification: 172 of 193 compared range(s) failed; first: op 227 buffer 3\n",
            Outcome.MISMATCH,
            0,
            "172 of 193",
        ),
        (
            1,
            "NOT verified: 4 range(s) compared\n",
            "run-replay: error: verification: nothing was proven: every one of the 4 compared range(s) held\n",
            Outcome.NOTHING_TO_VERIFY,
            0,
            "nothing was proven",
        ),
        (0, NOTHING, "", Outcome.NOTHING_TO_VERIFY, 0, ""),
        # nothing to compare exits non-zero where --verify insists on comparing something: still replayed
        (1, NOTHING, "run-replay: error: nothing was verified\n", Outcome.NOTHING_TO_VERIFY, 0, ""),
        (1, MISMATCH_OUT, "run-replay: error: verification failed for 1 buffer range(s)\n", Outcome.MISMATCH, 0, "op"),
        (
            1,
            "",
            f"run-replay: error: {ILLEGAL}\n",
            Outcome.FAILED,
            0,
            ILLEGAL,
        ),
        (1, "", "", Outcome.FAILED, 0, "run-replay exited with status 1"),
        # another process gets no device (exclusive compute mode, say): nothing learnt of the capture
        (2, "", "run-replay: error: no CUDA device\n", Outcome.SKIPPED, 0, "run-replay could not run here: no CUDA"),
    ],
)
def test_what_run_replay_says_earns_the_verdict(code, stdout, stderr, outcome, ranges, detail):
    check = judge(code, stdout, stderr)
    assert (check.outcome, check.ranges) == (outcome, ranges) and check.detail.startswith(detail)


def test_the_verdict_lines():
    assert judge(0, VERIFIED, "").describe() == "replayed and verified: 3 ranges"
    assert judge(1, "", "x: error: boom\n").describe() == "the replay failed: boom"


def test_a_capture_whose_checkpoints_prove_nothing_is_not_said_to_hold_none():
    """Issue 44: the recorder said 'checkpoints: N of N bytes typed' and then 'the capture holds no
    checkpoints'; it held them, of bytes the region never changed."""
    proven_nothing = (
        "run-replay: error: verification: nothing was proven: every one of the 4 compared range(s) held its "
        "expected bytes before the region ran, and no replay showed the region writing them\n"
    )
    line = judge(1, "NOT verified: 4 range(s) compared\n", proven_nothing).describe()
    assert line.startswith("replayed; nothing verified: nothing was proven: every one of the 4 compared range(s)")
    assert "holds no checkpoints" not in line
    assert "holds no checkpoints" in judge(0, NOTHING, "").describe()  # where it holds none, it says so


def test_the_child_is_run_replay_verify_with_this_interpreter(tmp_path):
    assert replay_command(tmp_path / "c.kreplay", fixed_addresses=True) == [
        sys.executable,
        "-m",
        "replayfmt_tools.run_replay",
        "--verify",
        "--fixed-addresses",
        str(tmp_path / "c.kreplay"),
    ]


def stand_in(monkeypatch, code: str) -> None:
    monkeypatch.setattr(self_check, "replay_command", lambda path, fixed_addresses: [sys.executable, "-c", code])


def test_a_child_that_verifies(tmp_path, monkeypatch):
    stand_in(monkeypatch, f"print({VERIFIED!r})")
    check = replay_check(tmp_path / "c.kreplay", fixed_addresses=False, timeout_s=60)
    assert check.outcome == Outcome.VERIFIED and check.ranges == 3 and check.seconds > 0


def test_a_child_past_its_time_is_stopped_and_the_check_says_so(tmp_path, monkeypatch):
    stand_in(monkeypatch, "import time; time.sleep(600)")
    check = replay_check(tmp_path / "c.kreplay", fixed_addresses=False, timeout_s=1)
    assert check.outcome == Outcome.SKIPPED and "ran past the self-check's 1 s (--self-check-timeout)" in check.detail
    assert check.seconds < 600  # not a speed goal: the check did not wait for the child to end


def test_what_is_too_large_to_replay_now_is_skipped_with_the_reason(tmp_path):
    path = tmp_path / "c.kreplay"
    path.write_bytes(bytes(4096))
    assert skip_reason(path, device_bytes=1 << 20, free_bytes=2 << 20, max_file_bytes=1 << 30) == ""
    assert "over the self-check's" in skip_reason(path, device_bytes=0, free_bytes=None, max_file_bytes=1024)
    why = skip_reason(path, device_bytes=3 << 30, free_bytes=1 << 30, max_file_bytes=1 << 30)
    assert why.startswith("its buffers need 3.00 GiB of device memory and 1.00 GiB are free")
