"""The verify verb on the CPU: real captures (the CaptureWriter's), the real plan and the real
Verification, played by the host-memory replayer whose "kernels" are numpy programs; and the
recorder's self-check against run-replay --verify on the same file: the same verdict, since both
call the same function with the same options (the child process's entry point run in this one)."""

from __future__ import annotations

import json
import subprocess
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner
from fake_replayer import HostReplayer
from test_verification import inputs, program, row_sums, write_capture

import replayfmt
from replayfmt.capture import self_check
from replayfmt.errors import ReplayFormatError
from replayfmt.execute import ReplaySession
from replayfmt.format import model as m
from replayfmt.replay.plan_options import LaunchOverride, PlanOptions
from replayfmt.verbs import Outcome, VerifyOptions, VerifyResult, verify
from replayfmt.verbs.__main__ import main as child_main
from replayfmt_tools.run_replay import main as run_replay


class Replayer(HostReplayer):
    """The host replayer as a session starts it (no devices, nothing staged)."""

    gpus = ()
    staging = SimpleNamespace(bytes=0)
    started: list[Replayer] = []

    def close(self) -> None:
        pass


@pytest.fixture
def playing(monkeypatch):
    """Sessions start the host replayer running the program the test sets."""
    chosen = {}

    def start(session: ReplaySession, options=None):
        session._replayer = Replayer(session.plan, chosen["program"])
        Replayer.started.append(session._replayer)
        return session._replayer

    monkeypatch.setattr(ReplaySession, "start", start)
    return chosen


@pytest.fixture
def capture(tmp_path):
    x = inputs()
    return write_capture(tmp_path / "c.kreplay", out_start=np.zeros(64, np.float32), out_expected=row_sums(x, None))


def test_a_correct_program_is_verified(capture, playing):
    playing["program"] = program()
    lines: list[str] = []
    result = verify(capture, VerifyOptions(), progress=lines.append)
    assert result.outcome is Outcome.VERIFIED and result.verified and result.exit_code == 0
    assert result.compared == 2 and result.summary.startswith("verified: 2 range(s) compared")
    assert result.detail == "" and result.report is not None and result.report["verified"]
    assert any(line.startswith("repetition 1:") for line in lines)


def test_a_planted_bug_is_a_mismatch_naming_the_range(capture, playing):
    playing["program"] = program(bug="wrong constant")
    result = verify(capture)
    assert result.outcome is Outcome.MISMATCH and result.exit_code == 1
    assert result.detail.startswith("1 of 2 compared range(s) failed; first: op") and "out" in result.detail


def test_nothing_compared_is_not_verified(tmp_path, playing):
    path = tmp_path / "c.kreplay"
    with replayfmt.CaptureWriter(path) as w:
        dev = w.add_object(m.Device(name="NVIDIA H100", compute_capability=(9, 0)))
        buffer = w.add_object(m.Buffer(size=16, device=dev))
        w.memset(buffer=buffer, value=0, count=16)
    playing["program"] = program()
    result = verify(path)
    assert result.outcome is Outcome.NOTHING_TO_VERIFY and result.exit_code == 1
    assert result.detail.startswith("nothing was compared")
    replayed = verify(path, VerifyOptions(verify=False))  # run-replay without --verify: replayed is all it asks
    assert replayed.outcome is Outcome.REPLAYED and replayed.exit_code == 0 and replayed.report is None


def test_a_dry_run_plans_without_a_device(capture):
    result = verify(capture, VerifyOptions(dry_run=True))
    assert result.outcome is Outcome.PLANNED and result.exit_code == 0 and result.device_ms == ()


def test_a_plan_with_problems_runs_nothing(capture, playing):
    playing["program"] = program()
    bad = VerifyOptions(plan=PlanOptions(launch_overrides=(LaunchOverride(999, skip=True),), continue_on_error=True))
    Replayer.started.clear()
    result = verify(capture, bad)
    assert result.outcome is Outcome.FAILED and result.problems and not Replayer.started


def test_options_are_checked_where_they_are_made():
    with pytest.raises(replayfmt.ReplayError, match="must be >= 1"):
        VerifyOptions(replays=0)
    with pytest.raises(replayfmt.ReplayError, match="none twice"):
        VerifyOptions(devices=(0, 0))


