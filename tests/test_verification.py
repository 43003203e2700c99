"""Verification over several replays, with evidence: real captures (written by the CaptureWriter,
planned by the real plan) played by a host-memory replayer whose "kernels" are numpy programs:
deterministic, nondeterministic (float sums in a different order each run, as atomics give),
skipped, neutered, planted bugs, and captures taken after a warm-up."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from fake_replayer import HostReplayer

import replayfmt
from replayfmt.format import model as m
from replayfmt.replay.evidence import Evidence
from replayfmt.replay.judge import ValueVerdict
from replayfmt.replay.plan import PlanOptions, build_plan
from replayfmt.replay.plan_options import LaunchOverride
from replayfmt.replay.verification import EvidencePolicy, Verification
from replayfmt.verbs import verifying

ROWS, COLS = 64, 256
X_ID, OUT_ID, Y_ID = 2, 3, 4  # buffer ids as the writer hands them out (the device is 1)


def inputs() -> np.ndarray:
    rng = np.random.default_rng(7)
    return (rng.standard_normal((ROWS, COLS)) * 3).astype(np.float32)


def row_sums(x: np.ndarray, order: int | None) -> np.ndarray:
    """Each row's sum in float32, term by term in a shuffled order (as atomics accumulate), or in
    column order when ``order`` is None."""
    columns = np.arange(x.shape[1]) if order is None else np.random.default_rng(order).permutation(x.shape[1])
    return np.cumsum(x[:, columns], axis=1, dtype=np.float32)[:, -1].copy()


def write_capture(
    path: Path,
    *,
    out_start: np.ndarray,
    out_expected: np.ndarray,
    second: np.ndarray | None = None,
    typed: bool = True,
    x_dtype: m.DType = m.DType.FLOAT32,
) -> Path:
    """A step reading X and writing OUT (and Y when ``second`` is given: a second kernel's output
    that starts as it ends); each starts as ``*_start`` and is checkpointed as expected."""
    x = inputs()
    with replayfmt.CaptureWriter(path) as w:
        dev = w.add_object(m.Device(name="NVIDIA H100", compute_capability=(9, 0)))
        assert w.add_object(m.Buffer(size=x.nbytes, device=dev, label="x")) == X_ID
        assert w.add_object(m.Buffer(size=out_expected.nbytes, device=dev, label="out")) == OUT_ID
        if second is not None:
            assert w.add_object(m.Buffer(size=second.nbytes, device=dev, label="y")) == Y_ID
        with w.scope("step"):
            w.state(buffer=X_ID, data=x)
            w.state(buffer=OUT_ID, data=out_start)
            if second is not None:
                w.state(buffer=Y_ID, data=second)
            expected = {X_ID: x, OUT_ID: out_expected} | ({Y_ID: second} if second is not None else {})
            entries = [m.CheckpointEntry(b, w.add_payload(d), 0, d.nbytes) for b, d in expected.items()]
            types = [
                m.TypedTensor(b, 0, d.nbytes, x_dtype if b == X_ID else m.DType.FLOAT32, d.shape, (), name)
                for (b, d), name in zip(expected.items(), ("x", "out", "y"), strict=False)
            ]
            w.checkpoint(entries, name="step", types=types if typed else ())
    return path


def f32(memory: dict[int, bytearray], buffer: int) -> np.ndarray:
    return np.frombuffer(memory[buffer], np.float32)


def program(*, nondeterministic: bool = False, bug: str = "", skip_out: bool = False, y: bool = False):
    """The step's kernels: OUT = each row's sum of X (Y = 2 X[:, 0] when ``y``), with a planted bug."""

    def run(memory: dict[int, bytearray], _checkpoint: int, number: int) -> None:
        x = f32(memory, X_ID).reshape(ROWS, COLS)
        if bug == "off-by-one":
            x = np.roll(x, 1, axis=0)
        elif bug == "dropped term":
            x = x[:, :-1]
        out = row_sums(x, number if nondeterministic else None)
        if bug == "wrong constant":
            out = out * np.float32(1.001)
        if not skip_out:
            memory[OUT_ID][:] = out.tobytes()
        if y:
            memory[Y_ID][:] = (2 * x[:, 0]).astype(np.float32).tobytes()

    return run


def verify(path: Path, run, *, replays: int = 4, evidence: EvidencePolicy = EvidencePolicy.AUTO):
    with replayfmt.open(path) as cap:
        plan = build_plan(cap, PlanOptions())
        replayer = HostReplayer(plan, run)
        v = Verification(plan, replays=replays, evidence=evidence)
        v.attach(replayer)
        v.note_runs(replayer.run(1))
        assert v.finish(replayer) == []
        return v.report(), replayer


def by_label(report) -> dict[str, object]:
    return {r.piece.label: r for r in report.ranges}


def test_a_deterministic_program_verifies_exactly_in_one_replay(tmp_path):
    x = inputs()
    path = write_capture(tmp_path / "c.kreplay", out_start=np.zeros(ROWS, np.float32), out_expected=row_sums(x, None))
    report, replayer = verify(path, program())
    assert report.verified and replayer.runs == 1 and report.replays == 1
    assert {r.judgement.verdict for r in report.ranges} == {ValueVerdict.EXACT}
    ranges = by_label(report)
    assert ranges["out"].evidence is Evidence.COMPARED and ranges["out"].piece.dtype == m.DType.FLOAT32
    # x started as expected, but out changed and matched: no poisoned replay unless asked (1.2x budget)
    assert ranges["x"].evidence is Evidence.UNPROVEN and "--evidence=always" in ranges["x"].note
    assert replayer.poisoned_runs == 0
    assert report.summary().startswith("verified: 2 range(s) compared (2 typed) over 1 replay(s)")


def test_the_input_that_starts_as_expected_is_unchanged_by_the_region(tmp_path):
    x = inputs()
    path = write_capture(tmp_path / "c.kreplay", out_start=np.zeros(ROWS, np.float32), out_expected=row_sums(x, None))
    report, replayer = verify(path, program(), evidence=EvidencePolicy.ALWAYS)
    assert by_label(report)["x"].evidence is Evidence.UNCHANGED and report.verified
    assert replayer.poisoned_runs == 1 and report.poisoned_replays == 1


def test_a_nondeterministic_program_verifies_within_run_to_run_variation(tmp_path):
    x = inputs()
    captured = row_sums(x, 1000)
    assert not np.array_equal(captured, row_sums(x, 1))  # the sums really vary run to run
    path = write_capture(tmp_path / "c.kreplay", out_start=np.zeros(ROWS, np.float32), out_expected=captured)
    report, replayer = verify(path, program(nondeterministic=True))
    out = by_label(report)["out"]
    assert report.verified and report.nondeterministic, report.lines()
    assert out.judgement.verdict is ValueVerdict.VARIES and out.judgement.wrong == 0 and replayer.runs >= 4
    assert 0 < out.judgement.largest_ulp_diff < 1000 and out.judgement.spread_abs > 0
    assert "within run-to-run variation (largest difference" in out.line()


@pytest.mark.parametrize("bug", ["off-by-one", "dropped term", "wrong constant"])
def test_a_planted_bug_fails_on_a_nondeterministic_program_naming_the_element(tmp_path, bug):
    x = inputs()
    path = write_capture(tmp_path / "c.kreplay", out_start=np.zeros(ROWS, np.float32), out_expected=row_sums(x, 1000))
    report, _ = verify(path, program(nondeterministic=True, bug=bug))
    out = by_label(report)["out"]
    assert not report.verified and out.judgement.verdict is ValueVerdict.WRONG
    first = out.judgement.shown[0]
    assert first.wrong and first.abs_diff > out.judgement.spread_abs and first.ulp_diff > 4
    assert not (first.replay_min <= first.captured <= first.replay_max)
    assert report.problem().startswith("1 of 2 compared range(s) failed; first: op ")
    text = "\n".join(report.lines())
    assert "captured" in text and "<- wrong" in text and f"{first.index:>12}" in text


def test_a_capture_after_a_warm_up_is_proven_by_a_poisoned_replay(tmp_path):
    x = inputs()
    answer = row_sums(x, None)
    path = write_capture(tmp_path / "c.kreplay", out_start=answer, out_expected=answer)  # the warm-up left it
    report, replayer = verify(path, program())
    ranges = by_label(report)
    assert ranges["out"].evidence is Evidence.PROVEN and report.verified
    assert report.poisoned_replays >= 1 and replayer.poisoned_runs == report.poisoned_replays


def test_a_skipped_kernel_fails_a_capture_after_a_warm_up(tmp_path):
    x = inputs()
    answer = row_sums(x, None)
    path = write_capture(tmp_path / "c.kreplay", out_start=answer, out_expected=answer)
    report, _ = verify(path, program(skip_out=True))
    assert {r.evidence for r in report.ranges} == {Evidence.UNCHANGED}
    assert not report.verified and report.problem().startswith("nothing was proven")


def test_a_skipped_kernel_among_others_fails_against_the_reference_replay(tmp_path):
    """OUT is written (changed); Y started as expected and its kernel is skipped: without a
    reference Y looks unchanged by the region; the unmodified capture's poisoned replay says its
    kernels write Y, so the skip fails."""
    x = inputs()
    y = (2 * x[:, 0]).astype(np.float32)
    path = write_capture(
        tmp_path / "c.kreplay", out_start=np.zeros(ROWS, np.float32), out_expected=row_sums(x, None), second=y
    )
    report, _ = verify(path, program(), evidence=EvidencePolicy.ALWAYS)
    assert by_label(report)["y"].evidence is Evidence.UNCHANGED and report.verified  # no reference: not seen
    with replayfmt.open(path) as cap:
        plan = build_plan(cap, PlanOptions())
        plan.options = PlanOptions(launch_overrides=(LaunchOverride(0, skip=True),))  # kernels were changed
        v = Verification(plan)
        replayer = HostReplayer(plan, program())  # the kernel writing Y does not run
        v.attach(replayer)
        v.note_runs(replayer.run(1))
        v.finish(replayer)
        assert v.wants_reference
        v.apply_reference(v.reference_written(HostReplayer(plan, program(y=True))))
        report = v.report()
    y_range = by_label(report)["y"]
    assert y_range.evidence is Evidence.LEFT and not y_range.passed and not report.verified
    assert "the captured kernels write were not written by this replay" in y_range.line()


def test_an_output_computed_from_a_poisoned_input_is_proven_in_a_second_round(tmp_path):
    """X and OUT both start as expected (a warm-up): poisoning both makes OUT wrong in round 1
    (computed from poisoned X); round 2 poisons OUT alone and proves it."""
    x = inputs()
    answer = row_sums(x, None)
    path = write_capture(tmp_path / "c.kreplay", out_start=answer, out_expected=answer)
    report, _ = verify(path, program())
    assert by_label(report)["out"].evidence is Evidence.PROVEN
    assert report.poisoned_replays == 2


def test_a_range_the_region_reads_before_writing_could_not_be_proven(tmp_path):
    x = inputs()
    answer = row_sums(x, None)
    path = write_capture(tmp_path / "c.kreplay", out_start=answer, out_expected=answer)

    def in_place(memory, _checkpoint, _number):  # a running average: reads out, writes it back
        fresh = row_sums(f32(memory, X_ID).reshape(ROWS, COLS), None)
        memory[OUT_ID][:] = (f32(memory, OUT_ID) * np.float32(0.5) + fresh * np.float32(0.5)).tobytes()

    report, _ = verify(path, in_place)
    out = by_label(report)["out"]
    assert out.evidence is Evidence.UNPROVEN and "reads it before writing it" in out.line()
    assert out.passed and not report.verified  # nothing else proves anything


def test_nothing_compared_is_never_verified(tmp_path):
    path = tmp_path / "empty.kreplay"
    with replayfmt.CaptureWriter(path) as w:
        dev = w.add_object(m.Device(name="NVIDIA H100", compute_capability=(9, 0)))
        w.add_object(m.Buffer(size=64, device=dev))
    report, _ = verify(path, lambda *a: None)
    assert report.compared == 0 and not report.verified
    assert report.problem() == "nothing was compared: the capture holds no checkpoints or expected downloads"


def test_untyped_ranges_are_judged_as_bytes_and_reported_so(tmp_path):
    x = inputs()
    path = write_capture(
        tmp_path / "c.kreplay", out_start=np.zeros(ROWS, np.float32), out_expected=row_sums(x, 1000), typed=False
    )
    report, _ = verify(path, program(nondeterministic=True))
    out = by_label(report)["out"]
    assert not out.piece.typed and out.judgement.dtype == "bytes" and "untyped bytes" in out.line()
    assert out.as_dict()["dtype"] is None and out.as_dict()["typed_by"] is None


def test_the_report_is_json_for_scripts(tmp_path):
    x = inputs()
    path = write_capture(tmp_path / "c.kreplay", out_start=np.zeros(ROWS, np.float32), out_expected=row_sums(x, 1000))
    report, _ = verify(path, program(nondeterministic=True, bug="off-by-one"))
    data = json.loads(json.dumps(report.as_dict()))
    (bad,) = [r for r in data["ranges"] if not r["passed"]]
    assert data["verified"] is False and data["compared"] == 2 and bad["dtype"] == "float32"
    assert bad["verdict"] == "wrong" and bad["shape"] == [ROWS] and bad["name"] == "out"
    first = bad["first"][0]
    assert set(first) == {"index", "position", "captured", "replay_min", "replay_max", "abs_diff", "ulp_diff", "wrong"}


def test_one_replay_judges_the_first_alone(tmp_path):
    x = inputs()
    path = write_capture(tmp_path / "c.kreplay", out_start=np.zeros(ROWS, np.float32), out_expected=row_sums(x, 1000))
    report, _ = verify(path, program(nondeterministic=True), replays=1)
    assert report.replays == 1 and not report.nondeterministic and not report.verified  # exact, and it is not


# -- the command line and the format ---------------------------------------------------------------


def run_cli(*args: str):
    from click.testing import CliRunner

    from replayfmt_tools.run_replay import main

    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--nondeterminism-runs", "3"], "--nondeterminism-runs"),
        (["--evidence", "always"], "--evidence"),
        (["--nondeterminism-runs", "2", "--evidence", "never"], "--nondeterminism-runs and --evidence"),
    ],
)
def test_verification_flags_without_verify_are_usage_errors(tmp_path, flags, named):
    x = inputs()
    path = write_capture(tmp_path / "c.kreplay", out_start=np.zeros(ROWS, np.float32), out_expected=row_sums(x, None))
    code, _, err = run_cli(*flags, "--dry-run", str(path))
    assert code == 2 and err.strip() == f"run-replay: error: {named} only mean something with --verify; add --verify"


def test_launch_skip_is_parsed_and_planned(tmp_path):
    assert LaunchOverride.parse("12:skip") == LaunchOverride(12, skip=True)
    from replayfmt.errors import ReplayUsageError

    with pytest.raises(ReplayUsageError, match="unknown setting 'skip'"):
        LaunchOverride.parse("12:grid=1,skip")


def test_a_skipped_launch_is_said_in_the_plan_and_left_out_of_the_steps(tmp_path):
    from samples import write_sample

    write_sample(tmp_path / "s.kreplay", n=64)
    with replayfmt.open(tmp_path / "s.kreplay") as cap:
        launch = next(op for op in cap if op.kind == m.OperationKind.LAUNCH)
        plan = build_plan(
            cap, PlanOptions(launch_overrides=(LaunchOverride(launch.index, skip=True),), continue_on_error=True)
        )
        assert (
            f"override      operation {launch.index}: skipped (not run; its results are left as they start)"
            in plan.describe()
        )
        assert plan.overrides[launch.index].skip  # the steps builder passes over it (a GPU test replays it)


def test_format_1_2_files_still_open_with_untyped_checkpoints():
    golden = Path(__file__).parent / "golden" / "sample-1.2.kreplay"
    with replayfmt.open(golden) as cap:
        assert (cap.header.major, cap.header.minor) == (1, 2)
        (checkpoint,) = [op for op in cap if isinstance(op, m.Checkpoint)]
        assert checkpoint.types == () and len(checkpoint.entries) == 1
        plan = build_plan(cap, PlanOptions(continue_on_error=True))
        assert checkpoint.index in plan.checkpoint_regions  # where its region begins, for poisoning


def test_typed_tensors_round_trip_and_show_in_jsonl(tmp_path):
    from click.testing import CliRunner

    from replayfmt_tools.dump_replay import main as dump_main

    x = inputs()
    path = write_capture(tmp_path / "c.kreplay", out_start=np.zeros(ROWS, np.float32), out_expected=row_sums(x, None))
    with replayfmt.open(path) as cap:
        assert (cap.header.major, cap.header.minor) == (1, replayfmt.FORMAT_MINOR)
        (checkpoint,) = [op for op in cap if isinstance(op, m.Checkpoint)]
        assert checkpoint.types[1] == m.TypedTensor(OUT_ID, 0, ROWS * 4, m.DType.FLOAT32, (ROWS,), (), "out")
    out = CliRunner().invoke(dump_main, ["--format=jsonl", "--kind=checkpoint", str(path)]).stdout
    row = json.loads(out.splitlines()[-1])
    assert row["types"][1] == {
        "buffer": OUT_ID,
        "offset": 0,
        "size": ROWS * 4,
        "dtype": "float32",
        "shape": [ROWS],
        "strides": [],
        "name": "out",
    }


def test_malformed_typed_tensors_are_refused_by_the_writer_and_the_plan(tmp_path, monkeypatch):
    from replayfmt.errors import ReplayFormatError, ReplayUsageError

    outside = m.TypedTensor(2, 32, 64, m.DType.FLOAT32)

    def write(path: Path) -> Path:
        with replayfmt.CaptureWriter(path) as w:
            dev = w.add_object(m.Device(name="NVIDIA H100", compute_capability=(9, 0)))
            b = w.add_object(m.Buffer(size=64, device=dev))
            w.checkpoint({b: bytes(64)}, name="c", types=(outside,))
        return path

    with pytest.raises(
        ReplayUsageError, match=r"checkpoint 'c': typed tensor 0 \(buffer 2, bytes 32\+64\) lies outside"
    ):
        write(tmp_path / "a.kreplay")
    monkeypatch.setattr(m, "checked_checkpoint", lambda name, entries, types: (entries, types))  # a hostile writer
    with (
        replayfmt.open(write(tmp_path / "b.kreplay")) as cap,
        pytest.raises(ReplayFormatError, match="lies outside every entry"),
    ):
        build_plan(cap, PlanOptions())
    overlapping = (m.TypedTensor(2, 0, 32, m.DType.FLOAT32), m.TypedTensor(2, 16, 16, m.DType.INT32))
    assert "overlaps another" in m.typed_tensor_problem((m.CheckpointEntry(2, 1, 0, 64),), overlapping)


def test_run_result_is_not_verified_when_nothing_was_compared():
    from replayfmt.errors import VerificationError
    from replayfmt.replay.options import RunResult

    empty = RunResult(device_ms=[1.0], state_ms=[0.0])
    assert empty.verified is False
    with pytest.raises(VerificationError, match="verification compared nothing"):
        empty.require_verified()


class HostSession:
    """Stands for run-replay's ReplaySession: the real capture and plan, the host replayer."""

    def __init__(self, path: Path, options: PlanOptions, run) -> None:
        self.capture = replayfmt.open(path)
        self.plan = build_plan(self.capture, options)
        self.program = run

    def start(self, _options):
        replayer = HostReplayer(self.plan, self.program)
        replayer.gpus, replayer.staging = [], type("Staging", (), {"bytes": 0})()
        return replayer

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.capture.close()


