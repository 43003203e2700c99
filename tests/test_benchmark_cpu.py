"""benchmark-replay without a GPU: region selection, statistics and usage errors."""

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from samples import SAXPY, compiled_cubin

import replayfmt
from replayfmt.execute import open_replay
from replayfmt.format import model as m
from replayfmt.measure import kernel_times as kt
from replayfmt.measure.benchmark import BenchmarkResult, KernelTiming, Region, Stats, find_region, region_steps
from replayfmt.replay.steps import Step, StepKind
from replayfmt_tools.benchmark_replay import _compare, _csv, main


def scoped(path, markers) -> None:
    with replayfmt.CaptureWriter(path) as w:
        for kind, name in markers:
            (w.scope_begin if kind == "begin" else w.scope_end)(name)


@pytest.mark.parametrize(
    ("markers", "scope", "region"),
    [
        ([("begin", "a"), ("end", "a")], "a", Region("a", 1, 1)),
        (
            [("begin", "a"), ("begin", "b"), ("end", "b"), ("end", "a"), ("begin", "b"), ("end", "b")],
            "b",
            Region("b", 2, 2),
        ),
        ([("begin", "a"), ("begin", "a"), ("end", "a"), ("end", "a")], "a", Region("a", 1, 3)),
        ([("begin", "a"), ("end", "a")], None, Region(None, 0, 2)),
    ],
)
def test_find_region(tmp_path, markers, scope, region):
    path = tmp_path / "s.kreplay"
    scoped(path, markers)
    with replayfmt.open(path) as cap:
        assert find_region(cap, scope) == region


@pytest.mark.parametrize(
    ("markers", "error", "message"),
    [
        ([("begin", "a"), ("end", "b")], replayfmt.ReplayError, "scope end 'b' matches no open scope ('a' is open)"),
        ([("end", "a")], replayfmt.ReplayError, "no scope is open"),
        ([("begin", "a")], replayfmt.ReplayError, "scope 'a' is never closed"),
        ([("begin", "a"), ("end", "a")], replayfmt.ReplayUsageError, "no such scope (scopes: a)"),
    ],
)
def test_find_region_rejects(tmp_path, markers, error, message):
    path = tmp_path / "s.kreplay"
    scoped(path, markers)
    with replayfmt.open(path) as cap, pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        find_region(cap, "zzz" if "no such" in message else "a")


def test_stats():
    s = Stats.of([1.0, 2.0, 3.0, 4.0, 10.0])
    assert (s.min, s.median, s.mean) == (1.0, 3.0, 4.0) and s.p90 == pytest.approx(7.6) and s.stddev > 0
    assert Stats.of([]).median == 0.0 and Stats.of([2.0]).stddev == 0.0


def _result(median: float) -> BenchmarkResult:
    s = Stats(median, median, median, 0.0, median)
    return BenchmarkResult("c", "gpu", "step", (1, 5), "eager", 10, 3, False, s, s, [KernelTiming(2, "k", 1, s)])


def test_compare_and_csv(tmp_path):
    baseline = tmp_path / "base.json"
    baseline.write_text(json.dumps(_result(2.0).to_json()))
    lines = _compare(_result(1.0), baseline)
    assert "2.000x" in lines[1] and "op       2 k" in lines[2] and "2.000x" in lines[2]
    assert _csv(_result(1.0)).splitlines()[0].startswith("what,name,operation,min_ms")
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    with pytest.raises(replayfmt.ReplayUsageError, match="not a benchmark-replay --format=json result"):
        _compare(_result(1.0), bad)


def test_cli_usage_errors_need_no_gpu(tmp_path):
    path = tmp_path / "s.kreplay"
    scoped(path, [("begin", "step"), ("end", "step")])
    result = CliRunner().invoke(main, ["--scope=nope", str(path)])
    assert result.exit_code == 2 and "no such scope (scopes: step)" in result.stderr
    existing = tmp_path / "t.json"
    existing.write_text("{}")
    result = CliRunner().invoke(main, [f"--trace={existing}", str(path)])
    assert result.exit_code == 2 and "already exists" in result.stderr
    unbalanced = tmp_path / "u.kreplay"
    scoped(unbalanced, [("begin", "step")])
    result = CliRunner().invoke(main, [str(unbalanced)])
    assert result.exit_code == 1 and "never closed" in result.stderr


