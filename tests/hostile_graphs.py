"""Hostile inputs, round two (issue 26): forged format 1.2 files against what 1.2 added, CUDA
graphs, starting state and the original program's times, built at test time. Each builder
writes one small file under ``root`` and returns its path: amplification (graphs declaring
millions of nodes or edges, chains and diamonds of child graphs, huge TIMINGS chunks) and every
structural lie one verdict must catch (cycles, ranges, kinds, lifetimes, frames that lie, a cut
file with no device work left, host files that are no regular file).

Files are built with the real writer where it writes the lie as asked, and by surgery on the
FlatBuffers bytes (a vector's count, a chunk header) where it does not."""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import numpy as np
import zstandard
from craft import FileBuilder, record_batch

import replayfmt
from replayfmt.format import graph_records, model as m, records
from replayfmt.format.fb import Graph as FbGraph, RecordBatch as FbRecordBatch, Timings as FbTimings
from replayfmt.format.layout import (
    CHUNK_HEADER_SIZE,
    FILE_HEADER_SIZE,
    FOOTER_SIZE,
    ChunkKind,
    Codec,
    Limits,
    align_up,
    pack_chunk_header,
    pack_footer,
    unpack_chunk_header,
)
from replayfmt.format.timings import OperationTime, OriginalTimes, ScopeTime, encode_timings

_N = m.GraphNodeKind
_K = m.OperationKind


def _memset_node(buffer: int, **fields: int) -> m.GraphNode:
    values = {"dst_buffer": buffer, "element_size": 4, "width": 16, "height": 1, "pitch": 64, "value": 7}
    values.update(fields)
    return m.GraphNode(kind=_N.MEMSET, **values)


def _graph_capture(path: Path, graphs: Callable[[replayfmt.CaptureWriter, int], list[int]]) -> Path:
    """A capture with one buffer; ``graphs(writer, buffer)`` adds graphs and returns those to launch."""
    with replayfmt.CaptureWriter(path, threads=0) as w:
        buf = w.add_object(m.Buffer(size=4096))
        for gid in graphs(w, buf):
            w.graph_launch(gid)
    return path


# -- amplification ---------------------------------------------------------------------------


def _patched_graph_file(path: Path, field: int, count: int, *, zstd: bool = False, edges: int = 1) -> Path:
    """A file whose one Graph declares ``count`` elements in vector ``field`` (6: nodes, 8: edges)
    while holding a few: the count is patched in the encoded RecordBatch."""
    graph = m.Graph(id=2, nodes=(_memset_node(1), _memset_node(1)), edges=((0, 1),) * edges)
    ids = np.zeros(3, records.dtype("IdOperationRecord"))
    ids[:] = [(1, 0), (2, 0), (2, 0)]  # create buffer 1, create graph 2, launch graph 2
    body = bytearray(
        record_batch(
            kinds=bytes([_K.CREATE_OBJECT, _K.CREATE_OBJECT, _K.GRAPH_LAUNCH]),
            id_operations=ids,
            objects=[m.Buffer(id=1, size=4096), graph],
        )
    )
    batch = FbRecordBatch.RecordBatch.GetRootAs(body, 0)
    table = batch.Objects(1).Body()
    fb_graph = FbGraph.Graph()
    fb_graph.Init(table.Bytes, table.Pos)
    at = fb_graph._tab.Vector(fb_graph._tab.Offset(field)) - 4
    struct.pack_into("<I", body, at, count)
    fb = FileBuilder()
    if zstd:
        stored = zstandard.ZstdCompressor(level=3).compress(bytes(body))
        offset = fb.chunk(ChunkKind.RECORDS, stored, codec=Codec.ZSTD, logical=len(body))
        fb.batches.append((offset, 0, 3, 1, 2, 1, 0))
    else:
        fb.batch(bytes(body), 0, 3, 1, 2)
    return fb.finish(path)


def graph_declares_millions_of_nodes(root: Path) -> Path:
    return _patched_graph_file(root / "nodes-2m.kreplay", 6, 2_000_000)