def run_replay_on_host(monkeypatch, path: Path, programs: list, *flags: str):
    """run-replay itself, its replays played by the host replayer (a program per session opened)."""
    from click.testing import CliRunner

    from replayfmt_tools import run_replay

    sessions = iter(programs)
    monkeypatch.setattr(verifying, "open_replay", lambda p, options, **_: HostSession(Path(p), options, next(sessions)))
    result = CliRunner().invoke(run_replay.main, ["--verify", *flags, str(path)])
    return result.exit_code, result.stdout, result.stderr


def test_run_replay_prints_json_and_fails_on_a_planted_bug(tmp_path, monkeypatch):
    x = inputs()
    path = write_capture(tmp_path / "c.kreplay", out_start=np.zeros(ROWS, np.float32), out_expected=row_sums(x, 1000))
    code, out, err = run_replay_on_host(monkeypatch, path, [program(nondeterministic=True)], "--format=json")
    data = json.loads(out)
    assert code == 0 and data["verification"]["verified"] and data["verification"]["nondeterministic"], err
    assert "verified: 2 range(s) compared (2 typed) over 4 replay(s)" in err and "capture       " in err
    code, out, err = run_replay_on_host(monkeypatch, path, [program(nondeterministic=True, bug="dropped term")])
    assert code == 1 and "FAIL wrong" in out and "<- wrong" in out and "NOT verified" in out
    assert err.strip().startswith("run-replay: error: verification: 1 of 2 compared range(s) failed; first: op")