def test_a_malformed_result_is_a_format_error_naming_the_field():
    data = VerifyResult("c", Outcome.VERIFIED, compared=1).to_dict()
    del data["compared"]
    with pytest.raises(ReplayFormatError, match="compared"):
        VerifyResult.from_dict(data)


def run_in_this_process(command, **_kwargs):
    """subprocess.run for the self-check's child: its entry point, called here (so the host
    replayer the test set up plays it)."""
    assert command[1:4] == ["-m", "replayfmt.verbs", "verify"]
    code = child_main(command[3:])
    return subprocess.CompletedProcess(command, code, "", "")


@pytest.mark.parametrize(
    "run",
    [program(), program(bug="off-by-one"), program(skip_out=True), program(nondeterministic=True)],
    ids=["correct", "off-by-one", "skipped-output", "nondeterministic"],
)
def test_the_self_check_and_run_replay_verify_agree_on_the_same_file(capture, playing, monkeypatch, run):
    playing["program"] = run
    cli = CliRunner().invoke(run_replay, ["--verify", "--format=json", str(capture)])
    said = json.loads(cli.stdout)
    monkeypatch.setattr(self_check, "subprocess", SimpleNamespace(**{**vars(subprocess), "run": run_in_this_process}))
    check = self_check.replay_check(capture, fixed_addresses=False, timeout_s=60)
    direct = verify(capture)
    assert cli.exit_code == direct.exit_code
    assert said["verification"]["verified"] == direct.verified == (check.outcome is self_check.Outcome.VERIFIED)
    assert check.outcome.value == direct.outcome.value
    assert check.ranges == (direct.compared if direct.verified else 0)


@pytest.mark.parametrize(
    ("run", "verdict"),
    [(program(), "verified"), (program(bug="dropped term"), "mismatch")],
    ids=["correct", "dropped-term"],
)
def test_a_corpus_row_is_the_verify_verbs_verdict(capture, playing, run, verdict):
    from replayfmt.verbs.corpus_runs import verify_row

    playing["program"] = run
    row = verify_row(str(capture), {"repetitions": 2}).value
    assert row["verdict"] == verdict and row["capture"] == "c.kreplay" and row["operations"] > 0
    assert row["ranges"] == verify(capture).compared == 2
    assert row["device_ms"] == 0.0  # the median of the timed runs (the host replayer's clock reads 0)
    planned = verify_row(str(capture), {"dry_run": True}).value
    assert planned["verdict"] == "planned" and planned["ranges"] == 0 and planned["device_ms"] is None


def test_docs_verbs_md_names_each_verb_with_its_parameters():
    import inspect
    import re
    from pathlib import Path

    import replayfmt.verbs as verbs

    text = (Path(__file__).resolve().parents[1] / "docs" / "VERBS.md").read_text()
    documented = dict(re.findall(r"\| `(\w+)\(([^`]*)\)` \|", text))
    functions = {n for n in verbs.__all__ if inspect.isfunction(getattr(verbs, n))}
    assert set(documented) == functions
    for name, params in documented.items():
        said = [p.split("=")[0].strip() for p in params.split(",") if p.strip() not in ("*", "")]
        real = [p for p in inspect.signature(getattr(verbs, name)).parameters if p != "snapshot"]
        assert said == real, name


def test_run_replays_json_carries_the_outcome(capture, playing):
    playing["program"] = program(bug="off-by-one")
    cli = CliRunner().invoke(run_replay, ["--verify", "--format=json", str(capture)])
    said = json.loads(cli.stdout)
    assert cli.exit_code == 1 and said["outcome"] == "mismatch" and said["detail"].startswith("1 of 2 compared")


def test_reduce_workers_as_captured_check_is_the_verify_verbs_verdict(capture, playing):
    """reduce-replay's inputs phase asks a candidate to verify as captured: the worker's answer
    is run-replay --verify's verdict (failing: not verified)."""
    from replayfmt.edit.reduce_tests import AsCaptured
    from replayfmt.verbs.reduce_worker import answer

    playing["program"] = program()
    verified = answer(AsCaptured(), str(capture))
    assert not verified.failing and verified.detail.startswith("verified:")
    playing["program"] = program(bug="wrong constant")
    wrong = answer(AsCaptured(), str(capture))
    assert wrong.failing and wrong.detail.startswith("1 of 2 compared range(s) failed")
