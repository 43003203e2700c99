"""The plan checks each distinct operation once (``Capture.distinct_operations``): what it folds
away must equal what stands for it in all but index and parameter values, the counts must add
up, and the verdict must be the one an operation-by-operation walk gives."""

from __future__ import annotations

import struct

import numpy as np

import replayfmt
from replayfmt.format import model as m
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
            else:
                w.event_record(ev, s1)
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
    folded_kept = [op for op, _ in folded if not isinstance(op, events)]
    assert len(folded_kept) < len(kept) / 2  # launches, copies, memsets alike come once
    # each use of an event comes apart: the plan keeps the span of operations an event is used in
    assert [op for op in every if isinstance(op, events)] == [op for op, _ in folded if isinstance(op, events)]
    assert [op.index for op, _ in folded] == sorted(op.index for op, _ in folded)
    by_index = {op.index: op for op in every}
    for op, _ in folded:
        assert by_index[op.index] == op  # each one is the operation at its index
    # every operation is one of the folded ones (checked once) or stands for itself
    keys = {repeat_key(op) for op, n in folded}
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
    assert folded.launches_of == each.launches_of == {(6, 0): len(launches)}
    assert folded.uploads.keys() == each.uploads.keys()