def test_run_replay_fails_a_skipped_kernel_against_the_reference_replay(tmp_path, monkeypatch):
    """The CLI's reference replay: a second session of the capture as recorded (no overrides)
    says which bytes its kernels write; the skipped kernel's output was left poisoned."""
    x = inputs()
    answer = row_sums(x, None)
    path = write_capture(tmp_path / "c.kreplay", out_start=answer, out_expected=answer)
    code, out, err = run_replay_on_host(monkeypatch, path, [program()])
    assert code == 0 and "proven" in out, err
    skipped_options = []

    def with_skip(p, options, **_):
        skipped_options.append(options)
        return HostSession(Path(p), PlanOptions(), program(skip_out=not skipped_options[1:]))

    from click.testing import CliRunner

    from replayfmt_tools import run_replay

    # a skip of "operation 0" stands for any change of kernels: the plan says the work changed
    monkeypatch.setattr(verifying, "open_replay", with_skip)
    monkeypatch.setattr(Verification, "kernels_changed", property(lambda self: True))
    result = CliRunner().invoke(run_replay.main, ["--verify", str(path)])
    assert result.exit_code == 1, result.stderr
    assert len(skipped_options) == 2 and skipped_options[1].launch_overrides == ()
    assert "left as it started" in result.stdout and "not written by this replay" in result.stdout


