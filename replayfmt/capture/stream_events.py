"""The program's streams and events as the capture's Stream and Event objects: which object each
handle is, on which device, and the records, waits and synchronisations between them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from replayfmt.capture import events as ev
from replayfmt.format import model as m

if TYPE_CHECKING:
    from replayfmt.capture.device_objects import DeviceObjects
    from replayfmt.capture.regions import Region
    from replayfmt.writer import CaptureWriter

_DEFAULT_STREAMS = (0, 1, 2)  # 0, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD
_NON_BLOCKING = 1  # CU_STREAM_NON_BLOCKING


class Streams:
    """Stream and Event objects by the program's handles, each written the first time an
    operation needs it (with the flags and priority its creation gave it, on the device the
    program works on then); the stream and event operations of the open region."""

    def __init__(self, writer: CaptureWriter, devices: DeviceObjects, region: Region) -> None:
        self._writer = writer
        self._devices = devices
        self._region = region
        self._streams: dict[int, int] = {}  # handle (or a device's default stream key) -> object id
        self._created: dict[int, ev.StreamCreated] = {}
        self._events: dict[int, int] = {}
        self._event_flags: dict[int, int] = {}

    def on_stream_created(self, event: ev.StreamCreated) -> None:
        self._created[event.handle] = event
        self._streams.pop(event.handle, None)  # a reused handle is a new stream

    def on_event_created(self, event: ev.EventCreated) -> None:
        self._event_flags[event.handle] = event.flags
        self._events.pop(event.handle, None)

    def on_event_recorded(self, event: ev.EventRecorded) -> None:
        if self._region.recording:
            self._writer.event_record(self.event(event.event), self.stream(event.stream))

    def on_stream_waited(self, event: ev.StreamWaited) -> None:
        if self._region.recording:
            self._writer.stream_wait_event(self.stream(event.stream), self.event(event.event))

    def on_stream_synchronized(self, event: ev.StreamSynchronized) -> None:
        if self._region.recording:
            self._writer.stream_synchronize(self.stream(event.stream))

    def on_context_synchronized(self, event: ev.ContextSynchronized) -> None:
        if self._region.recording:
            self._writer.device_synchronize(self._devices.current)

    def on_event_synchronized(self, event: ev.EventSynchronized) -> None:
        if self._region.recording:
            self._writer.event_synchronize(self.event(event.event))

    def on_host_function(self, event: ev.HostFunction) -> None:
        if self._region.recording:
            self._writer.host_function(self.stream(event.stream))

    def blocking(self, handle: int) -> bool:
        """Whether the program's stream ``handle`` synchronises with the legacy default stream (a
        default stream, or one created without CU_STREAM_NON_BLOCKING, or one made before the
        recorder saw it: the driver's default)."""
        if handle in _DEFAULT_STREAMS:
            return True
        created = self._created.get(handle)
        return created is None or not created.flags & _NON_BLOCKING

    def stream(self, handle: int) -> int:
        """The Stream object of the program's stream ``handle``."""
        key = handle
        if handle in _DEFAULT_STREAMS and (key := self._devices.default_stream_key()) is None:
            return 0  # the default stream of the device recording began on
        sid = self._streams.get(key)
        if sid is None:
            info = self._created.get(key, ev.StreamCreated(handle))
            sid = self._streams[key] = self._writer.add_object(
                m.Stream(device=self._devices.current, flags=info.flags, priority=info.priority, captured_handle=handle)
            )
        return sid

    def event(self, handle: int) -> int:
        """The Event object of the program's event ``handle``."""
        eid = self._events.get(handle)
        if eid is None:
            flags = self._event_flags.get(handle, 0)
            eid = self._events[handle] = self._writer.add_object(m.Event(device=self._devices.current, flags=flags))
        return eid