def test_agents_md_has_the_benchmark_notes():
    result = CliRunner().invoke(main, ["--agents-md"])
    assert result.exit_code == 0 and "## benchmark-replay notes" in result.stdout


# -- starting state is never timed, whatever the region ----------------------------------------

ROOT = Path(__file__).resolve().parent.parent


def skeleton(session) -> list[Step]:
    """The replay's steps as the StepBuilder orders them with --nvtx (a region's hoisted state first,
    then each operation's own step), with no device behind them."""
    kinds = {
        m.OperationKind.LAUNCH: StepKind.LAUNCH,
        m.OperationKind.CHECKPOINT: StepKind.CHECKPOINT,
        m.OperationKind.SCOPE_BEGIN: StepKind.NVTX_PUSH,  # as with --nvtx
        m.OperationKind.SCOPE_END: StepKind.NVTX_POP,
    }
    out = []
    for op in session.capture.iter_operations():
        if op.index in session.plan.state:
            out.append(Step(StepKind.STATE, print, (), op.index))
        out.append(Step(kinds.get(op.kind, StepKind.TAG), print, (), op.index))
    return out


def region_of(session, scope):
    region = find_region(session.capture, scope)
    device = [op.index for op in session.capture.iter_operations() if op.kind is m.OperationKind.LAUNCH]
    return region, region_steps(skeleton(session), region, device)


def test_the_whole_capture_of_a_kernel_mode_recording_sets_its_state_untimed():
    """benchmark-replay with no --scope on a kernel-mode capture: the scope's starting state (2 MiB
    for one softmax) was timed as part of the region (33x the original's busy time)."""
    with open_replay(ROOT / "examples" / "triton_softmax.kreplay") as session:
        region, split = region_of(session, None)
        assert (region.start, region.stop) == (0, session.capture.operation_count)
        assert [s.kind for s in split.setup if s.kind is StepKind.STATE] == [StepKind.STATE]
        assert all(s.kind is not StepKind.STATE for s in split.body) and not split.inner_state
        assert [s.kind for s in split.body].count(StepKind.LAUNCH) == 1
        _, scoped_split = region_of(session, "softmax_kernel#0")  # the scope alone: the same split
        assert [s.operation for s in scoped_split.body if s.kind is StepKind.LAUNCH] == [
            s.operation for s in split.body if s.kind is StepKind.LAUNCH
        ]


def two_kernel_scopes(path: Path) -> None:
    """A kernel-mode capture of two saxpy launches: each scope holds its state, launch and checkpoint."""
    n = 256
    with replayfmt.CaptureWriter(path, threads=0) as w:
        w.add_object(m.Device(name="test", compute_capability=(9, 0)))
        x = w.add_object(m.Buffer(size=4 * n, dtype=m.DType.FLOAT32, shape=(n,)))
        y = w.add_object(m.Buffer(size=4 * n, dtype=m.DType.FLOAT32, shape=(n,)))
        exe = w.add_object(
            m.Executable(
                format=m.ExecutableFormat.CUBIN,
                target_arch="sm_90",
                payload=w.add_payload(compiled_cubin("container_kernels.cu")),
                functions=(SAXPY,),
            )
        )
        params = np.float32(2).tobytes() + bytes(20) + np.int32(n).tobytes() + bytes(4)
        for k in range(2):
            with w.scope(f"saxpy#{k}"):
                w.state(buffer=x, data=np.full(n, k, np.float32))
                w.state(buffer=y, data=np.ones(n, np.float32))
                w.launch(
                    executable=exe,
                    function=0,
                    grid=(1, 1, 1),
                    block=(n, 1, 1),
                    parameters=params,
                    relocations=[m.Relocation(0, x, 8, 0), m.Relocation(0, y, 16, 0)],
                )
                w.checkpoint({y: np.full(n, 2 * k + 1, np.float32)})


