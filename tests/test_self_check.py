"""The recorder's self-check: the verify verb in a child process, its typed result read back (one
JSON object, never the tool's text), the child within its time bound, a child that dies, and what
is not replayed (too large, no device memory to spare). No GPU: the children here are stand-ins
writing what the verify verb's child writes; tests/test_verbs_verify.py runs the real one."""

from __future__ import annotations

import json
import pickle
import sys

import pytest

from replayfmt.capture import self_check
from replayfmt.capture.self_check import Outcome, ReplayCheck, check_of, replay_check, replay_command, skip_reason
from replayfmt.replay.verify_types import Outcome as Verified, VerifyOptions, VerifyResult


@pytest.mark.parametrize(
    ("result", "outcome", "ranges", "detail"),
    [
        (VerifyResult("c", Verified.VERIFIED, compared=3), Outcome.VERIFIED, 3, ""),
        (VerifyResult("c", Verified.MISMATCH, "1 of 3 compared range(s) failed"), Outcome.MISMATCH, 0, "1 of 3"),
        (VerifyResult("c", Verified.FAILED, "operation 33 (sync): ILLEGAL"), Outcome.FAILED, 0, "operation 33"),
        (VerifyResult("c", Verified.NOTHING_TO_VERIFY, "nothing was proven"), Outcome.NOTHING_TO_VERIFY, 0, "nothing"),
        # another process gets no device (exclusive compute mode, say): nothing learnt of the capture
        (VerifyResult("c", Verified.UNAVAILABLE, "no CUDA device"), Outcome.SKIPPED, 0, "could not replay here: no"),
    ],
)
def test_the_verify_verbs_outcome_is_the_self_checks(result, outcome, ranges, detail):
    check = check_of(result)
    assert (check.outcome, check.ranges) == (outcome, ranges) and check.detail.startswith(detail)


def test_the_verdict_lines():
    assert check_of(VerifyResult("c", Verified.VERIFIED, compared=3)).describe() == "replayed and verified: 3 ranges"
    assert check_of(VerifyResult("c", Verified.FAILED, "boom")).describe() == "the replay failed: boom"


def test_the_child_is_the_verify_verb_with_this_interpreter(tmp_path):
    command = replay_command(tmp_path / "c.kreplay", tmp_path / "o.pickle", tmp_path / "r.json")
    assert command == [
        sys.executable,
        "-m",
        "replayfmt.verbs",
        "verify",
        str(tmp_path / "o.pickle"),
        str(tmp_path / "c.kreplay"),
        str(tmp_path / "r.json"),
    ]


def test_the_child_gets_run_replay_verifys_default_options():
    assert self_check.verify_options(fixed_addresses=False) == VerifyOptions()
    assert self_check.verify_options(fixed_addresses=True).plan.fixed_addresses


def stand_in(monkeypatch, code: str) -> None:
    """The child: ``code`` run with the options' and the result's paths as sys.argv[1:]."""
    monkeypatch.setattr(
        self_check, "replay_command", lambda path, options, result: [sys.executable, "-c", code, options, result]
    )


def test_a_child_that_verifies(tmp_path, monkeypatch):
    written = VerifyResult(str(tmp_path / "c.kreplay"), Verified.VERIFIED, compared=3).to_dict()
    code = (
        "import json, pickle, sys\n"
        "options = pickle.load(open(sys.argv[1], 'rb'))\n"
        "assert options.plan.fixed_addresses\n"
        f"json.dump({written!r}, open(sys.argv[2], 'w'))\n"
    )
    stand_in(monkeypatch, code)
    check = replay_check(tmp_path / "c.kreplay", fixed_addresses=True, timeout_s=60)
    assert check.outcome == Outcome.VERIFIED and check.ranges == 3 and check.seconds > 0


def test_a_child_that_dies_before_it_says_fails_the_check_with_its_last_words(tmp_path, monkeypatch):
    stand_in(monkeypatch, "import sys; print('Segmentation fault in the driver', file=sys.stderr); sys.exit(139)")
    check = replay_check(tmp_path / "c.kreplay", fixed_addresses=False, timeout_s=60)
    assert check.outcome == Outcome.FAILED and check.detail == "Segmentation fault in the driver"


def test_a_child_whose_result_is_malformed_fails_the_check(tmp_path, monkeypatch):
    stand_in(monkeypatch, "import sys; open(sys.argv[2], 'w').write('{\"outcome\": \"verified\"}')")
    check = replay_check(tmp_path / "c.kreplay", fixed_addresses=False, timeout_s=60)
    assert check.outcome == Outcome.FAILED and "result is unreadable" in check.detail


def test_a_child_past_its_time_is_stopped_and_the_check_says_so(tmp_path, monkeypatch):
    stand_in(monkeypatch, "import time; time.sleep(600)")
    check = replay_check(tmp_path / "c.kreplay", fixed_addresses=False, timeout_s=1)
    assert check.outcome == Outcome.SKIPPED and "ran past the self-check's 1 s (--self-check-timeout)" in check.detail
    assert check.seconds < 600  # not a speed goal: the check did not wait for the child to end


def test_the_options_go_to_the_child_whole(tmp_path):
    options = self_check.verify_options(fixed_addresses=True)
    assert pickle.loads(pickle.dumps(options)) == options
    result = VerifyResult("c", Verified.MISMATCH, "x", errors=("e",), device_ms=(1.5,), report={"ranges": []})
    again = VerifyResult.from_dict(json.loads(json.dumps(result.to_dict())))
    assert again == result and again.report == {"ranges": []}


def test_what_is_too_large_to_replay_now_is_skipped_with_the_reason(tmp_path):
    path = tmp_path / "c.kreplay"
    path.write_bytes(bytes(4096))
    assert skip_reason(path, device_bytes=1 << 20, free_bytes=2 << 20, max_file_bytes=1 << 30) == ""
    assert "over the self-check's" in skip_reason(path, device_bytes=0, free_bytes=None, max_file_bytes=1024)
    why = skip_reason(path, device_bytes=3 << 30, free_bytes=1 << 30, max_file_bytes=1 << 30)
    assert why.startswith("its buffers need 3.00 GiB of device memory and 1.00 GiB are free")


def test_the_real_child_gives_the_verdict_this_process_gives(tmp_path):
    """``python -m replayfmt.verbs`` itself, across the process boundary (options pickled in, the
    result as JSON out): the self-check's verdict is the one the verify verb gives here (without
    a GPU: could not replay here; with one: verified)."""
    from pathlib import Path

    from replayfmt.errors import ReplayError
    from replayfmt.verbs import verify

    path = Path(__file__).resolve().parents[1] / "examples" / "saxpy.kreplay"
    try:
        direct = verify(path)
    except ReplayError as exc:
        direct = VerifyResult.from_error(path, exc)
    check = replay_check(path, fixed_addresses=False, timeout_s=120)
    assert check.outcome == check_of(direct).outcome and check.detail == check_of(direct).detail


def test_a_capture_whose_checkpoints_prove_nothing_is_not_said_to_hold_none():
    """The recorder said 'checkpoints: N of N bytes typed' and then 'the capture holds no
    checkpoints'; it held them, of bytes the region never changed."""
    detail = "nothing was proven: every one of the 4 compared range(s) held its expected bytes before the region ran"
    line = ReplayCheck(Outcome.NOTHING_TO_VERIFY, detail=detail).describe()
    assert line.startswith("replayed; nothing verified: nothing was proven") and "holds no checkpoints" not in line
    assert "holds no checkpoints" in ReplayCheck(Outcome.NOTHING_TO_VERIFY).describe()  # where it holds none
