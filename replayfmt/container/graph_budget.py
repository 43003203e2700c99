"""The capture's CUDA graphs charged to one budget for the whole file (Limits.max_graph_nodes_total
and max_graph_edges_total), the first time each batch holding some is decoded: the decoder bounds
each graph, and this bounds what every graph of the file costs together. A batch that goes over
is refused, then and every later time it is asked for, without being decoded again."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from replayfmt.errors import ReplayFormatError
from replayfmt.format import model as m
from replayfmt.format.layout import Limits


class GraphBudget:
    """What the graphs of each decoded batch cost, against ``limits``' totals."""

    def __init__(self, limits: Limits) -> None:
        self._limits = limits
        self._lock = threading.Lock()
        self._charged: dict[int, tuple[int, int]] = {}  # batch -> (graph nodes, edges) it defines
        self._refused: dict[int, ReplayFormatError] = {}  # batches whose graphs went over the totals

    def refusal(self, batch: int) -> ReplayFormatError | None:
        """The error batch ``batch`` was refused with, if it was."""
        with self._lock:
            return self._refused.get(batch)

    def charge(self, batch: int, graphs: Sequence[m.Graph], error: Callable[[str], ReplayFormatError]) -> None:
        """Charge batch ``batch``'s ``graphs`` (once); ``error(message)`` is raised, and
        remembered for the batch, when the totals go over."""
        with self._lock:
            if not graphs or batch in self._charged:
                return
            self._charged[batch] = (sum(len(g.nodes) for g in graphs), sum(len(g.edges) for g in graphs))
            nodes = sum(n for n, _ in self._charged.values())
            edges = sum(e for _, e in self._charged.values())
        limits = self._limits
        for total, most, name in (
            (nodes, limits.max_graph_nodes_total, "nodes"),
            (edges, limits.max_graph_edges_total, "edges"),
        ):
            if total > most:
                refused = error(
                    f"the capture's graphs hold more than {most} {name} in all "
                    f"(Limits.max_graph_{name}_total): refused before more are decoded"
                )
                with self._lock:
                    del self._charged[batch]  # not kept: remembered as refused
                    self._refused[batch] = refused
                raise refused