def graph_declares_30m_edges(root: Path) -> Path:
    return _patched_graph_file(root / "edges-30m.kreplay", 8, 30_000_000)


def graph_holds_2m_edges_zstd(root: Path) -> Path:
    """Two million real edges (16 MB), compressed to a few KB (within the zstd expansion limit):
    refused at their count. Our writer refuses such a graph: it is encoded with the limit lifted."""
    lifted = Limits(max_graph_edges=1 << 23)
    with mock.patch.object(graph_records, "DEFAULT_LIMITS", lifted):
        return _patched_graph_file(root / "edges-2m-zstd.kreplay", 8, 2_000_000, zstd=True, edges=2_000_000)


def graph_of_20k_nodes(root: Path) -> Path:
    """A large legal graph (20,000 memset nodes in a chain): handled, and replayable."""

    def build(w: replayfmt.CaptureWriter, buf: int) -> list[int]:
        n = 20_000
        nodes = tuple(_memset_node(buf, value=i) for i in range(n))
        return [w.add_object(m.Graph(nodes=nodes, edges=tuple((i, i + 1) for i in range(n - 1))))]

    return _graph_capture(root / "graph-20k.kreplay", build)


def child_chain(root: Path, *, launch_every: bool) -> Path:
    """2,000 graphs, each holding the one before as its child graph."""

    def build(w: replayfmt.CaptureWriter, buf: int) -> list[int]:
        ids = [w.add_object(m.Graph(nodes=(_memset_node(buf),)))]
        for _ in range(1999):
            ids.append(w.add_object(m.Graph(nodes=(m.GraphNode(kind=_N.CHILD_GRAPH, graph=ids[-1]),))))
        return ids if launch_every else [ids[-1]]

    return _graph_capture(root / f"chain-{'every' if launch_every else 'top'}.kreplay", build)


def child_chain_top(root: Path) -> Path:
    return child_chain(root, launch_every=False)


def child_chain_every(root: Path) -> Path:
    return child_chain(root, launch_every=True)


def diamond(root: Path, *, wide: int = 8, deep: int = 30, launch_every: bool = False) -> Path:
    """``deep`` levels of ``wide`` graphs, each holding every graph of the level below: a few KB
    that expand to wide**deep nodes if walked naively."""

    def build(w: replayfmt.CaptureWriter, buf: int) -> list[int]:
        level = [w.add_object(m.Graph(nodes=(_memset_node(buf),))) for _ in range(wide)]
        launched = list(level)
        for _ in range(deep - 1):
            nodes = tuple(m.GraphNode(kind=_N.CHILD_GRAPH, graph=g) for g in level)
            level = [w.add_object(m.Graph(nodes=nodes)) for _ in range(wide)]
            launched += level
        return launched if launch_every else level[:1]

    return _graph_capture(root / f"diamond-{wide}x{deep}{'-every' if launch_every else ''}.kreplay", build)


def diamond_8x30(root: Path) -> Path:
    return diamond(root)


def diamond_4x12_every(root: Path) -> Path:
    """Within the depth limit; expands to 4**12 nodes: refused by the expanded-size limit."""
    return diamond(root, wide=4, deep=12, launch_every=True)


def diamond_2x6_every(root: Path) -> Path:
    """A small diamond: legal, handled and replayable (64 nodes expanded)."""
    return diamond(root, wide=2, deep=6, launch_every=True)


def _timed_capture(path: Path, operations: int = 4) -> Path:
    with replayfmt.CaptureWriter(path, threads=0) as w:
        buf = w.add_object(m.Buffer(size=4096))
        for _ in range(operations):
            w.memset(buffer=buf, value=1, count=16)
        w.set_original_times([OperationTime(i, 1000 * i, 500) for i in range(1, operations + 1)])
    return path