def test_run_replay_with_nothing_to_compare_says_so(tmp_path, monkeypatch):
    path = tmp_path / "empty.kreplay"
    with replayfmt.CaptureWriter(path) as w:
        dev = w.add_object(m.Device(name="NVIDIA H100", compute_capability=(9, 0)))
        w.add_object(m.Buffer(size=64, device=dev))
    code, _, err = run_replay_on_host(monkeypatch, path, [lambda *a: None])
    assert code == 1 and "nothing was compared" in err


def test_integer_ranges_are_poisoned_gently(tmp_path):
    """An integer range that starts as expected is poisoned by flipping the lowest bit of each
    element (an index stays within one of its value: no fault); the output computed from it is
    proven in the second round."""
    x = inputs()
    answer = row_sums(x, None)
    path = write_capture(tmp_path / "c.kreplay", out_start=answer, out_expected=answer, x_dtype=m.DType.INT32)
    report, _ = verify(path, program())
    ranges = by_label(report)
    assert ranges["x"].evidence is Evidence.UNCHANGED and ranges["out"].evidence is Evidence.PROVEN
    assert report.verified and report.poisoned_replays == 2


def test_no_integer_or_untyped_poison_where_memory_holds_addresses(tmp_path):
    x = inputs()
    answer = row_sums(x, None)
    path = write_capture(tmp_path / "c.kreplay", out_start=answer, out_expected=answer, x_dtype=m.DType.INT32)
    with replayfmt.open(path) as cap:
        plan = build_plan(cap, PlanOptions())
        plan.needs_fixed_addresses = True  # as a capture whose snapshots held device addresses
        v = Verification(plan)
        replayer = HostReplayer(plan, program())
        v.attach(replayer)
        v.note_runs(replayer.run(1))
        v.finish(replayer)
        ranges = by_label(v.report())
    assert ranges["x"].evidence is Evidence.UNPROVEN and "stores device addresses" in ranges["x"].note
    assert ranges["out"].evidence is Evidence.PROVEN


