"""The translator's handling of streams, events and synchronisation: which stream and event
objects the program's handles are, on which device, and the records, waits and synchronisations
between them (a mixin of :class:`~replayfmt.capture.translate.Translator`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from replayfmt.capture import events as ev
from replayfmt.format import model as m

if TYPE_CHECKING:
    from replayfmt.capture.device_objects import DeviceObjects
    from replayfmt.writer import CaptureWriter

_DEFAULT_STREAMS = (0, 1, 2)  # 0, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD


class StreamEvents:
    """Stream and event handlers; the translator provides the attributes declared here."""

    writer: CaptureWriter
    devices: DeviceObjects
    _recording: bool
    _streams: dict[int, int]
    _stream_info: dict[int, ev.StreamCreated]
    _events: dict[int, int]
    _event_flags: dict[int, int]

    def _on_stream_created(self, event: ev.StreamCreated) -> None:
        self._stream_info[event.handle] = event
        self._streams.pop(event.handle, None)  # a reused handle is a new stream

    def _on_event_created(self, event: ev.EventCreated) -> None:
        self._event_flags[event.handle] = event.flags
        self._events.pop(event.handle, None)

    def _on_event_recorded(self, event: ev.EventRecorded) -> None:
        if self._recording:
            self.writer.event_record(self._event(event.event), self._stream(event.stream))

    def _on_stream_waited(self, event: ev.StreamWaited) -> None:
        if self._recording:
            self.writer.stream_wait_event(self._stream(event.stream), self._event(event.event))

    def _on_stream_synchronized(self, event: ev.StreamSynchronized) -> None:
        if self._recording:
            self.writer.stream_synchronize(self._stream(event.stream))

    def _on_context_synchronized(self, event: ev.ContextSynchronized) -> None:
        if self._recording:
            self.writer.device_synchronize(self.devices.current)

    def _on_event_synchronized(self, event: ev.EventSynchronized) -> None:
        if self._recording:
            self.writer.event_synchronize(self._event(event.event))

    def _on_host_function(self, event: ev.HostFunction) -> None:
        if self._recording:
            self.writer.host_function(self._stream(event.stream))

    def _stream(self, handle: int) -> int:
        key = handle
        if handle in _DEFAULT_STREAMS and (key := self.devices.default_stream_key()) is None:
            return 0  # the default stream of the device recording began on
        sid = self._streams.get(key)
        if sid is None:
            info = self._stream_info.get(key, ev.StreamCreated(handle))
            sid = self._streams[key] = self.writer.add_object(
                m.Stream(device=self.devices.current, flags=info.flags, priority=info.priority, captured_handle=handle)
            )
        return sid

    def _event(self, handle: int) -> int:
        eid = self._events.get(handle)
        if eid is None:
            flags = self._event_flags.get(handle, 0)
            eid = self._events[handle] = self.writer.add_object(m.Event(device=self.devices.current, flags=flags))
        return eid
