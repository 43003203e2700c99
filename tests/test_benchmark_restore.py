"""What benchmark-replay restores before each iteration (replayfmt.measure.restore): state ranges
of buffers nothing before the region writes, whole buffers otherwise, nothing for the rest."""

from __future__ import annotations

from replayfmt.format import model as m
from replayfmt.measure.restore import Span, buffers_of, restore_spans

GiB = 1 << 30


def launch(index: int, *targets: int) -> m.Launch:
    relocations = tuple(m.Relocation(0, t, 8 * i, 0) for i, t in enumerate(targets))
    return m.Launch(index, 1, 0, 0, (1, 1, 1), (1, 1, 1), (0, 0, 0), 0, 0, bytes(8 * len(targets)), relocations)


def test_buffers_of_each_kind_of_operation():
    assert buffers_of(launch(0, 3, 4)) == {3, 4}
    copy = m.Copy(1, m.OperationKind.COPY_DEVICE_TO_DEVICE, 0, 5, 6, 0, 0, 0, 0, 0, 16)
    assert buffers_of(copy) == {5, 6}
    assert buffers_of(m.Memset(2, 0, 7, 0, 4, 0, 4)) == {7}
    assert buffers_of(m.State(3, 8, 1, 0, 16)) == {8}
    assert buffers_of(m.ScopeBegin(4, "step")) == set()


def test_an_arena_is_restored_by_its_state_ranges_alone():
    arena, output, touched_before = 2, 3, 4
    sizes = {arena: 60 * GiB, output: 1 << 20, touched_before: 4096}
    states = [
        m.State(10, arena, 1, 4 << 20, 8192),
        m.State(11, arena, 2, 1 << 20, 4096),
        m.State(12, arena, 3, (1 << 20) + 4096, 100),  # meets the one before: one copy
        m.State(13, touched_before, 4, 0, 4096),
        m.State(14, 9, 5, 0, 64),  # a buffer the region does not touch
    ]
    before = [launch(0, touched_before), m.State(13, touched_before, 4, 0, 4096), m.Memset(1, 0, 9, 0, 4, 0, 1)]
    spans = restore_spans([arena, output, touched_before], sizes, before, states)
    assert spans == [
        Span(touched_before, 0, 4096),  # written before the region: whole
        Span(arena, 1 << 20, 4196),
        Span(arena, 4 << 20, 8192),
    ]  # the output, written by the region before it reads it, needs nothing
    assert sum(s.size for s in spans) < 1 << 20


def test_with_nothing_before_the_region_every_buffer_with_whole_state_is_restored_whole():
    sizes = {2: 1000, 3: 0}
    states = [m.State(5, 2, 1, 0, 1000)]
    assert restore_spans([2, 3], sizes, [], states) == [Span(2, 0, 1000)]
    assert restore_spans([3], sizes, [m.Memset(0, 0, 3, 0, 1, 0, 0)], states) == [Span(3, 0, 1)]
