"""The dependency closure of a run of operations: exactly the objects it needs, and which bytes of
which buffers it reads (and so needs starting state for) and may write (and so checkpoints).

Footprints: a launch (or a graph launch) reads and may write the whole of every buffer its
relocations name (a relocation says where a pointer points, not how far the kernel goes); a copy
reads exactly its source range and writes exactly its destination range; a memset writes exactly
its range. Objects: the buffers so named, the executables launched (and their globals, whose
storage their kernels read and may write whole, and file references), graphs and their child
graphs, the streams and events the operations use, and the devices all of those live on. Buffers
marked as needing fixed addresses whose address range overlaps a kept buffer are kept too (the
recorder marks a capture that stores device addresses in memory with such a buffer).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from replayfmt.edit.shadow import buffers_named_by_graph, launch_buffers, merge
from replayfmt.errors import ReplayUsageError
from replayfmt.format import model as m
from replayfmt.format.uses import module_globals

_K = m.OperationKind


@dataclass
class Closure:
    """What a run of operations needs (object ids of the source capture) and touches."""

    reads: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # buffer -> [start, end)
    writes: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    buffers: set[int] = field(default_factory=set)
    executables: set[int] = field(default_factory=set)
    graphs: set[int] = field(default_factory=set)
    streams: set[int] = field(default_factory=set)
    events: set[int] = field(default_factory=set)  # recorded inside the run
    files: set[int] = field(default_factory=set)
    objects: list[int] = field(default_factory=list)  # every kept object id, in source order
    device_work: int = 0  # launches, copies, memsets and graph launches in the run

    def read_bytes(self) -> int:
        return sum(hi - lo for ranges in self.reads.values() for lo, hi in ranges)


def compute_closure(ops: Iterable[m.Operation], lookup: Callable[[int], m.ObjectDef], object_count: int) -> Closure:
    """The closure of ``ops`` (see the module docstring); ``lookup(id)`` returns a source object."""
    c = Closure()
    reads: dict[int, list[tuple[int, int]]] = {}
    writes: dict[int, list[tuple[int, int]]] = {}

    def whole(buffer: int, into: dict[int, list[tuple[int, int]]]) -> None:
        obj = lookup(buffer)
        if not isinstance(obj, m.Buffer):
            raise ReplayUsageError(f"object {buffer} is named as a buffer but is a {type(obj).__name__}")
        into.setdefault(buffer, []).append((0, obj.size))

    footprints: dict[int, set[int]] = {}
    for op in ops:
        kind = op.kind
        if kind in m.DEVICE_WORK:
            c.device_work += 1
        stream = getattr(op, "stream", 0)
        if stream and (kind in m.DEVICE_WORK or kind in (_K.EVENT_RECORD, _K.STREAM_SYNCHRONIZE, _K.HOST_FUNCTION)):
            c.streams.add(stream)
        if kind == _K.LAUNCH:
            c.executables.add(op.executable)  # type: ignore[union-attr]
            for buffer in launch_buffers(op):  # type: ignore[arg-type]
                whole(buffer, reads)
                whole(buffer, writes)
        elif kind == _K.GRAPH_LAUNCH:
            _add_graph(c, op.graph, lookup)  # type: ignore[union-attr]
            footprint = footprints.get(op.graph)  # type: ignore[union-attr]
            if footprint is None:  # walked once per graph, however often it is launched
                graph = lookup(op.graph)  # type: ignore[union-attr]
                footprint = footprints[op.graph] = (
                    buffers_named_by_graph(graph, lookup) if isinstance(graph, m.Graph) else set()
                )  # type: ignore[union-attr]
                for buffer in footprint:
                    whole(buffer, reads)
                    whole(buffer, writes)
        elif kind == _K.MEMSET:
            writes.setdefault(op.buffer, []).append((op.offset, op.offset + op.count * op.element_size))  # type: ignore[union-attr]
        elif kind in (_K.COPY_HOST_TO_DEVICE, _K.COPY_DEVICE_TO_DEVICE, _K.COPY_DEVICE_TO_HOST):
            if op.src_buffer:  # type: ignore[union-attr]
                reads.setdefault(op.src_buffer, []).append((op.src_offset, op.src_offset + op.size))  # type: ignore[union-attr]
            if op.dst_buffer:  # type: ignore[union-attr]
                writes.setdefault(op.dst_buffer, []).append((op.dst_offset, op.dst_offset + op.size))  # type: ignore[union-attr]
            if op.src_file:  # type: ignore[union-attr]
                c.files.add(op.src_file)  # type: ignore[union-attr]
        elif kind == _K.COLLECTIVE:  # reads what it sends (among its peers), writes what it receives
            if op.send_size:  # type: ignore[union-attr]
                reads.setdefault(op.send_buffer, []).append((op.send_offset, op.send_offset + op.send_size))  # type: ignore[union-attr]
            if op.recv_size:  # type: ignore[union-attr]
                writes.setdefault(op.recv_buffer, []).append((op.recv_offset, op.recv_offset + op.recv_size))  # type: ignore[union-attr]
        elif kind == _K.EVENT_RECORD:
            c.events.add(op.event)  # type: ignore[union-attr]
        elif kind in (_K.STREAM_WAIT_EVENT,) and op.event in c.events:  # type: ignore[union-attr]
            c.streams.add(op.stream)  # type: ignore[union-attr]
    for buffer in _module_globals(c.executables, lookup, object_count):  # kernels read their module's globals
        whole(buffer, reads)
        whole(buffer, writes)
    c.reads = {b: merge(r) for b, r in reads.items()}
    c.writes = {b: merge(r) for b, r in writes.items()}
    c.buffers = set(c.reads) | set(c.writes)
    _finish_objects(c, lookup, object_count)
    return c


def _module_globals(executables: set[int], lookup: Callable[[int], m.ObjectDef], object_count: int) -> list[int]:
    """The buffers that are module globals (format 1.4) of the images of ``executables``."""
    if not executables:
        return []
    return sorted(module_globals(executables, range(1, object_count + 1), lookup))


def _add_graph(c: Closure, graph_id: int, lookup: Callable[[int], m.ObjectDef]) -> None:
    """A launched graph and its child graphs (iteratively, each once: a chain of thousands of
    child graphs is no recursion)."""
    pending = [graph_id]
    while pending:
        gid = pending.pop()
        if gid in c.graphs:
            continue
        graph = lookup(gid)
        if not isinstance(graph, m.Graph):
            raise ReplayUsageError(f"graph launch names object {gid}, which is a {type(graph).__name__}")
        c.graphs.add(gid)
        for node in graph.nodes:
            if node.kind == m.GraphNodeKind.KERNEL:
                c.executables.add(node.executable)
            if node.event:
                c.events.add(node.event)
            if node.graph:
                pending.append(node.graph)


def _finish_objects(c: Closure, lookup: Callable[[int], m.ObjectDef], object_count: int) -> None:
    """Globals of kept executables, file references, fixed-address markers and the devices."""
    kept = c.buffers | c.executables | c.graphs | c.streams | c.events | c.files
    spans = []
    for b in c.buffers:
        buf = lookup(b)
        if isinstance(buf, m.Buffer) and buf.address:
            spans.append((buf.address, buf.address + buf.size))
        if isinstance(buf, m.Buffer) and buf.module_global:  # its global, and the executable that global names
            glob = lookup(buf.module_global)
            kept.add(buf.module_global)
            if isinstance(glob, m.Global):
                kept.add(glob.executable)
    devices: set[int] = set()
    for oid in range(1, object_count + 1):
        obj = lookup(oid)
        if isinstance(obj, m.Global) and obj.executable in c.executables:
            kept.add(oid)
        elif isinstance(obj, m.Buffer) and obj.requires_fixed_address and oid not in kept:
            if any(lo < obj.address + obj.size and obj.address < hi for lo, hi in spans):
                kept.add(oid)
        elif isinstance(obj, m.Executable) and oid in c.executables and obj.file:
            kept.add(obj.file)
    for oid in kept:
        obj = lookup(oid)
        if isinstance(obj, m.Buffer | m.Stream | m.Event | m.Graph) and obj.device:
            devices.add(obj.device)  # (a FileReference's ``device`` is st_dev, not an object)
    if not devices:  # work on the default stream only: keep every device the capture describes
        devices = {oid for oid in range(1, object_count + 1) if isinstance(lookup(oid), m.Device)}
    c.objects = sorted(kept | devices)
