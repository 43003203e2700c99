"""Moving objects and operations from one capture into a new one: object ids renumbered densely in
source order, payloads copied (content-addressed, so bytes the new file already holds cost
nothing), every id an object or operation names mapped to its new number."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable

import numpy as np

from replayfmt.errors import ReplayUsageError
from replayfmt.format import model as m
from replayfmt.reader import Capture
from replayfmt.version import __version__
from replayfmt.writer import CaptureWriter

_K = m.OperationKind
_PIECE = 64 << 20  # payloads are copied in pieces of this size (bounded memory)


class Transplant:
    """Copies objects and operations of ``source`` into ``writer`` (see the module docstring)."""

    def __init__(self, source: Capture, writer: CaptureWriter) -> None:
        self.source = source
        self.writer = writer
        self.ids: dict[int, int] = {}  # source object id -> new id
        self._payloads: dict[int, int] = {}

    # -- ids and payloads -----------------------------------------------------------------------

    def id(self, old: int) -> int:
        """The new id of source object ``old`` (0 stays 0: none, or the default stream)."""
        if not old:
            return 0
        new = self.ids.get(old)
        if new is None:
            raise ReplayUsageError(f"object {old} is used by the extracted work but was not kept (an internal error)")
        return new

    def payload(self, old: int) -> int:
        """The new id of source payload ``old``, copying its bytes on first use."""
        if not old:
            return 0
        new = self._payloads.get(old)
        if new is None:
            info = self.source.payload(old)
            if info.size <= _PIECE:
                new = self.writer.add_payload(self.source.read_payload(old))
            else:  # large: read in pieces into one buffer (the writer copies it again)
                data = np.empty(info.size, np.uint8)
                for at in range(0, info.size, _PIECE):
                    self.source.read_payload_into(old, data[at : at + _PIECE], at)
                new = self.writer.add_payload(data)
            self._payloads[old] = new
        return new

    # -- objects ------------------------------------------------------------------------------------

    def add_objects(self, ids: list[int]) -> None:
        """Define the source objects ``ids`` (ascending: a graph's children come before it)."""
        for old in sorted(ids):
            self.ids[old] = self.writer.add_object(self._mapped(self.source.object(old)))

    def _mapped(self, obj: m.ObjectDef) -> m.ObjectDef:
        r = dataclasses.replace
        if isinstance(obj, m.Buffer):
            return r(obj, device=self.id(obj.device), module_global=self.id(obj.module_global))
        if isinstance(obj, m.Stream | m.Event):
            return r(obj, device=self.id(obj.device))
        if isinstance(obj, m.Executable):
            return r(obj, payload=self.payload(obj.payload), file=self.id(obj.file))
        if isinstance(obj, m.Global):
            return r(obj, executable=self.id(obj.executable), initial_payload=self.payload(obj.initial_payload))
        if isinstance(obj, m.FileReference):
            ranges = tuple(r(x, payload=self.payload(x.payload)) for x in obj.ranges)
            return r(obj, ranges=ranges, payload=self.payload(obj.payload))
        if isinstance(obj, m.Graph):
            return r(obj, device=self.id(obj.device), nodes=tuple(self._node(n) for n in obj.nodes))
        return obj

    def _node(self, n: m.GraphNode) -> m.GraphNode:
        return dataclasses.replace(
            n,
            executable=self.id(n.executable),
            relocations=self.relocations(n.relocations),
            src_buffer=self.id(n.src_buffer),
            dst_buffer=self.id(n.dst_buffer),
            event=self.id(n.event),
            graph=self.id(n.graph),
        )

    def relocations(self, relocations: tuple[m.Relocation, ...]) -> tuple[m.Relocation, ...]:
        return tuple(
            m.Relocation(self.id(x.site_buffer), self.id(x.target_buffer), x.site_offset, x.target_offset, x.kind)
            for x in relocations
        )

    # -- operations ---------------------------------------------------------------------------------

    def operation(self, op: m.Operation) -> int | None:
        """Write ``op`` into the new capture: its new index, or None for a kind not carried over."""
        w, kind = self.writer, op.kind
        if kind == _K.LAUNCH:
            return w.launch(
                executable=self.id(op.executable),  # type: ignore[union-attr]
                function=op.function,  # type: ignore[union-attr]
                grid=op.grid,  # type: ignore[union-attr]
                block=op.block,  # type: ignore[union-attr]
                parameters=op.parameters,  # type: ignore[union-attr]
                relocations=self.relocations(op.relocations),  # type: ignore[union-attr]
                stream=self.id(op.stream),  # type: ignore[union-attr]
                cluster=op.cluster,  # type: ignore[union-attr]
                shared_memory=op.shared_memory,  # type: ignore[union-attr]
                flags=op.flags,  # type: ignore[union-attr]
            )
        if kind == _K.COPY_HOST_TO_DEVICE:
            c: m.Copy = op  # type: ignore[assignment]
            if c.src_file:
                return w.copy_h2d(
                    dst_buffer=self.id(c.dst_buffer),
                    src_file=self.id(c.src_file),
                    src_offset=c.src_offset,
                    size=c.size,
                    dst_offset=c.dst_offset,
                    stream=self.id(c.stream),
                    flags=c.flags,
                )
            return w.copy_h2d(
                dst_buffer=self.id(c.dst_buffer),
                payload=self.payload(c.payload),
                size=c.size,
                src_offset=c.src_offset,
                dst_offset=c.dst_offset,
                stream=self.id(c.stream),
                flags=c.flags,
                relocations=self.relocations(c.relocations),
            )
        if kind == _K.COPY_DEVICE_TO_HOST:
            c = op  # type: ignore[assignment]
            expected = self.source.read_payload(c.payload) if c.payload else None
            return w.copy_d2h(
                src_buffer=self.id(c.src_buffer),
                size=c.size,
                src_offset=c.src_offset,
                expected=expected,
                stream=self.id(c.stream),
                flags=c.flags,
            )
        if kind == _K.COPY_DEVICE_TO_DEVICE:
            c = op  # type: ignore[assignment]
            return w.copy_d2d(
                src_buffer=self.id(c.src_buffer),
                dst_buffer=self.id(c.dst_buffer),
                size=c.size,
                src_offset=c.src_offset,
                dst_offset=c.dst_offset,
                stream=self.id(c.stream),
                flags=c.flags,
            )
        if kind == _K.MEMSET:
            s: m.Memset = op  # type: ignore[assignment]
            return w.memset(
                buffer=self.id(s.buffer),
                value=s.value,
                count=s.count,
                element_size=s.element_size,
                offset=s.offset,
                stream=self.id(s.stream),
            )
        return self._control(op)

    def _control(self, op: m.Operation) -> int | None:
        w, kind = self.writer, op.kind
        if kind == _K.EVENT_RECORD:
            return w.event_record(self.id(op.event), self.id(op.stream))  # type: ignore[union-attr]
        if kind == _K.STREAM_WAIT_EVENT:
            return w.stream_wait_event(self.id(op.stream), self.id(op.event))  # type: ignore[union-attr]
        if kind == _K.EVENT_SYNCHRONIZE:
            return w.event_synchronize(self.id(op.event))  # type: ignore[union-attr]
        if kind == _K.STREAM_SYNCHRONIZE:
            return w.stream_synchronize(self.id(op.stream))  # type: ignore[union-attr]
        if kind == _K.DEVICE_SYNCHRONIZE:
            return w.device_synchronize(self.id(op.device) if op.device in self.ids else 0)  # type: ignore[union-attr]
        if kind == _K.HOST_FUNCTION:
            return w.host_function(self.id(op.stream))  # type: ignore[union-attr]
        if kind == _K.GRAPH_LAUNCH:
            return w.graph_launch(self.id(op.graph), self.id(op.stream))  # type: ignore[union-attr]
        if kind == _K.COLLECTIVE:  # kept as it is: replayed alone, what it received is put in place
            c: m.Collective = op  # type: ignore[assignment]
            ids = {
                "stream": self.id(c.stream),
                "send_buffer": self.id(c.send_buffer),
                "recv_buffer": self.id(c.recv_buffer),
            }
            received = self.source.read_payload(c.received) if c.received else None
            return w.collective(dataclasses.replace(c, **ids), received=received)
        if kind == _K.SCOPE_BEGIN:
            return w.scope_begin(op.name)  # type: ignore[union-attr]
        if kind == _K.SCOPE_END:
            return w.scope_end(op.name)  # type: ignore[union-attr]
        if kind == _K.CHECKPOINT:
            entries = [
                m.CheckpointEntry(self.id(e.buffer), self.payload(e.payload), e.offset, e.size)
                for e in op.entries  # type: ignore[union-attr]
                if e.buffer in self.ids
            ]
            types = [
                dataclasses.replace(t, buffer=self.id(t.buffer))
                for t in op.types  # type: ignore[union-attr]
                if t.buffer in self.ids
            ]
            return w.checkpoint(entries, name=op.name, types=types) if entries else None  # type: ignore[union-attr]
        return None


def derived_metadata(
    src: m.CaptureMetadata, tool: str, own_prefix: str, properties: Iterable[tuple[str, str]]
) -> m.CaptureMetadata:
    """The metadata of a file made from a capture by ``tool``: the source's host, GPU, driver and
    command line; its properties less those under ``own_prefix`` (left by an earlier run of the same
    tool), then ``properties``."""
    kept = [(k, v) for k, v in src.properties if not k.startswith(own_prefix)]
    return dataclasses.replace(
        src,
        tool=tool,
        tool_version=__version__,
        created_unix_ns=time.time_ns(),
        properties=(*kept, *properties),
    )