def test_a_skipped_kernel_is_seen_in_a_segment_whose_other_tensors_changed(tmp_path):
    """One allocation (a caching-allocator segment) holds OUT, which changes, and Y, which starts
    as it ends: the entry as a whole is no candidate, but with kernels changed its float piece Y
    is poisoned, and the reference replay shows the skipped kernel's bytes left."""
    x = inputs()
    out, y = row_sums(x, None), (2 * x[:, 0]).astype(np.float32)
    path = tmp_path / "seg.kreplay"
    with replayfmt.CaptureWriter(path) as w:
        dev = w.add_object(m.Device(name="NVIDIA H100", compute_capability=(9, 0)))
        assert w.add_object(m.Buffer(size=x.nbytes, device=dev, label="x")) == X_ID
        segment = w.add_object(m.Buffer(size=2 * out.nbytes, device=dev, label="segment"))
        with w.scope("step"):
            w.state(buffer=X_ID, data=x)
            w.state(buffer=segment, data=np.concatenate([np.zeros_like(out), y]))
            entries = [
                m.CheckpointEntry(X_ID, w.add_payload(x), 0, x.nbytes),
                m.CheckpointEntry(segment, w.add_payload(np.concatenate([out, y])), 0, 2 * out.nbytes),
            ]
            types = [
                m.TypedTensor(segment, 0, out.nbytes, m.DType.FLOAT32, (ROWS,), (), "out"),
                m.TypedTensor(segment, out.nbytes, y.nbytes, m.DType.FLOAT32, (ROWS,), (), "y"),
            ]
            w.checkpoint(entries, name="step", types=types)

    def kernels(*, write_y: bool):
        def run(memory, _checkpoint, _number):
            xs = f32(memory, X_ID).reshape(ROWS, COLS)
            memory[segment][: out.nbytes] = row_sums(xs, None).tobytes()
            if write_y:
                memory[segment][out.nbytes :] = (2 * xs[:, 0]).astype(np.float32).tobytes()

        return run

    with replayfmt.open(path) as cap:
        plan = build_plan(cap, PlanOptions())
        plan.options = PlanOptions(launch_overrides=(LaunchOverride(0, skip=True),))  # kernels were changed
        v = Verification(plan)
        assert all(b != segment for _, b, _ in v.candidates)  # the segment as a whole does not start as it ends
        replayer = HostReplayer(plan, kernels(write_y=False))
        v.attach(replayer)
        v.note_runs(replayer.run(1))
        v.finish(replayer)
        v.apply_reference(v.reference_written(HostReplayer(plan, kernels(write_y=True))))
        report = v.report()
    pieces_by_name = {r.piece.name: r for r in report.ranges}
    assert pieces_by_name["y"].evidence is Evidence.LEFT and pieces_by_name["out"].evidence is Evidence.COMPARED
    assert not report.verified


