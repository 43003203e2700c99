"""A capture's events kept as columns (replayfmt.format.object_columns): what the reader and the
plan see of them equals the model objects the writer was given, whether asked for one by one, by
walking a batch or in bulk, and destroyed events are gone from the plan's live objects."""

from __future__ import annotations

import numpy as np
import pytest

import replayfmt
from replayfmt.errors import ReplayFormatError
from replayfmt.format import model as m, records
from replayfmt.format.object_columns import EventTable, ObjectList, ObjectTable
from replayfmt.replay.plan import build_plan
from replayfmt.replay.plan_checks import LiveObjects


def _capture(path) -> list[m.ObjectDef]:
    """Events on two devices among streams and buffers, over many batches; the objects written."""
    written: list[m.ObjectDef] = []
    with replayfmt.CaptureWriter(path, threads=0, batch_operations=32) as w:
        devices = [w.add_object(m.Device(name=f"d{k}", ordinal=k)) for k in range(2)]
        written += [m.Device(id=d, name=f"d{k}", ordinal=k) for k, d in enumerate(devices)]
        for i in range(300):
            device = devices[i % 7 == 0]
            if i % 50 == 0:
                written.append(m.Stream(id=w.add_object(m.Stream(device=device)), device=device))
            if i % 60 == 0:
                buffer = m.Buffer(size=256, device=device)
                written.append(m.Buffer(id=w.add_object(buffer), size=256, device=device))
            event = w.add_object(m.Event(device=device, flags=i % 3))
            written.append(m.Event(id=event, device=device, flags=i % 3))
            w.event_record(event, 0)
    return written


def test_objects_read_one_by_one_in_order_and_by_id_are_those_written(tmp_path):
    path = tmp_path / "c.kreplay"
    written = _capture(path)
    with replayfmt.open(path) as capture:
        assert capture.batch_count > 5
        assert [capture.object(o.id) for o in reversed(written)] == written[::-1]  # one by one first
    with replayfmt.open(path) as capture:
        assert list(capture.objects()) == written  # a batch walked
    with replayfmt.open(path) as capture:
        table = capture.object_table()  # in bulk: no event made
        events = [o for o in written if isinstance(o, m.Event)]
        assert table.events.ids.tolist() == [e.id for e in events]
        assert table.events.devices.tolist() == [e.device for e in events]
        assert table.events.flags.tolist() == [e.flags for e in events]
        assert list(table.others.values()) == [o for o in written if not isinstance(o, m.Event)]
        assert len(table) == len(written) == capture.object_count
        assert [table[o.id] for o in written] == written
        assert table.events.device_ids() == [written[0].id, written[1].id]
        picked = np.array([events[5].id, events[7].id, events[0].id])
        assert table.events.devices_of(picked).tolist() == [events[5].device, events[7].device, events[0].device]
        assert table.events.holds(np.array([events[3].id, written[0].id, 10**6])).tolist() == [True, False, False]
        assert table.get(10**6) is None and 10**6 not in table and written[0].id not in table.events
        # and the plan takes them so
        plan = build_plan(capture)
        assert plan.events.ids.tolist() == [e.id for e in events]
        assert [plan.events.device(e.id) for e in events] == [e.device for e in events]


def test_an_event_table_refuses_columns_that_disagree():
    with pytest.raises(ValueError, match="increase"):
        EventTable([3, 2], [0, 0], [0, 0])
    with pytest.raises(ValueError, match="length"):
        EventTable([1, 2], [0], [0, 0])
    table = EventTable.concatenate([EventTable([1, 2], [0, 0], [0, 1]), EventTable.empty(), EventTable([5], [1], [2])])
    assert dict(table) == {
        1: m.Event(id=1, device=0, flags=0),
        2: m.Event(id=2, device=0, flags=1),
        5: m.Event(id=5, device=1, flags=2),
    }
    with pytest.raises(KeyError):
        table.device(3)
    assert len(EventTable.concatenate([])) == 0


