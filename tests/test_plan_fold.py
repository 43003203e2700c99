"""The plan checks each distinct operation once (``Capture.distinct_operations``): what it folds
away must equal what stands for it in all but index and parameter values, the counts must add
up, and the verdict must be the one an operation-by-operation walk gives."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import replayfmt
from replayfmt.container.distinct_rows import distinct_rows
from replayfmt.format import model as m
from replayfmt.reader import EventUses
from replayfmt.replay.plan import PlanOptions, build_plan
from replayfmt.replay.plan_checks import repeat_key
from replayfmt.replay.plan_options import LaunchOverride

FN = m.Function(
    name="k",
    parameters=(m.Parameter(offset=0, size=8, kind=m.ParameterKind.POINTER), m.Parameter(offset=8, size=4)),
    parameters_known=True,
)


def _capture(path, *, destroy: bool) -> None:
    rng = np.random.default_rng(1)
    with replayfmt.CaptureWriter(path, threads=0, batch_operations=64) as w:
        dev = w.add_object(m.Device(name="d"))
        s1, ev = w.add_object(m.Stream(device=dev)), w.add_object(m.Event(device=dev))
        a, b = w.add_object(m.Buffer(size=4096, device=dev)), w.add_object(m.Buffer(size=4096, device=dev))
        exe = w.add_object(m.Executable(payload=w.add_payload(b"\x7fELF"), functions=(FN,)))
        payload = w.add_payload(bytes(256))
        for i in range(600):
            pick = int(rng.integers(0, 6))
            target = a if rng.integers(0, 2) else b
            if pick < 3:
                w.launch(
                    executable=exe,
                    function=0,
                    grid=(int(rng.integers(1, 3)), 1, 1),
                    block=(32, 1, 1),
                    parameters=struct.pack("<QI", 0, i),
                    relocations=(m.Relocation(0, target, 0, int(rng.integers(0, 2)) * 64),),
                    stream=s1,
                )
            elif pick == 3:
                w.copy_h2d(dst_buffer=target, payload=payload, size=256, dst_offset=int(rng.integers(0, 2)) * 256)
            elif pick == 4:
                w.memset(buffer=target, value=int(rng.integers(0, 2)), count=16)
            elif rng.integers(0, 2):
                w.event_record(ev, s1)
            else:  # a new event per record, then waited on or synchronised (as Triton's do_bench does)
                fresh = w.add_object(m.Event(device=dev))
                w.event_record(fresh, s1)
                if rng.integers(0, 2):
                    w.stream_wait_event(s1, fresh)
                else:
                    w.event_synchronize(fresh)
            if destroy and i == 500:
                w.destroy(b)
                b = w.add_object(m.Buffer(size=4096, device=dev))


def test_folded_operations_stand_for_their_equals(tmp_path):
    path = tmp_path / "fold.kreplay"
    _capture(path, destroy=True)
    with replayfmt.open(path) as cap:
        every = list(cap.iter_operations())
        folded = list(cap.distinct_operations())
    assert sum(n for _, n in folded) == len(every)
    events = (m.EventRecord, m.StreamWaitEvent, m.EventSynchronize)
    kept = [op for op in every if not isinstance(op, events)]
    folded_kept = [op for op, _ in folded if not isinstance(op, (*events, EventUses))]
    assert len(folded_kept) < len(kept) / 2  # launches, copies, memsets alike come once
    # each use of an event comes, in order, apart (the batch with the destroy) or as columns
    uses = [u for item, _ in folded for u in (item.operations() if isinstance(item, EventUses) else [item])]
    assert [op for op in every if isinstance(op, events)] == [op for op in uses if isinstance(op, events)]
    assert any(isinstance(item, EventUses) for item, _ in folded)
    assert all(n == len(item) for item, n in folded if isinstance(item, EventUses))
    assert [op.index for op, _ in folded] == sorted(op.index for op, _ in folded)
    by_index = {op.index: op for op in every}
    for op, _ in folded:
        if isinstance(op, EventUses):
            assert by_index[op.index] == op.operations()[0]  # it sits where its first use is
        else:
            assert by_index[op.index] == op  # each one is the operation at its index
    # every operation is one of the folded ones (checked once) or stands for itself
    keys = {repeat_key(op) for op in uses}
    assert all(repeat_key(op) in keys or repeat_key(op) is None for op in every)


def test_the_folded_plan_is_the_plan_of_every_operation(tmp_path):
    path = tmp_path / "fold.kreplay"
    _capture(path, destroy=False)
    with replayfmt.open(path) as cap:
        folded = build_plan(cap, PlanOptions(continue_on_error=True))
        launches = [op for op in cap.iter_operations() if isinstance(op, m.Launch)]
    with replayfmt.open(path) as cap:  # a --launch override makes the plan walk every operation
        first = launches[0]
        override = LaunchOverride.parse(f"{first.index}:grid={','.join(map(str, first.grid))}")
        each = build_plan(cap, PlanOptions(continue_on_error=True, launch_overrides=(override,)))
    assert folded.problems == each.problems == []
    assert folded.operation_counts == each.operation_counts
    assert folded.operation_counts["create"] > 50 and folded.operation_counts["stream_wait_event"] > 10
    assert folded.event_spans == each.event_spans  # bulk (columns) and one by one alike
    assert folded.checkpoint_regions == each.checkpoint_regions and folded.state.keys() == each.state.keys()
    assert folded.launches_of == each.launches_of == {(6, 0): len(launches)}
    assert folded.uploads.keys() == each.uploads.keys()


def test_a_bad_use_among_a_batch_of_event_uses_is_named(tmp_path):
    """Uses of events are checked in bulk; one that fails is named as the one-by-one check names it:
    a record of a buffer, a wait on a stream that is an event, a synchronisation of an event a
    destroy in an earlier batch took away."""
    cases = {
        "buffer": "operation {at} (event_record): its event object {bad} is a buffer, not a event",
        "stream": "operation {at} (stream_wait_event): its stream object {bad} is a event, not a stream",
        "destroyed": "operation {at} (event_synchronize): its event object {bad} was destroyed by operation",
    }
    for case, message in cases.items():
        path = tmp_path / f"{case}.kreplay"
        with replayfmt.CaptureWriter(path, threads=0, batch_operations=64) as w:
            dev = w.add_object(m.Device(name="d"))
            s1, buf = w.add_object(m.Stream(device=dev)), w.add_object(m.Buffer(size=64, device=dev))
            gone = w.add_object(m.Event(device=dev))
            w.destroy(gone)
            for _ in range(100):
                w.event_record(w.add_object(m.Event(device=dev)), s1)
            ev = w.add_object(m.Event(device=dev))
            if case == "buffer":
                bad, at = buf, w.event_record(buf, s1)
            elif case == "stream":
                bad, at = ev, w.stream_wait_event(ev, ev)
            else:
                bad, at = gone, w.event_synchronize(gone)
            for _ in range(20):
                w.event_record(w.add_object(m.Event(device=dev)), s1)
        with replayfmt.open(path) as cap:
            assert any(isinstance(item, EventUses) for item, _ in cap.distinct_operations())
            plan = build_plan(cap, PlanOptions(continue_on_error=True))
        expected = message.format(at=at, bad=bad)
        assert [p for p in plan.problems if p.startswith(expected)], (case, plan.problems)


def test_a_failing_batch_of_event_uses_is_checked_in_capture_order(tmp_path):
    """When a batch's uses of events fail the bulk check, each is checked in its place among the
    batch's other operations: the first problem is the first operation that has one."""
    path = tmp_path / "order.kreplay"
    with replayfmt.CaptureWriter(path, threads=0, batch_operations=64) as w:
        dev = w.add_object(m.Device(name="d"))
        s1, buf = w.add_object(m.Stream(device=dev)), w.add_object(m.Buffer(size=64, device=dev))
        ev = w.add_object(m.Event(device=dev))
        w.event_record(ev, s1)
        first = w.stream_synchronize(buf)  # a buffer taken for a stream
        second = w.event_synchronize(buf)  # a buffer taken for an event
        w.event_record(ev, s1)
    with replayfmt.open(path) as cap:
        plan = build_plan(cap, PlanOptions(continue_on_error=True))
        with pytest.raises(replayfmt.ReplayFormatError, match=f"operation {first} "):
            build_plan(cap)
    assert [p.split(" ")[1] for p in plan.problems] == [str(first), str(second)]
    assert plan.event_spans[ev][:2] == [first - 1, second + 1]


