"""A record batch's uses of events as columns (``EventUses``): what the replay plan checks in bulk
instead of one record each (``container.batches.distinct_operations`` makes them)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from replayfmt.format import model as m

_EVENT_RECORD, _STREAM_WAIT_EVENT = int(m.OperationKind.EVENT_RECORD), int(m.OperationKind.STREAM_WAIT_EVENT)


@dataclass(frozen=True, slots=True)
class EventUses:
    """A record batch's uses of events (records, waits, synchronisations) in capture order, as
    columns: what a checker looks at in bulk. A program may record a new event after every launch
    (Triton's persistent matmul: 226k), and each use extends its event's span, so none is folded;
    as columns they cost no record each. ``index`` is the first use's operation index."""

    index: int
    kinds: np.ndarray  # operation kind codes (uint32)
    indices: np.ndarray  # operation indices (int64)
    events: np.ndarray  # the event each one uses
    streams: np.ndarray  # the stream a record or wait is on (0: none, an event synchronisation)

    @classmethod
    def from_records(cls, kinds: np.ndarray, indices: np.ndarray, firsts: np.ndarray, seconds: np.ndarray) -> EventUses:
        """The uses from their id-only records' columns: a wait stores (stream, event), a record
        (event, stream), a synchronisation (event, 0). ``indices`` must not be empty."""
        waits = kinds == _STREAM_WAIT_EVENT
        events = np.where(waits, seconds, firsts).astype(np.int64)
        streams = np.where(waits, firsts, seconds).astype(np.int64)
        at = indices.astype(np.int64)
        return cls(int(at[0]), kinds, at, events, streams)

    def __len__(self) -> int:
        return len(self.indices)

    def operations(self) -> list[m.Operation]:
        """The uses as model records (for a checker that names the one that fails)."""
        out: list[m.Operation] = []
        for kind, index, event, stream in zip(
            self.kinds.tolist(), self.indices.tolist(), self.events.tolist(), self.streams.tolist(), strict=True
        ):
            if kind == _EVENT_RECORD:
                out.append(m.EventRecord(index, event, stream))
            elif kind == _STREAM_WAIT_EVENT:
                out.append(m.StreamWaitEvent(index, stream, event))
            else:
                out.append(m.EventSynchronize(index, event))
        return out
