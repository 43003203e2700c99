"""What the translator records now, and what it refuses there.

:class:`Region` is the open region's bookkeeping, one object that the translator's collaborators
share: the translator opens and closes regions and scopes
(:class:`~replayfmt.capture.translate.Translator`); launches, copies and graph launches read
whether and in which region they record, and note what they touch. :class:`Refusals` writes an
operation the recorder cannot reproduce as an Unsupported operation of the region (replay refuses
it, saying why) and counts it in the report.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from replayfmt.capture import events as ev
    from replayfmt.capture.allocations import Allocation
    from replayfmt.capture.report import Report
    from replayfmt.writer import CaptureWriter


class Region:
    """The open region: whether one is open (``recording``), its number (kernel mode counts each
    instance as a region of its own: an allocation touched in an earlier one is touched again),
    its name in the file ("": the file's unnamed region), what it touched (checkpointed at its
    end) and the scopes open in it with what each touched (each checkpoints that at its end)."""

    def __init__(self) -> None:
        self.recording = False
        self.number = 0
        self.name = ""
        self.touched: list[Allocation] = []
        self.scopes: list[tuple[str, dict[int, Allocation]]] = []

    def open(self, name: str) -> str:
        """Open the next region; its name in the file ("" for the first, unnamed one)."""
        self.number += 1
        self.recording = True
        self.name = name or (f"region#{self.number}" if self.number > 1 else "")  # where its state applies
        self.touched = []
        return self.name

    def close(self) -> list[Allocation]:
        """Stop recording; what the region touched, for its checkpoint (its name stays, for what
        the region's end still writes under it)."""
        self.recording = False
        touched, self.touched = self.touched, []
        return touched

    def next_instance(self) -> int:
        """Kernel mode: a selected launch starts a region of its own (it uploads everything it reads)."""
        self.number += 1
        return self.number

    def abort(self) -> None:
        """Stop recording at once (the recorder's first error): nothing more is written."""
        self.recording = False
        self.scopes.clear()

    @property
    def named(self) -> bool:
        """Whether a named scope is open: a scope of the program's, or the recorder's named region."""
        return bool(self.scopes or self.name)

    @property
    def scope_name(self) -> str:
        """The innermost open scope's name (the region's, or "region" for the unnamed one)."""
        return self.scopes[-1][0] if self.scopes else (self.name or "region")

    def note_scoped(self, allocation: Allocation) -> None:
        """An allocation touched or written: each open scope checkpoints it at its end."""
        for _, touched in self.scopes:
            touched[allocation.address] = allocation


class Refusals:
    """Operations the recorder cannot reproduce: counted in the report by call, and written as
    Unsupported operations while a region is open (on the stream ``stream_of`` names for the
    program's handle), so that replay refuses the capture and says why."""

    def __init__(self, report: Report, writer: CaptureWriter, region: Region, stream_of: Callable[[int], int]) -> None:
        self._report = report
        self._writer = writer
        self._region = region
        self._stream_of = stream_of

    def refuse(self, call: str, reason: str, stream: int) -> None:
        self._report.unsupported[call] = self._report.unsupported.get(call, 0) + 1
        if self._region.recording:
            self._writer.unsupported(call, reason, self._stream_of(stream))

    def on_not_reproducible(self, event: ev.NotReproducible) -> None:
        """A call the CUPTI source recognised as one no replay can reproduce (IPC memory, say)."""
        if self._region.recording:
            self.refuse(event.call, event.reason, event.stream)