def _chunk_of_kind(data: bytes, kind: ChunkKind) -> int:
    offset = FILE_HEADER_SIZE
    while unpack_chunk_header(data[offset : offset + CHUNK_HEADER_SIZE], offset).kind != kind:
        offset = unpack_chunk_header(data[offset : offset + CHUNK_HEADER_SIZE], offset).end
    return offset


def _replace_timings(path: Path, patch: Callable[[bytearray], bytes]) -> Path:
    """Give the file another TIMINGS chunk (``patch`` of the old body, stored raw) where the old
    one began: the writer puts it just before the INDEX, which follows it again unchanged (its
    body does not hold its own offset), then a footer that points at it."""
    data = path.read_bytes()
    offset = _chunk_of_kind(data, ChunkKind.TIMINGS)
    timings = unpack_chunk_header(data[offset : offset + CHUNK_HEADER_SIZE], offset)
    stored = data[timings.body_offset : timings.body_offset + timings.stored_size]
    new = patch(bytearray(zstandard.decompress(stored) if timings.codec == Codec.ZSTD else stored))
    index_at = _chunk_of_kind(data, ChunkKind.INDEX)
    index = unpack_chunk_header(data[index_at : index_at + CHUNK_HEADER_SIZE], index_at)
    out = bytearray(data[:offset])
    out += pack_chunk_header(ChunkKind.TIMINGS, timings.flags, Codec.RAW, new, len(new)) + new
    out += bytes(align_up(len(out)) - len(out))
    moved = len(out)
    out += data[index_at : index.end]
    out += pack_footer(moved, len(out) + FOOTER_SIZE)
    path.write_bytes(bytes(out))
    return path


def timings_declare_10m_rows(root: Path) -> Path:
    def patch(body: bytearray) -> bytes:
        timings = FbTimings.Timings.GetRootAs(body, 0)
        at = timings._tab.Vector(timings._tab.Offset(6)) - 4
        struct.pack_into("<I", body, at, 10_000_000)
        return bytes(body)

    return _replace_timings(_timed_capture(root / "timings-10m.kreplay"), patch)


def timings_name_missing_operations(root: Path) -> Path:
    def patch(body: bytearray) -> bytes:
        return encode_timings(OriginalTimes("cupti-activity", {999: OperationTime(999, 0, 5)}))

    return _replace_timings(_timed_capture(root / "timings-missing-ops.kreplay"), patch)


def timings_scope_out_of_range(root: Path) -> Path:
    def patch(body: bytearray) -> bytes:
        times = {1: OperationTime(1, 0, 5)}
        return encode_timings(OriginalTimes("cupti-activity", times, (ScopeTime(1, 999, 5, 5),)))

    return _replace_timings(_timed_capture(root / "timings-scope.kreplay"), patch)


def timings_not_a_flatbuffer(root: Path) -> Path:
    return _replace_timings(_timed_capture(root / "timings-garbage.kreplay"), lambda body: b"\xff" * 16)


# -- structural lies -------------------------------------------------------------------------


def _graphs_file(
    name: str, make: Callable[[int], list[m.Graph]], launch: tuple[int, ...] = ()
) -> Callable[[Path], Path]:
    """A builder of a capture whose graphs ``make(buffer)`` returns (ids given in order from 2),
    launching ``launch`` (default: the last graph)."""

    def build(root: Path) -> Path:
        def graphs(w: replayfmt.CaptureWriter, buf: int) -> list[int]:
            ids = [w.add_object(g) for g in make(buf)]
            return list(launch) or ids[-1:]

        return _graph_capture(root / f"{name}.kreplay", graphs)

    build.__name__ = name.replace("-", "_")
    return build


