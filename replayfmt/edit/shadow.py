"""What a capture itself knows about buffer contents at each operation, computed on the CPU.

A :class:`Shadow` walks a capture's operations and keeps, for the buffers it tracks, each byte's
value and whether the capture defines it there:

* ``UNDEFINED``: nothing in the capture says what the byte holds (docs/FORMAT.md 4.2: bytes no
  state covers are undefined when a region begins, and a capture must not depend on them);
* ``KNOWN``: its value follows from the capture's data: a ``State`` row, a host-to-device copy
  from a payload, a memset, a device-to-device copy of known bytes, or a ``Checkpoint`` (which
  gives what buffers hold at that point: the recorder checkpoints every buffer a scope touched,
  unchanged ones too);
* ``DIRTY``: work the CPU cannot simulate (a launch, a graph launch, a copy from a host file)
  may have written it; its value is known again only once a checkpoint covers it.

Launch and graph footprints are whole buffers: a relocation says where a pointer points, not how
far the kernel reads or writes from it; and the module globals (format 1.4) of the images they
launch, which kernels use without naming them. Copies and memsets touch exactly their ranges.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from replayfmt.edit.run_map import RunMap
from replayfmt.errors import ReplayUsageError
from replayfmt.format import model as m
from replayfmt.format.uses import ModuleGlobals, uses

_K = m.OperationKind


class ByteState(enum.IntEnum):
    UNDEFINED = 0
    KNOWN = 1
    DIRTY = 2


@dataclass(frozen=True, slots=True)
class Dirtied:
    """Why bytes of a buffer are dirty: the operation that may have written them last."""

    operation: int
    what: str  # e.g. "launch of gemm_kernel", "graph launch of graph 9"


class Intervals(RunMap[ByteState]):
    """A ByteState for every byte of ``[0, size)``, kept as sorted runs with equal neighbours
    joined: a launch that dirties a 64 GiB arena costs one run, not 64 GiB of flags."""

    __slots__ = ()
    join = True

    def __init__(self, size: int) -> None:
        super().__init__(size, ByteState.UNDEFINED)


class Pages:
    """Sparse bytes: 1 MiB pages made on first write (a buffer of 64 GiB costs what is set)."""

    PAGE = 1 << 20

    def __init__(self, size: int) -> None:
        self.size = size
        self._pages: dict[int, np.ndarray] = {}

    def new_bytes(self, offset: int, size: int) -> int:
        """Bytes of the pages a write of ``[offset, offset + size)`` would make (counted, not walked)."""
        if size <= 0:
            return 0
        first, last = offset // self.PAGE, (offset + size - 1) // self.PAGE
        if last - first < len(self._pages):  # few pages in the range: look each up
            have = sum(1 for page in range(first, last + 1) if page in self._pages)
        else:
            have = sum(1 for page in self._pages if first <= page <= last)
        return (last - first + 1 - have) * self.PAGE

    def write(self, offset: int, data: np.ndarray) -> None:
        done = 0
        while done < len(data):
            at = offset + done
            page, within = divmod(at, self.PAGE)
            n = min(len(data) - done, self.PAGE - within)
            target = self._pages.get(page)
            if target is None:
                target = self._pages[page] = np.zeros(min(self.PAGE, self.size - page * self.PAGE), np.uint8)
            target[within : within + n] = data[done : done + n]
            done += n

    def read(self, offset: int, size: int) -> np.ndarray:
        out = np.zeros(size, np.uint8)
        done = 0
        while done < size:
            page, within = divmod(offset + done, self.PAGE)
            n = min(size - done, self.PAGE - within)
            source = self._pages.get(page)
            if source is not None:
                out[done : done + n] = source[within : within + n]
            done += n
        return out


MAX_HOST_BYTES = 768 << 20  # buffer contents a Shadow holds on the host, at most


class _Budget:
    """The bytes of buffer contents a Shadow may hold: charged before pages are made."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def charge(self, data: Pages, offset: int, size: int, what: str) -> None:
        more = data.new_bytes(offset, size)
        if self.held + more > self.limit:
            raise ReplayUsageError(
                f"{what}: the CPU would hold {self.held + more} bytes of buffer contents, over its "
                f"{self.limit}; cut out a smaller region"
            )
        self.held += more


class _Buffer:
    __slots__ = ("data", "dirtied", "size", "status")

    def __init__(self, size: int) -> None:
        self.size = size
        self.data = Pages(size)
        self.status = Intervals(size)
        self.dirtied: Dirtied | None = None


def runs(mask: np.ndarray, base: int = 0) -> list[tuple[int, int]]:
    """[start, end) runs of True in a boolean array, offset by ``base``."""
    if not mask.size:
        return []
    padded = np.concatenate(([False], mask, [False])).astype(np.int8)
    edges = np.flatnonzero(np.diff(padded))
    return [(base + int(a), base + int(b)) for a, b in zip(edges[::2], edges[1::2])]


