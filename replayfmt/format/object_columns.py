"""A capture's objects with its events kept as columns.

A program may make an event per launch (225,850 of them in a capture of Triton's persistent-matmul
tutorial), and a replay needs only their ids, devices and flags, in bulk: an Event object each
cost the host about a third of its time to open and plan such a capture. Here events stay as
columns, and one is made only where it is asked for (by id, or by walking a batch's objects).

- :class:`EventTable`: events by id, as columns;
- :class:`ObjectList`: one record batch's objects in order (what the reader keeps per batch);
- :class:`ObjectTable`: every object of a capture by id, events in one EventTable (the plan's).
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import compress, repeat
from typing import Any, overload

import numpy as np

from replayfmt.format import model as m


class EventTable(Mapping[int, m.Event]):
    """Events by id: ``ids`` (increasing), ``devices`` and ``flags``, one row each, and the
    ``labels`` of the few that have one."""

    __slots__ = ("_devices", "_rows", "devices", "flags", "ids", "labels")

    def __init__(
        self,
        ids: Sequence[int],
        devices: Sequence[int],
        flags: Sequence[int],
        labels: Mapping[int, str] | None = None,
        *,
        check: bool = True,
    ) -> None:
        """``check=False``: the ids were read from a file whose reader checks them itself (the
        batch's objects in sequence, an error naming the batch), after making the table."""
        self.ids = np.asarray(ids, dtype=np.int64)
        self.devices = np.asarray(devices, dtype=np.int64)
        self.flags = np.asarray(flags, dtype=np.int64)
        self.labels = dict(labels or {})
        if not len(self.ids) == len(self.devices) == len(self.flags):
            raise ValueError("an event table's columns differ in length")
        if check and len(self.ids) > 1 and not bool((self.ids[1:] > self.ids[:-1]).all()):
            raise ValueError("an event table's ids must increase")
        self._rows: dict[int, int] | None = None  # id -> row, for lookups one by one: made when first needed
        self._devices: list[int] | None = None  # the devices column as a list, for the same

    @classmethod
    def empty(cls) -> EventTable:
        """A table of no events."""
        return cls((), (), ())

    @classmethod
    def concatenate(cls, tables: Iterable[EventTable]) -> EventTable:
        """One table of ``tables`` in order (their ids increasing from each to the next)."""
        parts = list(tables)
        if not parts:
            return cls.empty()
        labels = {k: v for t in parts for k, v in t.labels.items()}
        columns = (np.concatenate([getattr(t, name) for t in parts]) for name in ("ids", "devices", "flags"))
        return cls(*columns, labels)

    def _row(self, event_id: object) -> int:
        """The row of ``event_id``, or -1."""
        rows = self._rows
        if rows is None:  # (a steps' build asks for the device of each event it records: 200k)
            rows = self._rows = dict(zip(self.ids.tolist(), range(len(self.ids))))
        return rows.get(event_id, -1)  # type: ignore[call-overload]

    def __getitem__(self, event_id: int) -> m.Event:
        i = self._row(event_id)
        if i < 0:
            raise KeyError(event_id)
        return self._event(i)

    def _event(self, i: int) -> m.Event:
        """The event of row ``i``."""
        eid = int(self.ids[i])
        return m.Event(id=eid, label=self.labels.get(eid, ""), device=int(self.devices[i]), flags=int(self.flags[i]))

    def __contains__(self, event_id: object) -> bool:
        return self._row(event_id) >= 0

    def __iter__(self) -> Iterator[int]:
        return iter(self.ids.tolist())

    def __len__(self) -> int:
        return len(self.ids)

    def device(self, event_id: int) -> int:
        """The device id of event ``event_id`` (KeyError: no such event)."""
        i = self._row(event_id)
        if i < 0:
            raise KeyError(event_id)
        devices = self._devices
        if devices is None:  # (a list: a steps' build asks this for each event it records, 200k)
            devices = self._devices = self.devices.tolist()
        return devices[i]

    def device_ids(self) -> list[int]:
        """The devices the events are on, each once, in order."""
        if not len(self.devices) or bool((self.devices == self.devices[0]).all()):  # (one device: the usual case)
            return self.devices[:1].tolist()
        return sorted(set(self.devices.tolist()))

    def devices_of(self, event_ids: np.ndarray) -> np.ndarray:
        """The device id of each of ``event_ids``; KeyError where one is no event of this table."""
        if not bool(self.holds(event_ids).all()):
            raise KeyError(int(np.asarray(event_ids)[~self.holds(event_ids)][0]))
        return self.devices[np.searchsorted(self.ids, event_ids)]

    def holds(self, event_ids: np.ndarray) -> np.ndarray:
        """Whether each of ``event_ids`` is an event of this table."""
        event_ids = np.asarray(event_ids, dtype=np.int64)
        at = np.minimum(np.searchsorted(self.ids, event_ids), max(len(self.ids) - 1, 0))
        return (self.ids[at] == event_ids) if len(self.ids) else np.zeros(len(event_ids), dtype=bool)

    def made(self) -> list[m.Event]:
        """Every event as a model object, in order of id."""
        events = m.unlabelled_events(self.ids.tolist(), self.devices.tolist(), self.flags.tolist())
        for i in np.flatnonzero(np.isin(self.ids, list(self.labels))).tolist() if self.labels else ():
            events[i] = self._event(i)
        return events


class ObjectList(Sequence[m.ObjectDef]):
    """One record batch's objects in order. ``others``: those that are not events, made when the
    batch was decoded; ``events``: its events as columns, made into objects when one is first
    asked for by position or the list is walked (then kept)."""

    __slots__ = ("_made", "event_positions", "events", "ids", "others")

    def __init__(
        self, made: list[m.ObjectDef | None], ids: list[int], events: EventTable, event_positions: list[int]
    ) -> None:
        self._made = made  # None where an event is not made yet
        self.ids = ids  # every object's id, in order
        self.events = events
        self.event_positions = event_positions  # where events[k] lies in the list
        # what is made before any event is: the others (picked in C: a batch may hold 3k events)
        self.others = list(compress(made, map(operator.is_not, made, repeat(None))))

    @classmethod
    def of(cls, objects: list[m.ObjectDef]) -> ObjectList:
        """The list of objects already made (events among them: kept as columns like any batch's)."""
        positions = [k for k, o in enumerate(objects) if type(o) is m.Event]
        events: list[Any] = [objects[k] for k in positions]
        labels = {e.id: e.label for e in events if e.label}
        table = EventTable(
            [e.id for e in events], [e.device for e in events], [e.flags for e in events], labels, check=False
        )
        made: list[m.ObjectDef | None] = list(objects)
        for k in positions:
            made[k] = None
        return cls(made, [o.id for o in objects], table, positions)

    def _complete(self) -> list[m.ObjectDef]:
        made = self._made
        if self.event_positions and made[self.event_positions[0]] is None:
            for k, event in zip(self.event_positions, self.events.made(), strict=True):
                made[k] = event
        return made  # type: ignore[return-value]

    def __len__(self) -> int:
        return len(self._made)

    @overload
    def __getitem__(self, k: int) -> m.ObjectDef: ...
    @overload
    def __getitem__(self, k: slice) -> list[m.ObjectDef]: ...
    def __getitem__(self, k: int | slice) -> m.ObjectDef | list[m.ObjectDef]:
        if isinstance(k, slice):
            return self._complete()[k]
        obj = self._made[k]
        if obj is not None:
            return obj
        k = k + len(self._made) if k < 0 else k  # one event asked for: only it is made (not kept)
        return self.events._event(bisect.bisect_left(self.event_positions, k))

    def __iter__(self) -> Iterator[m.ObjectDef]:
        return iter(self._complete())


class ObjectTable(Mapping[int, m.ObjectDef]):
    """Every object of a capture by id: ``others`` (those that are not events) as objects, and
    ``events`` as one EventTable. Iterated, it gives the others' ids, then the events'; its
    ``values()`` and ``items()`` make every event (the plan uses neither)."""

    __slots__ = ("events", "others")

    def __init__(self, others: dict[int, m.ObjectDef], events: EventTable) -> None:
        self.others = others
        self.events = events

    @classmethod
    def gather(cls, batches: Iterable[ObjectList]) -> ObjectTable:
        """The table of every batch's objects."""
        others: dict[int, m.ObjectDef] = {}
        tables = []
        for objects in batches:
            others.update((o.id, o) for o in objects.others)
            tables.append(objects.events)
        return cls(others, EventTable.concatenate(tables))

    def __getitem__(self, object_id: int) -> m.ObjectDef:
        obj = self.others.get(object_id)
        return obj if obj is not None else self.events[object_id]

    def get(self, object_id: int, default: Any = None) -> Any:
        obj = self.others.get(object_id)
        if obj is not None:
            return obj
        return self.events.get(object_id, default)

    def __contains__(self, object_id: object) -> bool:
        return object_id in self.others or object_id in self.events

    def __iter__(self) -> Iterator[int]:
        yield from self.others
        yield from self.events

    def __len__(self) -> int:
        return len(self.others) + len(self.events)