child_graph_self = _graphs_file("child-self", lambda b: [m.Graph(nodes=(m.GraphNode(kind=_N.CHILD_GRAPH, graph=2),))])
child_graph_cycle = _graphs_file(
    "child-cycle",
    lambda b: [
        m.Graph(nodes=(m.GraphNode(kind=_N.CHILD_GRAPH, graph=3),)),
        m.Graph(nodes=(m.GraphNode(kind=_N.CHILD_GRAPH, graph=2),)),
    ],
)
edge_cycle = _graphs_file(
    "edge-cycle", lambda b: [m.Graph(nodes=(_memset_node(b), _memset_node(b)), edges=((0, 1), (1, 0)))]
)
edge_out_of_range = _graphs_file("edge-range", lambda b: [m.Graph(nodes=(_memset_node(b),), edges=((0, 7),))])
unknown_node_kind = _graphs_file("node-kind", lambda b: [m.Graph(nodes=(m.GraphNode(kind=99),))])
memset_node_past_buffer = _graphs_file("memset-node", lambda b: [m.Graph(nodes=(_memset_node(b, dst_offset=4090),))])
memcpy_node_past_buffer = _graphs_file(
    "memcpy-node",
    lambda b: [m.Graph(nodes=(m.GraphNode(kind=_N.MEMCPY, src_buffer=b, dst_buffer=b, dst_offset=4000, size=512),))],
)
memcpy_node_offset_wrap = _graphs_file(
    "memcpy-wrap",
    lambda b: [
        m.Graph(nodes=(m.GraphNode(kind=_N.MEMCPY, src_buffer=b, dst_buffer=b, src_offset=2**64 - 8, size=16),))
    ],
)
child_not_a_graph = _graphs_file(
    "child-buffer", lambda b: [m.Graph(nodes=(m.GraphNode(kind=_N.CHILD_GRAPH, graph=b),))]
)
launch_of_missing_graph = _graphs_file("launch-missing", lambda b: [m.Graph(nodes=(_memset_node(b),))], launch=(999,))
launch_of_a_buffer = _graphs_file("launch-buffer", lambda b: [m.Graph(nodes=(_memset_node(b),))], launch=(1,))
legal_graphs = _graphs_file(
    "legal-graphs",
    lambda b: [
        m.Graph(
            nodes=(_memset_node(b), m.GraphNode(kind=_N.MEMCPY, src_buffer=b, dst_buffer=b, dst_offset=64, size=64))
        ),
        m.Graph(nodes=(m.GraphNode(kind=_N.CHILD_GRAPH, graph=2), _memset_node(b, dst_offset=128)), edges=((0, 1),)),
    ],
)


def _ops_file(name: str, ops: Callable[[replayfmt.CaptureWriter, int], None]) -> Callable[[Path], Path]:
    def build(root: Path) -> Path:
        path = root / f"{name}.kreplay"
        with replayfmt.CaptureWriter(path, threads=0) as w:
            ops(w, w.add_object(m.Buffer(size=4096)))
        return path

    build.__name__ = name.replace("-", "_")
    return build


state_past_buffer = _ops_file("state-past", lambda w, b: w.state(buffer=b, data=bytes(64), offset=4090))
state_offset_wrap = _ops_file("state-wrap", lambda w, b: w.state(buffer=b, data=bytes(64), offset=2**64 - 8))
copy_past_buffer = _ops_file("copy-past", lambda w, b: w.copy_h2d(dst_buffer=b, dst_offset=4000, data=bytes(512)))
memset_past_buffer = _ops_file("memset-past", lambda w, b: w.memset(buffer=b, value=0, count=2000, element_size=4))


def _copy_over_payload(w: replayfmt.CaptureWriter, b: int) -> None:
    payload = w.add_payload(bytes(range(16)))
    w.copy_h2d(dst_buffer=b, payload=payload, size=1024)


copy_size_over_payload = _ops_file("copy-over-payload", _copy_over_payload)


def _memset_destroyed(w: replayfmt.CaptureWriter, b: int) -> None:
    w.memset(buffer=b, value=0, count=16)
    w.destroy(b)
    w.memset(buffer=b, value=0, count=16)


def _launch_destroyed_graph(w: replayfmt.CaptureWriter, b: int) -> None:
    g = w.add_object(m.Graph(nodes=(_memset_node(b),)))
    w.graph_launch(g)
    w.destroy(g)
    w.graph_launch(g)


