"""The capture's Device objects: one for each device the program worked on, and which one the
event being translated runs on (the device of the calling thread's context, which the CUPTI
source announces with :class:`~replayfmt.capture.events.DeviceChanged` whenever it changes)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from replayfmt.format import model as m

if TYPE_CHECKING:
    from replayfmt.writer import CaptureWriter


class DeviceObjects:
    """Device object ids by device ordinal, written as the program first works on each device."""

    def __init__(self, writer: CaptureWriter, first: m.Device) -> None:
        self._writer = writer
        self._ids = {first.ordinal: writer.add_object(first)}
        self._first = first.ordinal
        self.current_ordinal = first.ordinal

    @property
    def current(self) -> int:
        """The object id of the device the program works on now."""
        return self._ids[self.current_ordinal]

    @property
    def several(self) -> bool:
        """Whether the program worked on more than one device so far."""
        return len(self._ids) > 1

    def now(self) -> int:
        """The ordinal of the device the program works on now."""
        return self.current_ordinal

    def default_stream_key(self) -> int | None:
        """None on the first device, whose default stream is the capture's stream 0; on another
        device, the key its default stream is known by: it is written as a stream of that device
        (replay runs it on a blocking stream there), so its work and its waits stay on it."""
        if self.current_ordinal == self._first:
            return None
        return -1 - self.current_ordinal  # never a stream handle

    def switch(self, device: m.Device) -> None:
        """The events that follow run on ``device``."""
        if device.ordinal not in self._ids:
            self._ids[device.ordinal] = self._writer.add_object(device)
        self.current_ordinal = device.ordinal

    def of(self, ordinal: int) -> int:
        """The object id of device ``ordinal`` (-1: the current device). A device whose memory the
        program reached before any of its calls ran there is written with its ordinal alone."""
        if ordinal < 0:
            return self.current
        found = self._ids.get(ordinal)
        if found is None:
            found = self._ids[ordinal] = self._writer.add_object(m.Device(ordinal=ordinal, name=f"cuda:{ordinal}"))
        return found
