"""Which captured events share a CUDA event: spans that overlap never do, and no more CUDA
events are made than the largest overlap of each device needs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from replayfmt.replay.event_sharing import ShareableSpans, share_events


def _most_open(spans: list[tuple[int, int]]) -> int:
    """The most spans open at one operation (a span is open from its first to its last use)."""
    points = sorted({p for span in spans for p in span})
    return max((sum(b <= p <= e for b, e in spans) for p in points), default=0)


spans_strategy = st.lists(
    st.tuples(st.integers(0, 60), st.integers(0, 6), st.integers(0, 2)), min_size=0, max_size=60
).map(lambda rows: sorted((b, b + length, k) for b, length, k in rows))


@settings(max_examples=300, deadline=None)
@given(spans_strategy)
def test_overlapping_spans_never_share_and_no_more_colours_than_the_overlap(rows):
    first = np.array([b for b, _, _ in rows], np.int64)
    last = np.array([e for _, e, _ in rows], np.int64)
    device = np.array([k for _, _, k in rows], np.int64)
    shared = share_events(first, last, device)
    colour = shared.colour.tolist()
    for i, (b1, _, k1) in enumerate(rows):
        assert shared.device[colour[i]] == k1  # a colour is made on its spans' device
        for j in range(i):
            _, e0, k0 = rows[j]
            if k0 == k1 and b1 <= e0:  # sorted: span j begins first; it is open when i begins
                assert colour[i] != colour[j], (rows[j], rows[i])
    for k in {k for _, _, k in rows}:
        made = sum(1 for d in shared.device if d == k)
        assert made == _most_open([(b, e) for b, e, d in rows if d == k])


def test_a_quarter_of_a_million_record_only_events_take_one_cuda_event_per_device():
    count = 250_000
    first = np.arange(count, dtype=np.int64) * 2
    device = np.arange(count, dtype=np.int64) % 2
    shared = share_events(first, first.copy(), device)
    assert sorted(shared.device) == [0, 1]
    assert set(shared.colour[device == 0].tolist()) == {shared.device.index(0)}


def test_spans_out_of_order_are_refused():
    with pytest.raises(ValueError, match="sorted"):
        share_events(np.array([3, 1]), np.array([3, 1]), np.array([0, 0]))


def test_shareable_spans_are_those_first_recorded_of_known_events_not_used_by_graphs():
    spans = {7: [10, 12, True], 3: [10, 11, True], 4: [2, 9, False], 5: [1, 1, True], 9: [0, 3, True], 6: [4, 4, 1]}
    ids = sorted(spans)
    columns = (np.array(ids), *(np.array([spans[i][k] for i in ids]) for k in range(2)))
    columns += (np.array([bool(spans[i][2]) for i in ids]),)
    picked = ShareableSpans.shareable(columns, events=np.array([3, 4, 5, 6, 7]), own={6})
    assert picked.events.tolist() == [5, 3, 7]  # by first use, then last use; 9 is no event, 4 first waited
    assert picked.first.tolist() == [1, 10, 10] and picked.last.tolist() == [1, 11, 12]


def test_event_spans_from_uses_in_bulk_and_one_by_one_in_capture_order():
    from replayfmt.container.event_uses import EventUses
    from replayfmt.format import model as m
    from replayfmt.replay.plan_scan import EventSpans

    record, wait, sync = (
        int(k)
        for k in (m.OperationKind.EVENT_RECORD, m.OperationKind.STREAM_WAIT_EVENT, m.OperationKind.EVENT_SYNCHRONIZE)
    )
    spans = EventSpans()
    spans.add(m.StreamWaitEvent(1, 2, 40))  # waited on before any record
    kinds = np.array([record, record, wait, sync], np.uint32)
    spans.add_uses(
        EventUses.from_records(kinds, np.array([3, 4, 5, 6]), np.array([7, 8, 2, 7]), np.array([2, 2, 8, 0]))
    )
    spans.add(m.EventRecord(9, 40, 2))
    spans.add(m.EventSynchronize(11, 8))
    assert dict(spans) == {7: [3, 6, True], 8: [4, 11, True], 40: [1, 9, False]}
    assert 8 in spans and 9 not in spans and len(spans) == 3
    ids, first, last, recorded = spans.columns()
    assert ids.tolist() == [7, 8, 40] and recorded.tolist() == [True, True, False]
    assert first.tolist() == [3, 4, 1] and last.tolist() == [6, 11, 9]
    assert dict(EventSpans()) == {} and len(EventSpans().columns()[0]) == 0