def _graph_after_its_buffer(w: replayfmt.CaptureWriter, b: int) -> None:
    g = w.add_object(m.Graph(nodes=(_memset_node(b),)))
    w.graph_launch(g)
    w.destroy(b)
    w.graph_launch(g)


memset_of_destroyed_buffer = _ops_file("memset-destroyed", _memset_destroyed)
launch_of_destroyed_graph = _ops_file("launch-destroyed", _launch_destroyed_graph)
graph_after_its_buffer_went = _ops_file("graph-buffer-destroyed", _graph_after_its_buffer)
destroy_twice = _ops_file("destroy-twice", lambda w, b: (w.destroy(b), w.destroy(b)))


def empty_parameter_kernel(root: Path) -> Path:
    """A legal launch of a kernel whose known parameter list is empty (crashed the JSONL renderer)."""
    path = root / "noargs.kreplay"
    with replayfmt.CaptureWriter(path, threads=0) as w:
        exe = w.add_object(m.Executable(functions=(m.Function(name="noargs", parameters_known=True),)))
        w.launch(executable=exe, function=0, grid=(1, 1, 1), block=(1, 1, 1))
    return path


def _payload_file(path: Path) -> Path:
    with replayfmt.CaptureWriter(path, threads=0) as w:  # compressible: the frame is stored with zstd
        buf = w.add_object(m.Buffer(size=8192))
        w.copy_h2d(dst_buffer=buf, data=np.tile(np.arange(16, dtype=np.int32), 128))
    return path


def _patch_frame(path: Path, logical: Callable[[int], int]) -> Path:
    """The FRAME chunk's header declares another logical size (checksums made right again)."""
    data = bytearray(path.read_bytes())
    offset = _chunk_of_kind(data, ChunkKind.FRAME)
    header = unpack_chunk_header(data[offset : offset + CHUNK_HEADER_SIZE], offset)
    body = bytes(data[header.body_offset : header.body_offset + header.stored_size])
    assert header.codec == Codec.ZSTD
    new = pack_chunk_header(ChunkKind.FRAME, header.flags, header.codec, body, logical(header.logical_size), header.key)
    data[offset : offset + CHUNK_HEADER_SIZE] = new
    path.write_bytes(bytes(data))
    return path


def frame_size_lies(root: Path) -> Path:
    return _patch_frame(_payload_file(root / "frame-lies.kreplay"), lambda n: n * 2)


def frame_missing(root: Path) -> Path:
    """The index promises a frame that is not in the file (its entry points elsewhere)."""
    path = _payload_file(root / "frame-missing.kreplay")
    with replayfmt.open(path) as cap:
        digest = cap.payload(1).frames[0]
        at = cap.frame_location(digest)
    assert at is not None
    data = bytearray(path.read_bytes())
    data[at[0] : at[0] + 4] = b"XXXX"  # the chunk magic: no frame where the index says
    path.write_bytes(bytes(data))
    return path


def cut_without_device_work(root: Path) -> Path:
    """A capture cut short whose surviving part holds objects and state, but no launch, copy or memset."""
    whole = root / "whole.kreplay"
    with replayfmt.CaptureWriter(whole, threads=0, batch_operations=4) as w:
        buf = w.add_object(m.Buffer(size=4096))
        w.state(buffer=buf, data=bytes(range(256)) * 4)
        w.scope_begin("step")
        w.flush()
        for _ in range(50):
            w.memset(buffer=buf, value=1, count=16)
        w.scope_end("step")
    with replayfmt.open(whole) as cap:
        first_memset = next(op.index for op in cap if isinstance(op, m.Memset))
        cut_at = next(
            b.offset
            for b in (cap.directory.entry(i) for i in range(cap.batch_count))
            if b.first_operation >= first_memset
        )
    path = root / "cut-no-work.kreplay"
    path.write_bytes(whole.read_bytes()[:cut_at])
    return path


