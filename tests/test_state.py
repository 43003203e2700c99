"""Starting state (format 1.1 ``state`` operations): the round trip, format 1.0 files keeping
their meaning, dump-replay showing state apart from copies, and the plan hoisting each region's
state to before the region begins."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import replayfmt
from replayfmt.errors import ReplayError
from replayfmt.format import model as m
from replayfmt.replay.plan import PlanOptions, RegionTracker, build_plan
from replayfmt_tools.dump_replay import main as dump_main
from replayfmt_tools.run_replay import main as run_main

GOLDEN_1_0 = Path(__file__).parent / "golden" / "sample-1.0.kreplay"
EXAMPLE_1_0 = Path(__file__).resolve().parent.parent / "examples" / "saxpy.kreplay"


def write(path: Path, build) -> Path:
    with replayfmt.CaptureWriter(path) as w:
        dev = w.add_object(m.Device(name="NVIDIA H100", compute_capability=(9, 0)))
        build(w, dev)
    return path


def test_state_round_trips_and_is_no_copy(tmp_path):
    data = np.arange(64, dtype=np.float32)

    def build(w, dev):
        buf = w.add_object(
            m.Buffer(
                size=512,
                device=dev,
                ranges=(m.TypedRange(0, 256, m.DType.FLOAT32), m.TypedRange(256, 256, m.DType.INT32)),
            )
        )
        with w.scope("step"):
            w.state(buffer=buf, data=data, offset=256)
            w.memset(buffer=buf, value=0, count=4)

    with replayfmt.open(write(tmp_path / "s.kreplay", build)) as cap:
        assert (cap.header.major, cap.header.minor) == (1, replayfmt.FORMAT_MINOR)
        state = next(op for op in cap if isinstance(op, m.State))
        assert state.kind == m.OperationKind.STATE and state.kind.label == "state"
        assert (state.buffer, state.offset, state.size) == (2, 256, 256)
        assert cap.read_payload(state.payload) == data.tobytes()
        assert not any(op.kind == m.OperationKind.COPY_HOST_TO_DEVICE for op in cap)
        buffer = cap.object(2)
        assert buffer.ranges == (m.TypedRange(0, 256, m.DType.FLOAT32), m.TypedRange(256, 256, m.DType.INT32))
        assert buffer.dtype_at(256, 256) == m.DType.INT32 and buffer.dtype_at(0, 512) == m.DType.UNKNOWN


def test_writer_state_needs_bytes(tmp_path):
    message = r"^state needs data, or a payload id with a size$"
    with replayfmt.CaptureWriter(tmp_path / "w.kreplay") as w, pytest.raises(replayfmt.ReplayUsageError, match=message):
        w.state(buffer=1, payload=0, size=8)


def test_format_1_0_golden_still_opens_and_means_copies():
    """A file written by format 1.0: its uploads stay program copies, it has no state."""
    for path in (GOLDEN_1_0, EXAMPLE_1_0):
        with replayfmt.open(path) as cap:
            assert (cap.header.major, cap.header.minor) == (1, 0)
            kinds = [op.kind for op in cap]
            assert m.OperationKind.STATE not in kinds and m.OperationKind.COPY_HOST_TO_DEVICE in kinds
            assert all(not o.ranges for o in cap.objects() if isinstance(o, m.Buffer))
    with replayfmt.open(GOLDEN_1_0) as cap:
        plan = build_plan(cap, PlanOptions(continue_on_error=True))
        assert not plan.state and len(plan.uploads) == 2
    result = CliRunner().invoke(dump_main, ["--summary", str(GOLDEN_1_0)])
    assert result.exit_code == 0 and "format        1.0" in result.stdout
    assert "state         0 B starting state (restored, not timed); 512 B uploaded by the program" in result.stdout


def test_dump_shows_state_apart(tmp_path):
    def build(w, dev):
        buf = w.add_object(m.Buffer(size=4096, device=dev))
        w.copy_h2d(dst_buffer=buf, data=bytes(1024))
        with w.scope("step"):
            w.state(buffer=buf, data=b"\x01" * 4096)

    path = write(tmp_path / "d.kreplay", build)
    runner = CliRunner()
    text = runner.invoke(dump_main, [str(path)]).stdout
    line = next(t for t in text.splitlines() if t.startswith("op ") and " state " in t)
    assert line.endswith("-> buffer#2+0 size=4096 (starting state)")
    assert "state         4.0 KiB starting state (restored, not timed); 1.0 KiB uploaded by the program" in text
    rows = [json.loads(t) for t in runner.invoke(dump_main, ["--format=jsonl", str(path)]).stdout.splitlines()]
    assert rows[0]["jsonl_version"] == 6
    (state,) = [r for r in rows if r["kind"] == "state"]
    assert (state["buffer"], state["offset"], state["size"], state["payload"]["size"]) == (2, 0, 4096, 4096)
    assert rows[1]["state_bytes"] == 4096 and rows[1]["upload_bytes"] == 1024
    assert rows[1]["operations"]["state"] == 1 and rows[1]["operations"]["copy_h2d"] == 1
    only = runner.invoke(dump_main, ["--kind=state", "--format=jsonl", str(path)]).stdout.splitlines()
    assert [json.loads(t)["kind"] for t in only[2:]] == ["state"]


def test_regions_begin_at_outermost_scopes_and_at_stretches_between_them():
    ops = [
        m.CreateObject(0, 1),
        m.ScopeBegin(1, "a"),
        m.ScopeBegin(2, "inner"),
        m.State(3, 2, 1, 0, 4),
        m.ScopeEnd(4, "inner"),
        m.ScopeEnd(5, "a"),
        m.Memset(6, 0, 2, 0, 1, 0, 4),
        m.State(7, 2, 1, 0, 4),
        m.ScopeBegin(8, "b"),
        m.State(9, 2, 1, 0, 4),
        m.ScopeEnd(10, "b"),
    ]
    tracker = RegionTracker()
    assert [tracker.step(op) for op in ops] == [0, 1, 1, 1, 1, 1, 6, 6, 8, 8, 8]


def test_plan_hoists_each_regions_state_before_it(tmp_path):
    def build(w, dev):
        buf = w.add_object(m.Buffer(size=256, device=dev))
        other = w.add_object(m.Buffer(size=64, device=dev))
        w.memset(buffer=buf, value=0, count=256)  # in the stretch that began at operation 0
        w.state(buffer=other, data=bytes(range(64)))
        with w.scope("k#0"):  # op 5
            w.memset(buffer=buf, value=1, count=16)
            w.state(buffer=buf, data=b"\x02" * 256)  # found after the first touch was recorded
        with w.scope("k#1"):  # op 9
            w.state(buffer=buf, data=b"\x03" * 128, offset=128)

    with replayfmt.open(write(tmp_path / "p.kreplay", build)) as cap:
        plan = build_plan(cap)
        assert {k: [(c.index, c.dst_buffer, c.dst_offset, c.size) for c in v] for k, v in plan.state.items()} == {
            0: [(4, 3, 0, 64)],
            5: [(7, 2, 0, 256)],
            9: [(10, 2, 128, 128)],
        }
        assert plan.state_bytes == 448 and len(plan.uploads) == 3
        assert any(line.startswith("state         3 range(s), 448 bytes, in 3 region(s)") for line in plan.describe())
    result = CliRunner().invoke(run_main, ["--dry-run", str(tmp_path / "p.kreplay")])
    assert result.exit_code == 0 and "state         3 range(s)" in result.stdout


def test_plan_refuses_state_outside_its_buffer(tmp_path):
    def build(w, dev):
        buf = w.add_object(m.Buffer(size=64, device=dev))
        w.state(buffer=buf, data=bytes(32), offset=48)

    message = r"^operation 2 \(state\): state range \[48, 80\) lies outside buffer 2 "
    with replayfmt.open(write(tmp_path / "bad.kreplay", build)) as cap, pytest.raises(ReplayError, match=message):
        build_plan(cap)


RECORDED = Path(__file__).resolve().parent.parent / "examples" / "triton_softmax.kreplay"


def test_recorded_example_dumps_and_plans_without_a_gpu():
    """The README's example, recorded by the recorder from a Triton program in kernel mode."""
    assert RECORDED.stat().st_size < 2 << 20
    with replayfmt.open(RECORDED) as cap:
        assert cap.metadata.tool == "replayfmt.capture" and dict(cap.metadata.properties)["mode"] == "kernel"
        kinds = [op.kind for op in cap]
        assert m.OperationKind.STATE in kinds and m.OperationKind.COPY_HOST_TO_DEVICE not in kinds
        plan = build_plan(cap)
        begins = [op.index for op in cap if isinstance(op, m.ScopeBegin)]
        assert sorted(plan.state) == begins and not plan.problems
    runner = CliRunner()
    text = runner.invoke(dump_main, [str(RECORDED)]).stdout
    assert "softmax_kernel" in text and "(starting state)" in text
    result = runner.invoke(run_main, ["--dry-run", str(RECORDED)])
    assert result.exit_code == 0 and "dry run: plan OK" in result.stdout