def _distinct_rows_by_bytes(keys: np.ndarray) -> tuple[list[int], list[int]]:
    """The reference: each distinct row's first index and count, by a dict over the rows' bytes."""
    first: dict[bytes, int] = {}
    counts: dict[bytes, int] = {}
    for i, row in enumerate(keys):
        key = row.tobytes()
        first.setdefault(key, i)
        counts[key] = counts.get(key, 0) + 1
    return list(first.values()), [counts[k] for k in first]


def test_rows_whose_hashes_collide_are_still_told_apart(monkeypatch):
    """With a hash that sends every row to one value (a multiplier of 0), the rows are told apart
    by their bytes all the same: the collision is found and the rows sorted as bytes."""
    import replayfmt.container.distinct_rows as module

    keys = np.array([[1, 0], [0, 1], [1, 0], [5, 6], [6, 5], [0, 1]], dtype="<u8")
    expected = ([0, 1, 3, 4], [2, 2, 1, 1])
    first, counts = distinct_rows(keys)
    assert (first.tolist(), counts.tolist()) == _distinct_rows_by_bytes(keys) == expected
    monkeypatch.setattr(module, "_HASH_MULTIPLIER", np.uint64(0))
    first, counts = distinct_rows(keys)
    assert (first.tolist(), counts.tolist()) == expected


@settings(max_examples=200, deadline=None)
@given(
    rows=st.integers(0, 300),
    width=st.sampled_from([4, 8, 12, 16, 40, 160]),
    values=st.integers(1, 4),
    seed=st.integers(0, 2**32 - 1),
)
def test_distinct_rows_equal_a_walk_over_their_bytes(rows, width, values, seed):
    """Few distinct byte values make many equal rows, and (for widths of several words) rows
    whose hashes may collide: first rows and counts equal a dict's over the rows' bytes."""
    keys = np.random.default_rng(seed).integers(0, values, size=(rows, width), dtype=np.uint8)
    first, counts = distinct_rows(keys)
    assert (first.tolist(), counts.tolist()) == _distinct_rows_by_bytes(keys)