def graph_nodes(graph: m.Graph, lookup: Callable[[int], m.ObjectDef]) -> Iterator[m.GraphNode]:
    """Every node of a graph and of its child graphs, recursively (each graph once)."""
    seen: set[int] = set()
    stack = [graph]
    while stack:
        g = stack.pop()
        if g.id in seen:
            continue
        seen.add(g.id)
        for node in g.nodes:
            yield node
            if node.graph:
                child = lookup(node.graph)
                if isinstance(child, m.Graph):
                    stack.append(child)


def buffers_named_by_graph(graph: m.Graph, lookup: Callable[[int], m.ObjectDef]) -> set[int]:
    """Every buffer a graph's nodes (and its child graphs', recursively) name."""
    out: set[int] = set()
    for node in graph_nodes(graph, lookup):
        for r in node.relocations:
            out.add(r.target_buffer)
            if r.site_buffer:
                out.add(r.site_buffer)
        out.update(b for b in (node.src_buffer, node.dst_buffer) if b)
    out.discard(0)
    return out


def launch_buffers(op: m.Launch) -> set[int]:
    """The buffers a launch's relocations name (targets, and buffers that hold pointer sites):
    the one table's (:mod:`replayfmt.format.uses`)."""
    return set(uses(op).buffers)


def graph_executables(graph: m.Graph, lookup: Callable[[int], m.ObjectDef]) -> set[int]:
    """Every executable a graph's kernel nodes (and its child graphs', recursively) launch."""
    return {node.executable for node in graph_nodes(graph, lookup) if node.kind == m.GraphNodeKind.KERNEL}