def test_an_undefined_state_round_trips_shows_in_dump_and_is_known_to_the_plan(tmp_path):
    """Format 1.6: STATE_FLAG_UNDEFINED, a range that held none of the program's data when its
    region began; older files have no flags."""
    data = np.arange(16, dtype=np.int32)

    def build(w, dev):
        buf = w.add_object(m.Buffer(size=128, device=dev))
        with w.scope("step"):
            w.state(buffer=buf, data=data)
            w.memset(buffer=buf, value=0, count=4)
            w.state(buffer=buf, data=data, offset=64, flags=m.STATE_FLAG_UNDEFINED)  # after what wrote it

    path = write(tmp_path / "u.kreplay", build)
    with replayfmt.open(path) as cap:
        defined, undefined = [op for op in cap if isinstance(op, m.State)]
        assert (defined.flags, undefined.flags, undefined.undefined) == (0, m.STATE_FLAG_UNDEFINED, True)
        plan = build_plan(cap, PlanOptions())
        assert plan.undefined_state == {undefined.index}
        (hoisted,) = plan.state.values()
        assert [c.index for c in hoisted] == [defined.index, undefined.index]  # both hoisted, in order
    out = CliRunner().invoke(dump_main, ["--format=jsonl", "--kind=state", str(path)]).stdout
    rows = [json.loads(line) for line in out.splitlines()][2:]
    assert [r.get("undefined", False) for r in rows] == [False, True]
    text = CliRunner().invoke(dump_main, ["--kind=state", str(path)]).stdout
    assert "undefined: none of the program's data" in text
    with replayfmt.open(Path(__file__).parent / "golden" / "sample-1.5.kreplay") as cap:
        assert (cap.header.major, cap.header.minor) == (1, 5)
        assert [op.flags for op in cap if isinstance(op, m.State)] == [0]


def test_a_state_flag_the_reader_does_not_know_is_refused(tmp_path):
    def build(w, dev):
        buf = w.add_object(m.Buffer(size=64, device=dev))
        with w.scope("step"):
            w.state(buffer=buf, data=np.zeros(16, np.int32), flags=4)

    refused = pytest.raises(ReplayError, match=r"operation \d+ \(state\): unknown flags 0x4 .*upgrade replayfmt")
    with replayfmt.open(write(tmp_path / "f.kreplay", build)) as cap, refused:
        build_plan(cap, PlanOptions())