def test_a_region_spanning_two_captured_regions_sets_the_second_ones_state_untimed(tmp_path):
    path = tmp_path / "two.kreplay"
    two_kernel_scopes(path)
    with open_replay(path) as session:
        _, split = region_of(session, None)
        assert [s.kind for s in split.setup].count(StepKind.STATE) == 1  # the first scope's
        assert len(split.inner_state) == 1  # the second's: every iteration, outside the timing
        body = split.body

    class Activity:
        """CUPTI's external correlation ids: one stack per kind."""

        def __init__(self) -> None:
            self.stacks: dict[object, list[int]] = {}

        def push(self, kind, value) -> None:
            self.stacks.setdefault(kind, []).append(value)

        def pop(self, kind) -> None:
            self.stacks[kind].pop()

        def tagged(self, kind, value) -> bool:
            return self.stacks.get(kind, [None])[-1:] == [value]

    for per_operation in (False, True):
        activity = Activity()
        clock = kt.CuptiClock(activity, per_operation=per_operation)
        seen: dict[StepKind, list[bool]] = {}
        clock.begin(7)
        for step in clock.instrument(body):
            if step.kind is StepKind.TAG:
                step.fn(*step.args)
            else:  # is this step's device work tagged as iteration 7?
                seen.setdefault(step.kind, []).append(activity.tagged(kt.ExternalKind.CUSTOM0, 7))
        clock.end()
        assert seen[StepKind.STATE] == [False] and seen[StepKind.LAUNCH] == [True, True], per_operation
        assert not any(activity.stacks.values())


def test_help_names_the_clocks_it_times_with():
    """--help said the region was timed "with CUDA events" while busy and per-operation times come
    from CUPTI."""
    text = " ".join(CliRunner().invoke(main, ["--help"]).stdout.split())
    summary = text.split("Options:")[0]
    assert "every time, with CUDA events" not in text
    assert "Elapsed time from CUDA events; GPU busy and per-operation times from CUPTI" in summary
    assert "starting state stay outside the timed region" in summary


def test_the_quick_start_capture_carries_the_originals_times():
    """The first benchmark a new user runs must have the original's times to compare with."""
    with replayfmt.open(ROOT / "examples" / "triton_softmax.kreplay") as cap:
        times = cap.original_times()
        launches = [op.index for op in cap.iter_operations() if op.kind is m.OperationKind.LAUNCH]
        assert launches and all(times.duration_ns(i) for i in launches)


def test_a_scopes_nvtx_range_opens_and_closes_every_iteration():
    """benchmark-replay --nvtx --scope: the scope's range was pushed once with the setup and never
    popped (its markers sit just outside the region), so no iteration had a range of its own."""
    with open_replay(ROOT / "examples" / "triton_softmax.kreplay") as session:
        for scope in ("softmax_kernel#0", None):
            _, split = region_of(session, scope)
            kinds = [s.kind for s in split.body if s.kind is not StepKind.TAG]
            assert kinds == [StepKind.NVTX_PUSH, StepKind.LAUNCH, StepKind.NVTX_POP], scope
            assert not any(s.kind in (StepKind.NVTX_PUSH, StepKind.NVTX_POP) for s in split.setup), scope


def test_the_benchmark_verb_refuses_a_missing_scope_before_any_device_work(tmp_path, monkeypatch):
    from replayfmt.execute import ReplaySession
    from replayfmt.measure.benchmark import BenchmarkOptions
    from replayfmt.verbs import BenchmarkReplayOptions, benchmark

    def no_device(*_args, **_kwargs):
        raise AssertionError("the device was started before the scope was found")

    monkeypatch.setattr(ReplaySession, "start", no_device)
    path = tmp_path / "s.kreplay"
    scoped(path, [("begin", "a"), ("end", "a")])
    options = BenchmarkReplayOptions(measure=BenchmarkOptions(scope="b"))
    with pytest.raises(replayfmt.ReplayUsageError, match="'b'"):
        benchmark(path, options)