def test_a_dry_run_in_json_is_json(tmp_path):
    x = inputs()
    path = write_capture(tmp_path / "c.kreplay", out_start=np.zeros(ROWS, np.float32), out_expected=row_sums(x, None))
    code, out, err = run_cli("--dry-run", "--format=json", str(path))
    assert code == 0 and json.loads(out) == {"capture": str(path), "dry_run": True, "problems": []}
    assert "dry run: plan OK" in err


def test_an_untyped_range_that_differs_is_typed_by_the_kernel_parameters_pointing_into_it(tmp_path, cubin):
    """Triton's signatures name pointer element types (``*fp32``): the capture stores them on the
    function's parameters, and a differing untyped range is judged by them (values, ulps), not as
    bytes; the earlier replays that matched count for the new pieces."""
    import dataclasses

    from samples import SAXPY

    typed_y = dataclasses.replace(
        SAXPY,
        parameters=(
            *SAXPY.parameters[:2],
            dataclasses.replace(SAXPY.parameters[2], dtype=m.DType.FLOAT32),
            SAXPY.parameters[3],
        ),
    )
    n = 64
    expected = np.arange(n, dtype=np.float32)
    path = tmp_path / "p.kreplay"
    with replayfmt.CaptureWriter(path) as w:
        dev = w.add_object(m.Device(name="NVIDIA H100", compute_capability=(9, 0)))
        x = w.add_object(m.Buffer(size=4 * n, device=dev))
        y = w.add_object(m.Buffer(size=8 * n, device=dev))  # untyped, twice the tensor: its tail is not pointed at
        exe = w.add_object(
            m.Executable(
                format=m.ExecutableFormat.CUBIN, target_arch="sm_90", payload=w.add_payload(cubin), functions=(typed_y,)
            )
        )
        w.module_load(exe, dev)
        params = np.float32(2.0).tobytes() + bytes(20) + np.int32(n).tobytes() + bytes(4)
        w.launch(
            executable=exe,
            function=0,
            grid=(1, 1, 1),
            block=(64, 1, 1),
            parameters=params,
            relocations=[m.Relocation(0, x, 8, 0), m.Relocation(0, y, 16, 0)],
        )
        w.checkpoint({y: np.concatenate([expected, np.zeros(n, np.float32)])}, name="y")
    with replayfmt.open(path) as cap:
        plan = build_plan(cap, PlanOptions(continue_on_error=True))
        v = Verification(plan)
        checkpoint = next(op for op in cap if isinstance(op, m.Checkpoint))
        want = cap.read_payload(checkpoint.entries[0].payload)
        buffer = plan.buffers[y]
        v.observe(checkpoint.index, buffer, 0, want, want, ())  # the first replay matched
        nudged = np.frombuffer(want, np.float32).copy()
        nudged[5] = np.nextafter(nudged[5], np.float32(100))  # one ulp, as atomics give
        v.observe(checkpoint.index, buffer, 0, want, nudged.tobytes(), ())
        v.replays = 2
        report = v.report()
    (piece,) = [r for r in report.ranges if r.piece.typed]
    assert piece.piece.typed_by == "kernel parameter" and piece.piece.dtype == m.DType.FLOAT32
    assert piece.piece.size == 8 * n  # from where the pointer points to the end of the range
    assert piece.judgement.verdict is ValueVerdict.VARIES and piece.judgement.shown[0].index == 5
    assert piece.judgement.shown[0].ulp_diff == 1