# -- host files ------------------------------------------------------------------------------


def _reference(path: Path, ref: m.FileReference, executable: bool = False) -> Path:
    with replayfmt.CaptureWriter(path, threads=0) as w:
        buf = w.add_object(m.Buffer(size=4096))
        rid = w.add_object(ref)
        if executable:
            exe = w.add_object(
                m.Executable(
                    format=m.ExecutableFormat.CUBIN, file=rid, functions=(m.Function(name="k", parameters_known=True),)
                )
            )
            w.launch(executable=exe, function=0, grid=(1, 1, 1), block=(1, 1, 1))
        else:
            w.copy_h2d(dst_buffer=buf, src_file=rid, src_offset=0, size=16)
    return path


def reference_to_ptmx(root: Path) -> Path:
    return _reference(
        root / "ptmx.kreplay", m.FileReference(path="/dev/ptmx", size=0, validation=m.FileValidation.NONE)
    )


def reference_to_directory(root: Path) -> Path:
    return _reference(
        root / "dir.kreplay", m.FileReference(path=str(root), size=4096, validation=m.FileValidation.NONE)
    )


def reference_not_normalised(root: Path) -> Path:
    ref = m.FileReference(path="/models/../etc/passwd", size=16, validation=m.FileValidation.NONE)
    return _reference(root / "dotdot.kreplay", ref)


def reference_relative(root: Path) -> Path:
    ref = m.FileReference(path="weights.bin", size=16, validation=m.FileValidation.NONE)
    return _reference(root / "relative.kreplay", ref)


def environ_as_executable(root: Path) -> Path:
    ref = m.FileReference(path="/proc/self/environ", size=0, validation=m.FileValidation.NONE)
    return _reference(root / "environ.kreplay", ref, executable=True)


def symlink_as_executable(root: Path) -> Path:
    link = root / "passwd-link"
    if not link.exists():
        link.symlink_to("/etc/passwd")
    ref = m.FileReference(path=str(link), size=os.stat("/etc/passwd").st_size, validation=m.FileValidation.NONE)
    return _reference(root / "symlink-exe.kreplay", ref, executable=True)


def text_file_as_executable(root: Path) -> Path:
    """A regular file of the recorded size that is no executable image."""
    text = root / "notes.txt"
    text.write_bytes(b"not a cubin, not PTX\n" * 10)
    ref = m.FileReference(path=str(text), size=text.stat().st_size, validation=m.FileValidation.NONE)
    return _reference(root / "text-exe.kreplay", ref, executable=True)


BUILDERS: tuple[Callable[[Path], Path], ...] = (
    graph_declares_millions_of_nodes,
    graph_declares_30m_edges,
    graph_holds_2m_edges_zstd,
    graph_of_20k_nodes,
    child_chain_top,
    child_chain_every,
    diamond_8x30,
    diamond_4x12_every,
    diamond_2x6_every,
    timings_declare_10m_rows,
    timings_name_missing_operations,
    timings_scope_out_of_range,
    timings_not_a_flatbuffer,
    child_graph_self,
    child_graph_cycle,
    edge_cycle,
    edge_out_of_range,
    unknown_node_kind,
    memset_node_past_buffer,
    memcpy_node_past_buffer,
    memcpy_node_offset_wrap,
    child_not_a_graph,
    launch_of_missing_graph,
    launch_of_a_buffer,
    legal_graphs,
    state_past_buffer,
    state_offset_wrap,
    copy_past_buffer,
    memset_past_buffer,
    copy_size_over_payload,
    memset_of_destroyed_buffer,
    launch_of_destroyed_graph,
    graph_after_its_buffer_went,
    destroy_twice,
    empty_parameter_kernel,
    frame_size_lies,
    frame_missing,
    cut_without_device_work,
    reference_to_ptmx,
    reference_to_directory,
    reference_not_normalised,
    reference_relative,
    environ_as_executable,
    symlink_as_executable,
    text_file_as_executable,
)
