"""The replay's pieces that need no GPU: typed steps and their edits (tuning shapes, re-JITted
functions, timing events), launch shapes with overrides, captured file ranges, run results,
sticky device errors and the open -> plan session."""

import pytest
from samples import write_sample

import replayfmt
from replayfmt.cuda.driver import CudaCallError
from replayfmt.execute import open_replay
from replayfmt.format import model as m
from replayfmt.replay import ReplayOptions, RunResult
from replayfmt.replay.compare import BufferReport
from replayfmt.replay.plan import LaunchOverride, PlanOptions, captured_file_range, launch_shape
from replayfmt.replay.steps import (
    Step,
    StepKind,
    bracket_with_events,
    retarget_functions,
    set_launch_shape,
    wrap_with_events,
)


def launch_kernel(*args):
    return ("launch", args)


def launch_ex(*args):
    return ("launch_ex", args)


def record(*args):
    return ("record", args)


class Config:
    """Stands for a CUlaunchConfig: the fields a shape change copies and writes."""

    gridDimX = gridDimY = gridDimZ = blockDimX = blockDimY = blockDimZ = sharedMemBytes = numAttrs = 0
    hStream = "s"
    attrs: list = []


class Driver:
    """Stands for the driver module: what a shape change builds."""

    CUlaunchConfig = Config


def steps() -> list[Step]:
    f0, f1 = object(), object()
    config = Config()
    return [
        Step(StepKind.UPLOAD, print, (1, 2, 3, "s"), 0),
        Step(StepKind.LAUNCH, launch_kernel, (f0, 1, 1, 1, 32, 1, 1, 0, "s", 1234, 0), 1),
        Step(StepKind.POINTER_SITE, print, (0, 0, 8, "s"), 2),
        Step(StepKind.LAUNCH_EX, launch_ex, (config, f1, 5678, 0), 2),
        Step(StepKind.SYNCHRONIZE, print, ("s",), 3),
    ]


def test_launch_shapes_change_on_their_own_step():
    s = steps()
    set_launch_shape(Driver, s, 1, (8, 2, 1), (64, 2, 1), 1024)
    assert s[1].args == (s[1].args[0], 8, 2, 1, 64, 2, 1, 1024, "s", 1234, 0) and s[1].kind is StepKind.LAUNCH
    shared = s[3].args[0]
    shared.attrs, shared.numAttrs = ["cluster"], 1
    set_launch_shape(Driver, s, 2, (4, 1, 1), (128, 1, 1), 99)
    config = s[3].args[0]
    assert (config.gridDimX, config.blockDimX, config.sharedMemBytes) == (4, 128, 99)
    assert (config.hStream, config.attrs, config.numAttrs, s[3].args[1:]) == (
        "s",
        ["cluster"],
        1,
        (s[3].args[1], 5678, 0),
    )
    assert config is not shared and shared.gridDimX == 0  # a config shared by other launches stays theirs
    with pytest.raises(replayfmt.ReplayUsageError, match="operation 3 is not a launch of this replay"):
        set_launch_shape(Driver, s, 3, (1, 1, 1), (1, 1, 1), 0)


def test_launches_follow_rejitted_functions():
    s = steps()
    old0, old1 = s[1].args[0], s[3].args[1]
    new0, new1 = object(), object()
    retarget_functions(s, {id(old0): new0, id(old1): new1})
    assert s[1].args[0] is new0 and s[3].args[1] is new1
    assert s[1].args[1:] == (1, 1, 1, 32, 1, 1, 0, "s", 1234, 0) and s[3].args[2:] == (5678, 0)