def test_integers_are_left_unpoisoned_when_other_ranges_are_evidence(tmp_path):
    """Kernels changed, OUT changed (evidence): X, integer and unchanged, may be a lock a kernel
    spins on, so it is not poisoned unless asked (--evidence=always)."""
    x = inputs()
    path = write_capture(
        tmp_path / "c.kreplay",
        out_start=np.zeros(ROWS, np.float32),
        out_expected=row_sums(x, None),
        x_dtype=m.DType.INT32,
    )
    for policy, poisoned in [(EvidencePolicy.AUTO, False), (EvidencePolicy.ALWAYS, True)]:
        with replayfmt.open(path) as cap:
            plan = build_plan(cap, PlanOptions())
            plan.options = PlanOptions(launch_overrides=(LaunchOverride(0, skip=True),))  # kernels were changed
            v = Verification(plan, evidence=policy)
            replayer = HostReplayer(plan, program())
            v.attach(replayer)
            v.note_runs(replayer.run(1))
            v.finish(replayer)
            x_range = by_label(v.report())["x"]
        assert (x_range.evidence is Evidence.UNCHANGED) is poisoned, x_range.line()
        assert poisoned or "--evidence=always" in x_range.note


@pytest.mark.parametrize("typed", [True, False])
def test_a_permutation_of_a_poisoned_input_is_proven_when_poisoned_alone(tmp_path, typed):
    """A kernel that only moves values (a copy, a reverse) carries a poisoned input's poison into
    its output whole: poisoned together, the output looks left as poisoned (seen on the H100 with
    kernel-mode captures of a reverse kernel after a warm-up). Poisoned alone, it is proven."""
    x = inputs()
    moved = x.ravel()[::-1].reshape(ROWS, COLS)[:, 0].copy()  # ROWS values, as OUT holds
    path = write_capture(tmp_path / "c.kreplay", out_start=moved, out_expected=moved, typed=typed)

    def reverse(memory, _checkpoint, _number):
        memory[OUT_ID][:] = f32(memory, X_ID)[::-1].reshape(ROWS, COLS)[:, 0].copy().tobytes()

    report, _ = verify(path, reverse)
    ranges = by_label(report)
    assert ranges["out"].evidence is Evidence.PROVEN, ranges["out"].line()
    assert ranges["x"].evidence is Evidence.UNCHANGED and report.verified


def test_a_capture_holding_stored_pointers_never_poisons_its_integers(tmp_path):
    """A pointer table in starting state (a 1.3 data relocation) is integer data the region reads:
    poisoned, the kernel following it faults (the H100 replay of a CuPy pointer-table program hit
    CUDA_ERROR_MISALIGNED_ADDRESS in its poisoned replay). Its floats are still poisoned."""
    x = inputs()
    answer = row_sums(x, None)
    path = write_capture(tmp_path / "c.kreplay", out_start=answer, out_expected=answer, x_dtype=m.DType.INT32)
    table = tmp_path / "t.kreplay"
    with replayfmt.open(path) as cap, replayfmt.CaptureWriter(table) as w:
        for obj in cap.objects():
            w.add_object(obj)
        for op in cap.iter_operations():
            if isinstance(op, m.State) and op.buffer == X_ID:  # X's first word points into OUT
                relocation = m.Relocation(X_ID, OUT_ID, 0, 0)
                w.state(buffer=X_ID, data=cap.read_payload(op.payload), offset=op.offset, relocations=[relocation])
            elif isinstance(op, m.State):
                w.state(buffer=op.buffer, data=cap.read_payload(op.payload), offset=op.offset)
            elif isinstance(op, m.ScopeBegin):
                w.scope_begin(op.name)
            elif isinstance(op, m.ScopeEnd):
                w.scope_end(op.name)
            elif isinstance(op, m.Checkpoint):
                entries = [(e.buffer, w.add_payload(cap.read_payload(e.payload)), e.offset, e.size) for e in op.entries]
                w.checkpoint(entries, name=op.name, types=op.types)
    report, _ = verify(table, program())
    ranges = by_label(report)
    assert ranges["x"].evidence is Evidence.UNPROVEN and "stores device addresses" in ranges["x"].note
    assert ranges["out"].evidence is Evidence.PROVEN and report.verified