class Shadow:
    """The capture's knowledge of the tracked buffers' bytes (see the module docstring).

    ``sizes`` maps each tracked buffer id to its size; operations on other buffers are ignored.
    ``read_payload(payload, offset, out)`` fills ``out`` with payload bytes (the reader's
    ``read_payload_into``); ``lookup(id)`` returns an object (graphs are looked up by it).
    """

    def __init__(
        self,
        sizes: dict[int, int],
        read_payload: Callable[[int, np.ndarray, int], object],
        lookup: Callable[[int], m.ObjectDef],
        max_bytes: int = MAX_HOST_BYTES,
    ) -> None:
        self._buffers = {b: _Buffer(size) for b, size in sizes.items()}
        self._read_payload = read_payload
        self._lookup = lookup
        self._budget = _Budget(max_bytes)
        self._graph_buffers: dict[int, set[int]] = {}  # a graph's footprint, walked once however often launched
        self._globals = ModuleGlobals(self._buffers, lookup)  # the tracked ones: launches write them unnamed

    @property
    def tracked(self) -> set[int]:
        return set(self._buffers)

    def _range(self, buffer: int, offset: int, size: int) -> _Buffer | None:
        b = self._buffers.get(buffer)
        if b is None or size <= 0 or offset < 0 or offset + size > b.size:
            return None  # untracked, or out of range (the plan refuses those; nothing to learn)
        return b

    # -- what operations do ---------------------------------------------------------------------

    def set_payload(self, buffer: int, offset: int, payload: int, size: int, payload_offset: int = 0) -> None:
        b = self._range(buffer, offset, size)
        if b is None:
            return
        self._budget.charge(b.data, offset, size, f"buffer {buffer}: {size} bytes of payload {payload}")
        for at in range(0, size, Pages.PAGE):  # a page at a time: never the whole range at once
            data = np.empty(min(Pages.PAGE, size - at), np.uint8)
            self._read_payload(payload, data, payload_offset + at)
            b.data.write(offset + at, data)
        b.status.set(offset, offset + size, ByteState.KNOWN)

    def set_bytes(self, buffer: int, offset: int, data: bytes | np.ndarray) -> None:
        view = np.frombuffer(data, np.uint8) if not isinstance(data, np.ndarray) else data.view(np.uint8)
        b = self._range(buffer, offset, len(view))
        if b is None:
            return
        b.data.write(offset, view)
        b.status.set(offset, offset + len(view), ByteState.KNOWN)

    def memset(self, op: m.Memset) -> None:
        size = op.count * op.element_size
        b = self._range(op.buffer, op.offset, size)
        dtype = {1: np.uint8, 2: np.uint16, 4: np.uint32}.get(op.element_size)
        if b is None or dtype is None:
            if b is not None:  # an element size no memset has (the plan refuses it): nothing known
                self.dirty(op.buffer, op.index, f"a memset of {op.element_size}-byte elements", op.offset, size)
            return
        self._budget.charge(b.data, op.offset, size, f"operation {op.index} (memset of {size} bytes)")
        if size <= 4096:  # the common small one: its bytes at once
            element = (op.value & ((1 << (8 * op.element_size)) - 1)).to_bytes(op.element_size, "little")
            b.data.write(op.offset, np.frombuffer(element * op.count, np.uint8))
            b.status.set(op.offset, op.offset + size, ByteState.KNOWN)
            return
        step = Pages.PAGE // op.element_size
        value = op.value & ((1 << (8 * op.element_size)) - 1)
        pattern = np.full(min(op.count, step), value, dtype=np.dtype(dtype).newbyteorder("<")).view(np.uint8)
        for first in range(0, op.count, step):  # a page at a time: a 3 GiB memset holds 1 MiB of pattern
            n = min(step, op.count - first) * op.element_size
            b.data.write(op.offset + first * op.element_size, pattern[:n])
        b.status.set(op.offset, op.offset + size, ByteState.KNOWN)

    def copy(self, src: int, src_offset: int, dst: int, dst_offset: int, size: int, index: int) -> None:
        d = self._range(dst, dst_offset, size)
        if d is None:
            return
        s = self._range(src, src_offset, size)
        if s is None:
            self.dirty(dst, index, f"copy from buffer {src}, which is not tracked", dst_offset, size)
            return
        pieces = s.status.pieces(src_offset, src_offset + size)
        shift = dst_offset - src_offset
        data = {(a, b): self.read(src, a, b - a) for a, b, state in pieces if state == ByteState.KNOWN}
        for a, b, state in pieces:
            d.status.set(a + shift, b + shift, state)
            if state == ByteState.KNOWN:
                self._budget.charge(d.data, a + shift, b - a, f"operation {index} (copy of {b - a} bytes)")
                self._write(dst, a + shift, data[(a, b)])
            elif state == ByteState.DIRTY and s.dirtied is not None:
                d.dirtied = s.dirtied

    def _write(self, buffer: int, offset: int, data: np.ndarray) -> None:
        """Put the bytes a copy moved into the buffer's pages."""
        self._buffers[buffer].data.write(offset, data)

    def dirty(self, buffer: int, index: int, what: str, offset: int = 0, size: int | None = None) -> None:
        b = self._buffers.get(buffer)
        if b is None:
            return
        end = b.size if size is None else min(b.size, offset + size)
        b.status.set(offset, end, ByteState.DIRTY)
        b.dirtied = Dirtied(index, what)

    def apply(self, op: m.Operation, kernel_name: Callable[[m.Launch], str] | None = None) -> None:
        """What operation ``op`` does to the tracked buffers' bytes, as far as the CPU can tell."""
        kind = op.kind
        if kind == _K.LAUNCH:
            name = kernel_name(op) if kernel_name else f"executable {op.executable}"  # type: ignore[arg-type]
            for buffer in launch_buffers(op) | self._globals.of({op.executable}):  # type: ignore[arg-type,union-attr]
                self.dirty(buffer, op.index, f"launch of {name}")
        elif kind == _K.MEMSET:
            self.memset(op)  # type: ignore[arg-type]
        elif kind == _K.COPY_HOST_TO_DEVICE:
            if op.payload:  # type: ignore[union-attr]
                self.set_payload(op.dst_buffer, op.dst_offset, op.payload, op.size, op.src_offset)  # type: ignore[union-attr]
            else:
                self.dirty(op.dst_buffer, op.index, "a copy from a host file", op.dst_offset, op.size)  # type: ignore[union-attr]
        elif kind == _K.COPY_DEVICE_TO_DEVICE:
            self.copy(op.src_buffer, op.src_offset, op.dst_buffer, op.dst_offset, op.size, op.index)  # type: ignore[union-attr]
        elif kind == _K.STATE:
            self.set_payload(op.buffer, op.offset, op.payload, op.size)  # type: ignore[union-attr]
        elif kind == _K.CHECKPOINT:
            for e in op.entries:  # type: ignore[union-attr]
                self.set_payload(e.buffer, e.offset, e.payload, e.size)
        elif kind == _K.GRAPH_LAUNCH:
            graph = self._lookup(op.graph)  # type: ignore[union-attr]
            if isinstance(graph, m.Graph):
                footprint = self._graph_buffers.get(graph.id)
                if footprint is None:
                    launched = self._globals.of(graph_executables(graph, self._lookup))
                    footprint = self._graph_buffers[graph.id] = buffers_named_by_graph(graph, self._lookup) | launched
                for buffer in footprint:
                    self.dirty(buffer, op.index, f"graph launch of graph {graph.id}")
        elif kind == _K.NONE:  # an operation this reader does not know: it may have written anything
            for buffer in self._buffers:
                self.dirty(buffer, op.index, f"an unknown operation (code {getattr(op, 'code', '?')})")

    # -- what is known ------------------------------------------------------------------------------

    def state_runs(self, buffer: int, offset: int, size: int, state: ByteState) -> list[tuple[int, int]]:
        """[start, end) runs of ``state`` within ``[offset, offset + size)`` of ``buffer``."""
        b = self._buffers[buffer]
        return merge((a, z) for a, z, s in b.status.pieces(offset, offset + size) if s == state)

    def dirtied(self, buffer: int) -> Dirtied | None:
        return self._buffers[buffer].dirtied

    def read(self, buffer: int, offset: int, size: int) -> np.ndarray:
        """A copy of the simulated bytes (meaningful where they are KNOWN)."""
        return self._buffers[buffer].data.read(offset, size)


def merge(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """[start, end) ranges sorted and joined where they overlap or touch."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if hi <= lo:
            continue
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def iter_ranges(ranges: dict[int, list[tuple[int, int]]]) -> Iterator[tuple[int, int, int]]:
    """(buffer, start, end) of each range, by buffer id then offset."""
    for buffer in sorted(ranges):
        for lo, hi in ranges[buffer]:
            yield buffer, lo, hi