def test_timing_events_bracket_an_operations_steps():
    s = steps()
    wrap_with_events(s, 2, "stream 2", "before", "after", record)
    assert [(x.kind, x.operation) for x in s[2:6]] == [
        (StepKind.EVENT_RECORD, 2),
        (StepKind.POINTER_SITE, 2),
        (StepKind.LAUNCH_EX, 2),
        (StepKind.EVENT_RECORD, 2),
    ]
    assert s[2].args == ("before", "stream 2") and s[5].args == ("after", "stream 2")
    with pytest.raises(replayfmt.ReplayUsageError, match="operation 9 has no device work to time"):
        wrap_with_events(s, 9, "s", "a", "b", record)
    out = bracket_with_events(steps(), {1: ("b1", "a1"), 2: ("b2", "a2")}, {1: "s1", 2: "s2"}, record)
    assert [x.args for x in out if x.kind is StepKind.EVENT_RECORD] == [
        ("b1", "s1"),
        ("a1", "s1"),
        ("b2", "s2"),
        ("a2", "s2"),
    ]
    assert len(out) == 9


def test_launch_override_applies_only_what_it_gives():
    op = m.Launch(
        index=4,
        stream=0,
        executable=1,
        function=0,
        grid=(8, 1, 1),
        block=(128, 1, 1),
        shared_memory=512,
        cluster=(0, 0, 0),
        flags=0,
        parameters=b"",
        relocations=(),
    )
    assert launch_shape(op, None).grid == (8, 1, 1) and launch_shape(op, None).shared_memory == 512
    shape = launch_shape(op, LaunchOverride.parse("4:block=32,2"))
    assert (shape.grid, shape.block, shape.shared_memory, shape.threads_per_block) == ((8, 1, 1), (32, 2, 1), 512, 64)
    assert launch_shape(op, LaunchOverride.parse("4:smem=0")).shared_memory == 0


def test_captured_file_range_must_hold_the_whole_read():
    ref = m.FileReference(
        path="/w.bin", ranges=(m.FileRange(offset=0, size=100, payload=1), m.FileRange(offset=200, size=50, payload=2))
    )
    assert captured_file_range(ref, 210, 40).payload == 2
    assert captured_file_range(ref, 0, 100).payload == 1
    assert captured_file_range(ref, 90, 20) is None and captured_file_range(ref, 240, 20) is None


def report(mismatches: int) -> BufferReport:
    return BufferReport(7, 3, "y", "float32", "exact", 16, mismatches, 0.0, 0.0, 2 if mismatches else None)


def test_run_result_raises_verification_error_naming_the_first_mismatch():
    RunResult(reports=[report(0)]).require_verified()
    result = RunResult(reports=[report(0), report(5), report(1)])
    assert not result.verified and len(result.mismatches) == 2
    with pytest.raises(replayfmt.VerificationError) as raised:
        result.require_verified()
    assert str(raised.value) == (
        "verification failed for 2 buffer range(s); first: op      7 buffer 3 (y): MISMATCH 16 float32 compared "
        "(exact), 5 mismatching, first at index 2"
    )


def test_sticky_errors_say_so():
    assert CudaCallError("launch: boom", "CUDA_ERROR_ILLEGAL_ADDRESS").sticky
    assert not CudaCallError("alloc: boom", "CUDA_ERROR_OUT_OF_MEMORY").sticky
    assert not replayfmt.DeviceError("no fit").sticky and replayfmt.DeviceError("x", sticky=True).sticky


def test_open_replay_plans_and_closes_the_capture(tmp_path):
    path = tmp_path / "s.kreplay"
    write_sample(path)
    with open_replay(path, PlanOptions(continue_on_error=True)) as session:
        assert session.plan.buffer_bytes == 8192 and session.plan.problems
        with pytest.raises(replayfmt.ReplayUsageError, match="has not started its Replayer"):
            session.replayer  # noqa: B018 - the property raises
        capture = session.capture
    with pytest.raises(replayfmt.ReplayError):
        capture.read_payload(1)  # closed with the session
    with pytest.raises(replayfmt.FileMismatchError, match=r"/data/weights\.bin"):
        open_replay(path)
    assert ReplayOptions().verify is False
