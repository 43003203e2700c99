"""The translator's handling of CUDA graph launches (a mixin of
:class:`~replayfmt.capture.translate.Translator`): the nodes of a launched graph arrive as
ordinary events between :class:`GraphLaunchBegin` and :class:`GraphLaunchEnd`, and are written
between scope markers named ``cuda_graph <handle>``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from replayfmt.capture import events as ev

if TYPE_CHECKING:
    from replayfmt.container.writer import CaptureWriter


def graph_scope(graph_exec: int) -> str:
    """The scope name a launch of the executable graph ``graph_exec`` is written under."""
    return f"cuda_graph {graph_exec:#x}"


class GraphEvents:
    """Graph launch handlers; the translator provides the attributes declared here."""

    writer: CaptureWriter
    _recording: bool

    def _on_graph_begin(self, event: ev.GraphLaunchBegin) -> None:
        if self._recording:
            self.writer.scope_begin(graph_scope(event.graph_exec))

    def _on_graph_end(self, event: ev.GraphLaunchEnd) -> None:
        if self._recording:
            self.writer.scope_end(graph_scope(event.graph_exec))