def test_ranges_of_a_restored_segment_that_start_as_expected_are_found_reading_its_state_once(tmp_path):
    """A kernel-mode region restores a whole segment and checkpoints ranges of it: the ranges whose
    expected bytes are their starting bytes (and only those) are candidates, and the segment's
    state is read once for all of them, not once per range."""
    rng = np.random.default_rng(5)
    start = rng.standard_normal(4096).astype(np.float32)
    end = start.copy()
    end[1024:1536] += 1  # the second range changes; the first, third and fourth end as they started
    path = tmp_path / "k.kreplay"
    ranges = [(0, 512), (1024, 512), (2048, 256), (3000, 1000)]
    with replayfmt.CaptureWriter(path) as w:
        dev = w.add_object(m.Device(name="NVIDIA H100", compute_capability=(9, 0)))
        segment = w.add_object(m.Buffer(size=start.nbytes, device=dev, label="segment"))
        with w.scope("k#0"):
            state = w.state(buffer=segment, data=start)
            w.checkpoint(
                [m.CheckpointEntry(segment, w.add_payload(end[a : a + n]), 4 * a, 4 * n) for a, n in ranges], name="k#0"
            )
    with replayfmt.open(path) as cap:
        plan = build_plan(cap, PlanOptions())
        state_payload = cap.operation(state).payload
        reads: list[int] = []
        read_payload = cap.read_payload
        cap.read_payload = lambda payload, *a, **k: reads.append(payload) or read_payload(payload, *a, **k)
        candidates = Verification(plan).candidates
    assert sorted(offset for _, _, offset in candidates) == [0, 4 * 2048, 4 * 3000]
    assert reads.count(state_payload) == 1


def test_with_kernels_changed_the_unchanged_float_pieces_of_a_segment_are_found_reading_its_state_once(tmp_path):
    """A substitution's verification also poisons the float pieces of a changed segment that end
    as they started: those pieces (and only those) are found, reading the segment's state once."""
    rng = np.random.default_rng(6)
    start = rng.standard_normal(4096).astype(np.float32)
    end = start.copy()
    end[:512] += 1  # the first tensor changes; the other two end as they started
    path = tmp_path / "seg.kreplay"
    tensors = [(0, 512, "changed"), (512, 1024, "kept"), (2048, 1024, "also kept")]
    with replayfmt.CaptureWriter(path) as w:
        dev = w.add_object(m.Device(name="NVIDIA H100", compute_capability=(9, 0)))
        segment = w.add_object(m.Buffer(size=start.nbytes, device=dev, label="segment"))
        with w.scope("k#0"):
            state = w.state(buffer=segment, data=start)
            types = [m.TypedTensor(segment, 4 * a, 4 * n, m.DType.FLOAT32, (n,), (), name) for a, n, name in tensors]
            w.checkpoint([m.CheckpointEntry(segment, w.add_payload(end), 0, end.nbytes)], name="k#0", types=types)

    def kernel(memory, _checkpoint, _number):
        memory[segment][:] = end.tobytes()

    with replayfmt.open(path) as cap:
        plan = build_plan(cap, PlanOptions())
        plan.options = PlanOptions(launch_overrides=(LaunchOverride(0, skip=True),))  # kernels were changed
        state_payload = cap.operation(state).payload
        v = Verification(plan)
        replayer = HostReplayer(plan, kernel)
        v.attach(replayer)
        v.note_runs(replayer.run(1))
        partial: list[tuple[int, int]] = []  # reads of part of the segment's state
        read_payload = cap.read_payload

        def counted(payload, offset=0, size=None, **kw):
            if payload == state_payload and (offset, size) != (0, start.nbytes):
                partial.append((offset, size))
            return read_payload(payload, offset, size, **kw)

        cap.read_payload = counted
        v.finish(replayer)
        report = v.report()
    assert sorted(v.pieces[key].name for key in v.regions) == ["also kept", "kept"]
    assert len(partial) == 1
    assert {r.piece.name: r.evidence for r in report.ranges}["kept"] is Evidence.PROVEN  # poisoned, then written
