"""Streams and events for a replay: every captured stream and event rebuilt on its device, a
stand-in for the default stream of each device after the first, and the timing stream that a
run forks from and joins back to (so that a run's device time covers every captured stream)."""

from __future__ import annotations

from typing import Any

import numpy as np

from replayfmt.cuda.driver import check
from replayfmt.replay.devices import Devices
from replayfmt.replay.event_sharing import ShareableSpans, share_events
from replayfmt.replay.plan import Plan

_NON_BLOCKING = 1  # CU_STREAM_NON_BLOCKING, the only captured stream flag that matters here


class Streams:
    """The replay's streams and events, created by :meth:`create`."""

    def __init__(self, devices: Devices) -> None:
        self.devices = devices
        self.handles: dict[int, Any] = {}  # captured stream id -> stream (0: the first device's default)
        self.events: dict[int, Any] = {}  # captured event id -> event
        self.device_of: dict[int, int] = {}  # captured stream id -> device index
        self.defaults: list[Any] = []  # per device: where captured default-stream work runs
        self.timing: tuple[Any, Any] = (None, None)  # a run's start and end events, on the timing stream
        self._join: list[tuple[Any, Any]] = []  # (a stream the timing stream joins, an event of its device)

    @property
    def timing_stream(self) -> Any:
        return self.handles[0]

    def create(self, plan: Plan) -> None:
        devices = self.devices
        cu = devices.cu
        disable_timing = cu.CUevent_flags.CU_EVENT_DISABLE_TIMING
        # CU_STREAM_LEGACY: captured default-stream work keeps its semantics on the first device;
        # on the others it runs on a blocking stream of theirs (it waits for their legacy stream)
        self.handles[0] = cu.CUstream(1)
        self.defaults = [self.handles[0]]
        joinable: list[tuple[int, Any]] = []  # (device, stream) that the timing stream joins
        for k in range(1, len(devices.gpus)):
            devices.use(k)
            handle = check(cu.cuStreamCreate(0), f"cuda:{devices.gpus[k].ordinal}: default-stream stand-in")
            devices.own(lambda h=handle: cu.cuStreamDestroy(h))
            self.defaults.append(handle)
            joinable.append((k, handle))
        for sid, stream in plan.streams.items():
            k = self.device_of[sid] = devices.index(stream.device)
            devices.use(k)
            flags = stream.flags & _NON_BLOCKING
            handle = check(cu.cuStreamCreateWithPriority(flags, stream.priority), f"stream {sid}: cuStreamCreate")
            devices.own(lambda h=handle: cu.cuStreamDestroy(h))
            self.handles[sid] = handle
            joinable.append((k, handle))
        self._create_events(plan, disable_timing)
        for k, handle in joinable:
            devices.use(k)
            join = check(cu.cuEventCreate(disable_timing), "join event")
            devices.own(lambda h=join: cu.cuEventDestroy(h))
            self._join.append((handle, join))
        devices.use(0)
        start, end = (check(cu.cuEventCreate(0), "timing event") for _ in range(2))
        for handle in (start, end):
            devices.own(lambda h=handle: cu.cuEventDestroy(h))
        self.timing = (start, end)

    def _create_events(self, plan: Plan, flags: Any) -> None:
        """The captured events. A program may make a new event for every record (Triton's
        persistent matmul: 226k of them), so events share CUDA events: one whose uses (first
        a record, then waits and synchronisations) span operations that no other event's span
        overlaps takes a CUDA event freed by one whose span ended before it begins, which keeps
        every wait on the record it waited on (replay.event_sharing colours the spans, in bulk).
        Events of CUDA graphs, and events first waited on before any record, get their own;
        events no operation uses share one per device."""
        devices, cu = self.devices, self.devices.cu
        current: list[int] = [-1]

        def create(eid: int, k: int) -> Any:
            if current[0] != k:
                devices.use(k)
                current[0] = k
            handle = check(cu.cuEventCreate(flags), f"event {eid}: cuEventCreate")
            devices.own(lambda h=handle: cu.cuEventDestroy(h))
            return handle

        own = {node.event for graph in plan.graphs.values() for node in graph.nodes if node.event}
        events = plan.events  # as columns
        index = {d: devices.index(d) for d in events.device_ids()}  # device id -> GPU
        spans = ShareableSpans.shareable(plan.event_spans.columns(), events.ids, own)
        ids = spans.events.tolist()
        if len(index) == 1:  # one GPU (the usual case): no lookup per event
            gpus = np.full(len(ids), next(iter(index.values())), np.int64)
        else:
            gpus = np.array([index[d] for d in events.devices_of(spans.events).tolist()], np.int64)
        shared = share_events(spans.first, spans.last, gpus)
        handles = np.empty(len(shared.device), dtype=object)
        named = dict(zip(shared.colour[::-1].tolist(), ids[::-1], strict=True))  # each colour's first event
        for c, k in enumerate(shared.device):
            handles[c] = create(named[c], k)
        self.events.update(zip(ids, handles[shared.colour].tolist(), strict=True))
        unused: dict[int, Any] = {}  # device -> the CUDA event of the events no operation uses
        rest = np.setdiff1d(events.ids, spans.events, assume_unique=True)  # the few not assigned above
        for eid, device in zip(rest.tolist(), events.devices_of(rest).tolist(), strict=True):
            k = index[device]
            if eid in own or eid in plan.event_spans:
                self.events[eid] = create(eid, k)
            else:
                if k not in unused:
                    unused[k] = create(eid, k)
                self.events[eid] = unused[k]

    def stream(self, captured: int, gpu: int) -> Any:
        """The stream a captured stream id runs on (0: the default stream of device ``gpu``)."""
        return self.handles[captured] if captured else self.defaults[gpu]

    def fork(self, event: Any) -> None:
        """Record ``event`` on the timing stream and make every captured stream wait for it."""
        cu = self.devices.cu
        self.devices.use(0)
        check(cu.cuEventRecord(event, self.timing_stream), "cuEventRecord")
        for handle, _ in self._join:
            check(cu.cuStreamWaitEvent(handle, event, 0), "cuStreamWaitEvent")

    def join(self, event: Any) -> None:
        """Make the timing stream wait for every captured stream, then record ``event`` on it."""
        cu = self.devices.cu
        self.devices.use(0)
        for handle, join in self._join:
            check(cu.cuEventRecord(join, handle), "cuEventRecord")
            check(cu.cuStreamWaitEvent(self.timing_stream, join, 0), "cuStreamWaitEvent")
        check(cu.cuEventRecord(event, self.timing_stream), "cuEventRecord")