def test_destroyed_events_are_gone_from_the_live_objects():
    stream = m.Stream(id=1)
    live = LiveObjects(ObjectTable({1: stream}, EventTable([2, 3, 4], [0, 0, 0], [0, 0, 0])))
    assert live.is_stream(1) and not live.is_stream(2) and live.is_event(3) and not live.is_event(1)
    assert live.all_events(np.array([2, 3, 4])) and not live.all_events(np.array([1, 2]))
    assert len(live) == 4 and list(live) == [1, 2, 3, 4]
    live.destroy(m.DestroyObject(7, 3))
    assert not live.is_event(3) and 3 not in live and live.get(3) is None
    assert not live.all_events(np.array([2, 3])) and live.all_events(np.array([2, 4]))
    assert len(live) == 3 and list(live) == [1, 2, 4]
    assert live.missing(3) == "object 3 was destroyed by operation 7"
    with pytest.raises(ReplayFormatError, match="destroyed already by operation 7"):
        live.destroy(m.DestroyObject(8, 3))
    with pytest.raises(ReplayFormatError, match="object 9 does not exist"):
        live.destroy(m.DestroyObject(9, 9))
    live.destroy(m.DestroyObject(10, 1))
    assert not live.is_stream(1) and live[2] == m.Event(id=2)


@pytest.mark.parametrize("ids", [(2, 1, 3), (1, 1, 3), (1, 2, 4)])
def test_events_out_of_sequence_are_a_format_error_naming_the_batch(tmp_path, ids):
    """A batch whose event ids are swapped, repeated or skip one is refused with the reader's
    one-line error at the batch's offset, by the plan and by a walk of the objects alike."""
    from craft import FileBuilder, record_batch

    fb = FileBuilder()
    events = [m.Event(id=i, device=0) for i in ids]
    create = np.array([(1, 0)], dtype=records.dtype("IdOperationRecord"))
    body = record_batch(objects=events, kinds=bytes([m.OperationKind.CREATE_OBJECT]), id_operations=create)
    offset = fb.batch(body, 0, 1, objs=3)
    path = fb.finish(tmp_path / "swapped.kreplay")
    refused = rf"offset {offset}: .*out of sequence"
    for read in (lambda cap: list(cap.objects()), build_plan, lambda cap: cap.object_table()):
        with replayfmt.open(path) as capture, pytest.raises(ReplayFormatError, match=refused):
            read(capture)


def test_labelled_events_keep_their_labels_in_every_view(tmp_path):
    path = tmp_path / "labels.kreplay"
    with replayfmt.CaptureWriter(path, threads=0) as w:
        dev = w.add_object(m.Device(name="d"))
        plain = w.add_object(m.Event(device=dev))
        named = w.add_object(m.Event(device=dev, label="step end"))
    with replayfmt.open(path) as capture:
        table = capture.object_table()
        assert table[named].label == capture.object(named).label == "step end"
        assert table[plain].label == "" and table.events.made()[1].label == "step end"
        assert [o.label for o in capture.objects()] == ["", "", "step end"]


def test_one_event_asked_for_is_made_alone():
    stream = m.Stream(id=1)
    objects = ObjectList([stream, None, None], [1, 2, 3], EventTable([2, 3], [0, 0], [1, 2]), [1, 2])
    assert objects[2] == objects[-1] == m.Event(id=3, flags=2) and objects[0] is stream
    assert objects[1] is not objects[1]  # made when asked for, not kept
    assert objects.others == [stream] and len(objects) == 3
    assert list(objects) == [stream, m.Event(id=2, flags=1), m.Event(id=3, flags=2)]
    assert objects[1] is objects[1]  # walked: every event made, and kept


def test_event_table_lookups_at_and_past_its_ends():
    table = EventTable([3, 5, 9], [0, 1, 0], [0, 0, 0])
    assert table.holds(np.array([0, 3, 4, 9, 10])).tolist() == [False, True, False, True, False]
    assert EventTable.empty().holds(np.array([1, 2])).tolist() == [False, False]
    assert table.devices_of(np.array([9, 5])).tolist() == [0, 1]
    with pytest.raises(KeyError):
        table.devices_of(np.array([5, 6]))
    assert "3" not in table and 3 in table and np.int64(5) in table
