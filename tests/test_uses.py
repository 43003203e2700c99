"""The one table of what each operation kind touches (replayfmt.format.uses): every kind has a
row, and a capture that uses every operation kind (written by the real writer) reads back with
the buffers, executables, events, streams and graphs each operation names."""

from __future__ import annotations

from samples import write_sample

import replayfmt
from replayfmt.format import model as m
from replayfmt.format.enums import OperationKind
from replayfmt.format.uses import USES, Uses, uses


def test_every_operation_kind_has_a_row():
    assert set(USES) == set(OperationKind)


def test_what_each_operation_of_a_real_capture_touches(tmp_path):
    ids = write_sample(tmp_path / "s.kreplay")
    with replayfmt.open(tmp_path / "s.kreplay") as cap:
        ops = list(cap.iter_operations())
    seen = {op.kind for op in ops}
    assert seen >= set(OperationKind) - {OperationKind.NONE}  # the sample holds every kind
    x, y, exe, event = ids["x"], ids["y"], ids["exe"], ids["event"]
    by_kind: dict[OperationKind, Uses] = {}
    for op in ops:
        by_kind.setdefault(op.kind, uses(op))
    launch = by_kind[OperationKind.LAUNCH]
    assert launch.buffers == launch.writes == {x, y} and launch.executables == {exe} and launch.module_globals
    assert by_kind[OperationKind.COPY_HOST_TO_DEVICE].writes == by_kind[OperationKind.COPY_HOST_TO_DEVICE].buffers
    d2d = by_kind[OperationKind.COPY_DEVICE_TO_DEVICE]
    assert d2d.buffers == {x, y} and d2d.writes == {x}
    d2h = by_kind[OperationKind.COPY_DEVICE_TO_HOST]
    assert d2h.buffers == {y} and d2h.writes == frozenset()
    assert by_kind[OperationKind.CHECKPOINT] == Uses(checked=frozenset({y}))  # read back, no device work
    assert by_kind[OperationKind.EVENT_RECORD].events == {event}
    assert by_kind[OperationKind.STREAM_WAIT_EVENT].streams == {ids["stream2"]}
    assert by_kind[OperationKind.GRAPH_LAUNCH].graphs == {ids["graph"]}
    load = Uses(executables=frozenset({exe}), devices=frozenset({ids["device"]}), module_globals=True)
    assert by_kind[OperationKind.MODULE_LOAD] == load
    assert by_kind[OperationKind.DEVICE_SYNCHRONIZE].devices == {ids["device"]}
    summed = by_kind[OperationKind.COLLECTIVE]  # sent and received in place
    assert summed.buffers == summed.writes == {y} and summed.streams == {ids["stream"]}
    everything = set().union(*(uses(op).ids() for op in ops))  # what dump-replay --object finds
    assert {x, y, exe, event, ids["stream"], ids["stream2"], ids["graph"], ids["device"]} <= everything
    assert by_kind[OperationKind.DESTROY_OBJECT].objects == {event}
    assert uses(m.ScopeBegin(0, "step")) == Uses() == uses(m.UnknownOperation(0, 99))
