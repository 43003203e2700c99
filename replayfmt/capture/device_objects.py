"""The capture's Device objects: one for each device the program worked on, and which one the
event being translated runs on (the device of the calling thread's context, which the CUPTI
source announces with :class:`~replayfmt.capture.events.DeviceChanged` whenever it changes)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from replayfmt.format import model as m

if TYPE_CHECKING:
    from replayfmt.writer import CaptureWriter


class DeviceObjects:
    """Device object ids by device ordinal, each written when the capture first needs it. The
    program's first device is the first one it worked on (a rank that calls ``set_device(1)`` works
    on cuda:1 alone, whichever device was current when the recorder started)."""

    def __init__(self, writer: CaptureWriter, initial: m.Device) -> None:
        self._writer = writer
        self._described = {initial.ordinal: initial}
        self._ids: dict[int, int] = {}
        self._used: set[int] = set()  # devices the program's calls ran on
        self._first = self.current_ordinal = initial.ordinal

    @property
    def current(self) -> int:
        """The object id of the device the program works on now."""
        return self.of(self.current_ordinal)

    @property
    def several(self) -> bool:
        """Whether the program worked on more than one device so far."""
        return len(self._used | set(self._ids)) > 1

    def now(self) -> int:
        """The ordinal of the device the program works on now."""
        return self.current_ordinal

    def default_stream_key(self) -> int | None:
        """None while the program works on one device: its default stream is the capture's stream
        0. Once it works on several, the key each device's default stream is known by: it is
        written as a stream of that device (replay runs it on a blocking stream there, ordered with
        that device's stream 0), so its work and its waits stay on the device that issued them (a
        cross-device copy on stream 0 would otherwise run on whichever device its buffers name)."""
        if not self.several:
            return None
        return -1 - self.current_ordinal  # never a stream handle

    def switch(self, device: m.Device) -> None:
        """The events that follow run on ``device``."""
        if not self._ids and not self._used:
            self._first = device.ordinal  # nothing written yet: the program's first device
        self._described.setdefault(device.ordinal, device)
        self._used.add(device.ordinal)
        self.current_ordinal = device.ordinal

    def of(self, ordinal: int) -> int:
        """The object id of device ``ordinal`` (-1: the current device). A device whose memory the
        program reached before any of its calls ran there is written with its ordinal alone."""
        if ordinal < 0:
            ordinal = self.current_ordinal
        found = self._ids.get(ordinal)
        if found is None:
            device = self._described.get(ordinal) or m.Device(ordinal=ordinal, name=f"cuda:{ordinal}")
            found = self._ids[ordinal] = self._writer.add_object(device)
        return found
