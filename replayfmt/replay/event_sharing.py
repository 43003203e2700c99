"""Which captured events may share one CUDA event (no CUDA here: numbers only).

A program may make a new event for every record (Triton's persistent matmul: 226k of them). An
event first recorded is used over a span of operations (its record, then waits and
synchronisations on it); two events whose spans do not overlap can use one CUDA event, as
long as each wait still finds the record it waited on. The spans, taken in order of their first
operation, are coloured greedily: a span takes a colour of its device that no span still open
holds, or a new one. Greedy colouring in order of start uses the fewest colours an interval
graph allows (its largest overlap), so a capture of a quarter of a million events usually
needs a handful of CUDA events.

Most spans begin after every earlier one has ended (record, synchronise, next); each of those
takes its device's first colour in bulk (numpy), and only spans that overlap others are walked
one by one, within their cluster.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ShareableSpans:
    """The spans of the events that may share a CUDA event, sorted by first use (then last use,
    then id): ``events[i]`` is used from operation ``first[i]`` to ``last[i]``."""

    events: np.ndarray
    first: np.ndarray
    last: np.ndarray

    @classmethod
    def shareable(
        cls, spans: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], events: np.ndarray, own: Collection[int]
    ) -> ShareableSpans:
        """From the plan's spans as columns (event ids, first use, last use, first use is a
        record: plan_scan.EventSpans.columns): those of the capture's ``events`` first recorded
        (one first waited on waits for a record it never sees: it keeps its own), except the
        ``own`` (used by CUDA graphs)."""
        ids, first, last, recorded = spans
        keep = recorded & np.isin(ids, events)
        if own:
            keep &= ~np.isin(ids, np.fromiter(own, np.int64, len(own)))
        ids, first, last = ids[keep], first[keep], last[keep]
        order = np.lexsort((ids, last, first))
        return cls(ids[order], first[order], last[order])


@dataclass(frozen=True)
class SharedEvents:
    """``colour[i]``: the colour (a CUDA event to make) span ``i`` takes; ``device[c]``: the
    device colour ``c`` is made on."""

    colour: np.ndarray
    device: list[int]


def share_events(first: np.ndarray, last: np.ndarray, device: np.ndarray) -> SharedEvents:
    """Colour the spans ``[first[i], last[i]]`` of device ``device[i]`` (sorted by ``first``):
    spans of one device that overlap (one begins before the other's last use ends, or at it)
    never share a colour."""
    count = len(first)
    colour = np.zeros(count, np.int64)
    colours_of: dict[int, list[int]] = {}  # device -> its colours, in the order made
    devices: list[int] = []

    def new_colour(k: int) -> int:
        devices.append(k)
        colours_of.setdefault(k, []).append(len(devices) - 1)
        return len(devices) - 1

    if not count:
        return SharedEvents(colour, devices)
    if bool((np.diff(first) < 0).any()):
        raise ValueError("share_events: spans must come sorted by their first operation")
    # a cluster begins where every earlier span has ended before this one begins
    open_until = np.maximum.accumulate(last)
    begins = np.flatnonzero(np.concatenate(([True], open_until[:-1] < first[1:])))
    ends = np.append(begins[1:], count)
    alone = ends - begins == 1
    for k in np.unique(device[begins[alone]]).tolist():  # a span alone: its device's first colour
        chosen = begins[alone][device[begins[alone]] == k]
        colour[chosen] = new_colour(k)
    for start, end in zip(begins[~alone].tolist(), ends[~alone].tolist(), strict=True):
        spans = zip(first[start:end].tolist(), last[start:end].tolist(), device[start:end].tolist(), strict=True)
        colour[start:end] = _colour_cluster(spans, colours_of, new_colour)
    return SharedEvents(colour, devices)


def _colour_cluster(
    spans: Iterable[tuple[int, int, int]], colours_of: dict[int, list[int]], new_colour: Callable[[int], int]
) -> list[int]:
    """Greedy colouring of overlapping spans (every colour made so far is free as it begins)."""
    free = {k: colours[::-1] for k, colours in colours_of.items()}  # pop() takes the first made
    busy: list[tuple[int, int, int, int]] = []  # heap of (last use, span, device, colour)
    out = []
    for i, (begin, end, k) in enumerate(spans):
        while busy and busy[0][0] < begin:
            _, _, ended_on, c = heapq.heappop(busy)
            free.setdefault(ended_on, []).append(c)
        pool = free.get(k)
        c = pool.pop() if pool else new_colour(k)
        out.append(c)
        heapq.heappush(busy, (end, i, k, c))
    return out
