"""The views behind ``dump-replay``: a summary, JSONL rows and text lines of a capture.

Everything streams: rows are produced one at a time from the reader, so memory stays constant
however large the capture. The JSONL keys are frozen within a major version (docs/JSONL.md);
they are only ever added. Launch rows, by far the most numerous, are rendered through per-function
templates (names escaped once), which keeps JSONL output above 200,000 rows/s.

Damaged files: every producer stops at the first unreadable batch and re-raises its
ReplayFormatError after yielding everything before it; the summary records the damage instead.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import operator
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from replayfmt.dump.code import CodeTargetCache
from replayfmt.dump.export import export_payload, prepare_directory
from replayfmt.dump.fields import (
    field_names,
    label_of,
    launch_flags_text,
    stored_pointers_json,
    stored_pointers_rows,
    stored_pointers_text,
    typed_tensor_row,
)
from replayfmt.dump.filters import JSONL_VERSION, DumpFilter, PayloadMode
from replayfmt.dump.graphs import graph_fields, graph_node_lines, kernel_names
from replayfmt.dump.launch_json import LaunchTemplate
from replayfmt.dump.object_text import object_names, object_text
from replayfmt.errors import ReplayUsageError
from replayfmt.format import model as m
from replayfmt.format.names import demangle
from replayfmt.format.payloads import hash_hex
from replayfmt.format.records import ID_OPERATIONS
from replayfmt.format.uses import uses
from replayfmt.reader import Capture
from replayfmt.version import __version__

_CACHE_LIMIT = 65536  # entries in each per-dump render cache
_K = m.OperationKind

INLINE_LIMIT = 64 << 20  # bytes of one payload inlined in a JSONL row (hex doubles them)
_CACHED_DATA = 64 << 10  # inline data longer than this is not cached between rows

_LAUNCH_LEAD = '{"kind":"launch","index":'


class _LaunchParts(NamedTuple):
    """The text of a launch row around its index and parameter values, and how to render those."""

    prefix: str
    render: Any  # LaunchTemplate.render, or None
    targets: tuple[str | None, ...]
    suffix: str
    launch: m.Launch  # held so that the ids in this entry's key stay unique while it is cached


class Dumper:
    """Produces rows (JSONL text) and text lines for one open capture."""

    def __init__(
        self,
        cap: Capture,
        *,
        filter: DumpFilter = DumpFilter(),  # noqa: A002 - the natural name
        payloads: PayloadMode = PayloadMode.NONE,
        payload_dir: Path | None = None,
    ) -> None:
        self.cap = cap
        self.filter = filter
        self.payload_mode = payloads
        self.payload_dir = payload_dir
        if payloads == PayloadMode.FILES:
            if payload_dir is None:
                raise ReplayUsageError("--payloads=files:DIR needs a directory")
            prepare_directory(payload_dir)
        self._templates: dict[tuple[int, int], LaunchTemplate] = {}
        self._launch_parts: dict[tuple[int, ...], _LaunchParts] = {}
        self._payload_json: dict[int, str] = {}
        self._encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
        self._payload_refs: dict[int, dict[str, Any] | None] = {}
        self._executables: dict[int, m.Executable | None] = {}
        self.code = CodeTargetCache(cap)  # which GPUs each executable loads on
        # the original program's device times: with them, launch, copy and memset rows carry original_ns
        self._original = cap.original_times()

    # -- lookups -----------------------------------------------------------------------------

    def function(self, executable: int, index: int) -> m.Function | None:
        exe = self._executables.get(executable, False)
        if exe is False:
            try:
                obj = self.cap.object(executable)
                exe = obj if isinstance(obj, m.Executable) else None
            except KeyError:
                exe = None
            self._executables[executable] = exe
        if exe is None or not 0 <= index < len(exe.functions):
            return None
        return exe.functions[index]

    def payload_ref(self, pid: int) -> dict[str, Any] | None:
        """What a row says of a payload (cached: copies of one upload share it)."""
        ref = self._payload_refs.get(pid, False)
        if ref is False:
            if len(self._payload_refs) >= _CACHE_LIMIT:
                self._payload_refs.clear()
            ref = self._make_payload_ref(pid)
            if ref is None or len(ref.get("data", "")) <= _CACHED_DATA:  # large inline data is not kept
                self._payload_refs[pid] = ref
        return ref

    def _make_payload_ref(self, pid: int) -> dict[str, Any] | None:
        if not pid:
            return None
        try:
            info = self.cap.payload(pid)
        except KeyError:
            return {"id": pid, "missing": True}
        codecs = set()
        missing = False
        for digest in set(info.frames):
            loc = self.cap.frame_location(digest)
            if loc is None:
                missing = True
            else:
                codecs.add("zstd" if loc[3] == 1 else "raw")
        codec = "missing" if missing else (codecs.pop() if len(codecs) == 1 else ("mixed" if codecs else "raw"))
        ref: dict[str, Any] = {
            "id": pid,
            "hash": info.hash_hex,
            "size": info.size,
            "stored_size": self.cap.payload_stored_size(info),
            "codec": codec,
        }
        if self.payload_mode != PayloadMode.NONE and not missing:
            if self.payload_mode == PayloadMode.FILES:
                assert self.payload_dir is not None
                ref["file"] = str(export_payload(self.cap, info, self.payload_dir))
            else:
                if info.size > INLINE_LIMIT:  # a 3 KB capture may name a terabyte (deduplicated frames)
                    raise ReplayUsageError(
                        f"payload {pid} is {info.size} bytes, more than --payloads={self.payload_mode.value} "
                        f"inlines ({INLINE_LIMIT}); export it with --payloads=files:DIR"
                    )
                data = self.cap.read_payload(pid)
                ref["data"] = data.hex() if self.payload_mode == PayloadMode.HEX else base64.b64encode(data).decode()
        return ref

    # -- rows ---------------------------------------------------------------------------------

    def file_row(self) -> dict[str, Any]:
        h = self.cap.header
        return {
            "kind": "file",
            "path": self.cap.path,
            "size": self.cap.size,
            "format_version": f"{h.major}.{h.minor}",
            "format_major": h.major,
            "format_minor": h.minor,
            "jsonl_version": JSONL_VERSION,
            "replayfmt_version": __version__,
        }

    def object_row(self, obj: m.ObjectDef) -> dict[str, Any]:
        row: dict[str, Any] = {"kind": "unknown_object" if isinstance(obj, m.UnknownObject) else obj.kind.label}
        row["id"], row["label"] = obj.id, obj.label
        if isinstance(obj, m.Device):
            row.update(
                ordinal=obj.ordinal,
                name=obj.name,
                uuid=obj.uuid.hex(),
                compute_capability=f"{obj.compute_capability[0]}.{obj.compute_capability[1]}",
                total_memory=obj.total_memory,
                driver_version=obj.driver_version,
                multiprocessor_count=obj.multiprocessor_count,
            )
        elif isinstance(obj, m.Stream):
            row.update(device=obj.device, priority=obj.priority, flags=obj.flags)
        elif isinstance(obj, m.Event):
            row.update(device=obj.device, flags=obj.flags)
        elif isinstance(obj, m.Buffer):
            row.update(
                device=obj.device,
                size=obj.size,
                alignment=obj.alignment,
                address=f"{obj.address:#x}",
                memory=label_of(obj.memory),
                dtype=label_of(obj.dtype),
                shape=list(obj.shape),
                strides=list(obj.strides),
                element_offset=obj.element_offset,
                requires_fixed_address=obj.requires_fixed_address,
                ranges=[{"offset": r.offset, "size": r.size, "dtype": label_of(r.dtype)} for r in obj.ranges],
                module_global=obj.module_global,
            )
        elif isinstance(obj, m.Executable):
            row.update(
                format=label_of(obj.format),
                target_arch=obj.target_arch,
                payload=self.payload_ref(obj.payload),
                file=obj.file,
                functions=[_function_row(i, fn) for i, fn in enumerate(obj.functions)],
                **self.code.of(obj).to_json(),
            )
        elif isinstance(obj, m.Global):
            row.update(
                executable=obj.executable,
                symbol=obj.symbol,
                size=obj.size,
                initial_payload=self.payload_ref(obj.initial_payload),
            )
        elif isinstance(obj, m.FileReference):
            row.update(
                path=obj.path,
                size=obj.size,
                device=obj.device,
                inode=obj.inode,
                mtime_ns=obj.mtime_ns,
                digest=hash_hex(obj.digest) if obj.digest else None,
                policy=label_of(obj.policy),
                validation=label_of(obj.validation),
                ranges=[
                    {"offset": r.offset, "size": r.size, "payload": self.payload_ref(r.payload)} for r in obj.ranges
                ],
                payload=self.payload_ref(obj.payload),
            )
        elif isinstance(obj, m.Graph):
            row.update(graph_fields(obj, self.function))
        elif isinstance(obj, m.UnknownObject):
            row["type_code"] = obj.type_code
        return row

    def operation_row(self, op: m.Operation) -> dict[str, Any]:
        """Every operation but launches (which are rendered straight to text)."""
        label = op.kind.label if not isinstance(op, m.UnknownOperation) else "unknown"
        row: dict[str, Any] = {"kind": label, "index": op.index}
        if isinstance(op, m.Copy):
            row.update(
                stream=op.stream,
                src_buffer=op.src_buffer,
                dst_buffer=op.dst_buffer,
                src_offset=op.src_offset,
                dst_offset=op.dst_offset,
                size=op.size,
                src_file=op.src_file,
                flags=op.flags,
                payload=self.payload_ref(op.payload),
            )
            if self._original:
                row["original_ns"] = self._original.duration_ns(op.index)
            if op.relocations:
                row["relocations"] = stored_pointers_rows(op.relocations)
        elif isinstance(op, m.Memset):
            row.update(
                stream=op.stream,
                buffer=op.buffer,
                offset=op.offset,
                value=op.value,
                element_size=op.element_size,
                count=op.count,
            )
            if self._original:
                row["original_ns"] = self._original.duration_ns(op.index)
        elif isinstance(op, m.State):
            row.update(buffer=op.buffer, offset=op.offset, size=op.size, payload=self.payload_ref(op.payload))
            if op.undefined:
                row["undefined"] = True
            if op.relocations:
                row["relocations"] = stored_pointers_rows(op.relocations)
        elif isinstance(op, m.Checkpoint):
            entries = [
                {"buffer": e.buffer, "offset": e.offset, "size": e.size, "payload": self.payload_ref(e.payload)}
                for e in op.entries
            ]
            row.update(name=op.name, entries=entries)
            if op.types:  # (1.3) what the program's framework said the ranges hold
                row["types"] = [typed_tensor_row(t) for t in op.types]
        elif isinstance(op, m.Collective):
            for name in field_names(op):
                row[name] = getattr(op, name)
            row.update(operation=op.operation.label, received=self.payload_ref(op.received) if op.received else None)
        elif isinstance(op, m.UnknownOperation):
            row["code"] = op.code
        else:
            for name in field_names(op):
                row[name] = getattr(op, name)
            if isinstance(op, m.CreateObject | m.DestroyObject):
                obj = self._object_or_none(op.object)
                row["object_kind"] = obj.kind.label if obj is not None else None
        return row

    def launch_json(self, op: m.Launch) -> str:
        index, executable, function, stream, grid, block, cluster, shared_memory, flags, raw, relocations = op
        # Everything but the index and the parameter values is rendered once per distinct launch
        # shape. The reader shares one tuple among equal relocation sets, so the key holds its
        # identity (cheap to hash); the entry holds the launch, so that id stays unique while
        # the entry is cached.
        key = (executable, function, stream, grid, block, cluster, shared_memory, flags, id(relocations))
        entry = self._launch_parts.get(key)
        if entry is None:
            entry = self._launch_entry(op, key)
        render = entry.render
        row = render(raw, entry.targets, _LAUNCH_LEAD, index, entry.prefix, entry.suffix) if render else None
        if row is None:
            row = f'{{"kind":"launch","index":{index}{entry.prefix}"parameter_bytes":"{raw.hex()}"{entry.suffix}'
        return row if not self._original else row[:-1] + self._original_json(index) + "}"

    def _launch_entry(self, op: m.Launch, key: tuple[int, ...]) -> _LaunchParts:
        template = self._templates.get((op.executable, op.function))
        if template is None:
            template = self._templates[(op.executable, op.function)] = LaunchTemplate(
                self.function(op.executable, op.function), op.executable, op.function
            )
        g, b, c = op.grid, op.block, op.cluster
        prefix = (
            f'{template.head}"stream":{op.stream},"grid":[{g[0]},{g[1]},{g[2]}],"block":[{b[0]},{b[1]},{b[2]}],'
            f'"cluster":[{c[0]},{c[1]},{c[2]}],"shared_memory":{op.shared_memory},"flags":{op.flags},'
        )
        relocations = ",".join(
            f'{{"site_buffer":{r.site_buffer},"site_offset":{r.site_offset},"target_buffer":{r.target_buffer},'
            f'"target_offset":{r.target_offset},"kind":"{"tensor_map" if r.kind == 1 else "pointer"}"}}'
            for r in op.relocations
        )
        targets = template.targets(op.relocations) if template.render is not None else ()
        entry = _LaunchParts(prefix, template.render, targets, f',"relocations":[{relocations}]}}', op)
        if len(self._launch_parts) >= _CACHE_LIMIT:
            self._launch_parts.clear()
        self._launch_parts[key] = entry
        return entry

    def _original_json(self, index: int) -> str:
        """``,"original_ns":N`` (null: not timed) when the capture carries the original's times."""
        if not self._original:
            return ""
        value = self._original.duration_ns(index)
        return f',"original_ns":{"null" if value is None else value}'

    def payload_json(self, pid: int) -> str:
        text = self._payload_json.get(pid)
        if text is None:
            if len(self._payload_json) >= _CACHE_LIMIT:
                self._payload_json.clear()
            text = self._payload_json[pid] = json.dumps(self.payload_ref(pid), separators=(",", ":"))
        return text

    def operation_json(self, op: m.Operation) -> str:
        """One operation row as JSON text: the same keys, in the same order, as operation_row()."""
        if isinstance(op, m.Launch):
            return self.launch_json(op)
        if isinstance(op, m.Copy):
            return (
                f'{{"kind":"{op.op.label}","index":{op.index},"stream":{op.stream},"src_buffer":{op.src_buffer},'
                f'"dst_buffer":{op.dst_buffer},"src_offset":{op.src_offset},"dst_offset":{op.dst_offset},'
                f'"size":{op.size},"src_file":{op.src_file},"flags":{op.flags},"payload":{self.payload_json(op.payload)}'
                f"{self._original_json(op.index)}{stored_pointers_json(op.relocations)}}}"
            )
        if isinstance(op, m.Memset):
            return (
                f'{{"kind":"memset","index":{op.index},"stream":{op.stream},"buffer":{op.buffer},"offset":{op.offset},'
                f'"value":{op.value},"element_size":{op.element_size},"count":{op.count}{self._original_json(op.index)}}}'
            )
        id_row = _ID_ROWS.get(type(op))
        if id_row is not None:
            text, fields = id_row
            return text.format(*fields(op))
        return self._encode(self.operation_row(op))

    def _object_or_none(self, object_id: int) -> m.ObjectDef | None:
        try:
            return self.cap.object(object_id)
        except KeyError:
            return None

    # -- filtering -----------------------------------------------------------------------------

    def _op_selected(self, op: m.Operation, label: str) -> bool:
        f = self.filter
        if not f.wants_kind(label):
            return False
        if f.object_id is not None and f.object_id not in _ids_of(op):
            return False
        return f.grep is None or any(f.grep.search(name) for name in self._names_of(op))

    def _object_selected(self, obj: m.ObjectDef) -> bool:
        f = self.filter
        label = "unknown_object" if isinstance(obj, m.UnknownObject) else obj.kind.label
        if not f.wants_kind(label):
            return False
        if f.object_id is not None and obj.id != f.object_id:
            return False
        return f.grep is None or any(f.grep.search(n) for n in object_names(obj))

    def _names_of(self, op: m.Operation) -> list[str]:
        if isinstance(op, m.Launch):
            fn = self.function(op.executable, op.function)
            return [fn.name, demangle(fn.name)] if fn else []
        if isinstance(op, m.ScopeBegin | m.ScopeEnd):
            return [op.name]
        if isinstance(op, m.Checkpoint):
            return [op.name]
        if isinstance(op, m.Unsupported):
            return [op.call, op.reason]
        if isinstance(op, m.GraphLaunch):  # --grep finds a graph launch by its kernel nodes
            graph = self._object_or_none(op.graph)
            return kernel_names(graph, self.function) if isinstance(graph, m.Graph) else []
        if isinstance(op, m.CreateObject | m.DestroyObject):
            obj = self._object_or_none(op.object)
            return object_names(obj) if obj is not None else []
        return []

    # -- streams -------------------------------------------------------------------------------

    def records(self) -> Iterator[tuple[m.Operation, m.ObjectDef | None]]:
        """(operation, object it creates or None) for the operations in the filter's range."""
        cap = self.cap
        for op in cap.iter_operations(self.filter.start, self.filter.stop):
            obj = cap.object(op.object) if isinstance(op, m.CreateObject) and op.object <= cap.object_count else None
            yield op, obj

    def jsonl_rows(self) -> Iterator[str]:
        """The object and operation rows (after the file and summary rows) as JSON text."""
        encode = self._encode
        launch_json, operation_json = self.launch_json, self.operation_json
        launch = _K.LAUNCH
        plain = self.filter.kinds is None and self.filter.object_id is None and self.filter.grep is None
        cap, parts = self.cap, self._launch_parts
        fast = not self._original  # a capture with the original's times adds original_ns to each row
        for op in cap.iter_operations(self.filter.start, self.filter.stop):
            if op.kind is launch:
                if plain or self._op_selected(op, "launch"):
                    # launch_json() inlined for a launch shape seen before: the hot loop of JSONL
                    index, executable, function, stream, grid, block, cluster, smem, flags, raw, relocs = op
                    entry = parts.get((executable, function, stream, grid, block, cluster, smem, flags, id(relocs)))
                    if fast and entry is not None and entry.render is not None:
                        row = entry.render(raw, entry.targets, _LAUNCH_LEAD, index, entry.prefix, entry.suffix)
                        if row is not None:
                            yield row
                            continue
                    yield launch_json(op)
                continue
            if isinstance(op, m.CreateObject) and op.object <= cap.object_count:
                obj = cap.object(op.object)
                if plain or self._object_selected(obj):
                    yield encode(self.object_row(obj))
            if plain or self._op_selected(op, op.kind.label if not isinstance(op, m.UnknownOperation) else "unknown"):
                yield operation_json(op)

    def text_lines(self) -> Iterator[str]:
        """One line per object and operation, with its index and ids."""
        for op, obj in self.records():
            if obj is not None and self._object_selected(obj):
                yield object_text(obj, self.code.of(obj) if isinstance(obj, m.Executable) else None)
                if isinstance(obj, m.Graph):
                    yield from graph_node_lines(obj, self.function)
            label = op.kind.label if not isinstance(op, m.UnknownOperation) else "unknown"
            if self._op_selected(op, label):
                yield self._op_text(op, label)

    def _op_text(self, op: m.Operation, label: str) -> str:
        head = f"op {op.index:>7} {label:<18}"
        if isinstance(op, m.Launch):
            fn = self.function(op.executable, op.function)
            name = demangle(fn.name) if fn else f"function#{op.function}"
            extra = f" cluster={_xyz(op.cluster)}" if any(op.cluster) else ""
            return (
                f"{head} {name} exe={op.executable} stream={op.stream} grid={_xyz(op.grid)} "
                f"block={_xyz(op.block)}{extra} smem={op.shared_memory}{launch_flags_text(op.flags)} "
                f"params={len(op.parameters)}B "
                f"relocs={len(op.relocations)}{self._original_text(op.index)}"
            )
        if isinstance(op, m.Copy):
            src = (
                f"file#{op.src_file}+{op.src_offset}"
                if op.src_file
                else (f"buffer#{op.src_buffer}+{op.src_offset}" if op.src_buffer else f"payload#{op.payload}")
            )
            dst = f"buffer#{op.dst_buffer}+{op.dst_offset}" if op.dst_buffer else "host"
            pointers = stored_pointers_text(op.relocations)
            return f"{head} {src} -> {dst} size={op.size} stream={op.stream}{self._original_text(op.index)}{pointers}"
        if isinstance(op, m.Memset):
            return (
                f"{head} buffer#{op.buffer}+{op.offset} value={op.value:#x} x{op.count} "
                f"({op.element_size}B) stream={op.stream}{self._original_text(op.index)}"
            )
        if isinstance(op, m.CreateObject | m.DestroyObject):
            obj = self._object_or_none(op.object)
            return f"{head} {obj.kind.label if obj else 'object'}#{op.object}"
        if isinstance(op, m.State):
            what = "starting state, undefined: none of the program's data" if op.undefined else "starting state"
            state = f"payload#{op.payload} -> buffer#{op.buffer}+{op.offset} size={op.size} ({what})"
            return f"{head} {state}{stored_pointers_text(op.relocations)}"
        if isinstance(op, m.Checkpoint):
            entries = ", ".join(f"buffer#{e.buffer}+{e.offset}:{e.size}" for e in op.entries)
            return f"{head} {op.name!r} {entries}" + (f" ({len(op.types)} typed range(s))" if op.types else "")
        if isinstance(op, m.Unsupported):
            return f"{head} {op.call}: {op.reason}"
        if isinstance(op, m.Collective):
            return f"{head} {collective_text(op)}{self._original_text(op.index)}"
        if isinstance(op, m.UnknownOperation):
            return f"{head} code={op.code}"
        fields = " ".join(f"{n}={getattr(op, n)}" for n in field_names(op))
        return f"{head} {fields}"

    def _original_text(self, index: int) -> str:
        value = self._original.duration_ns(index) if self._original else None
        return "" if value is None else f" original={value / 1e3:.3f}us"


def _id_row_template(kind: m.OperationKind, cls: type) -> tuple[str, Any]:
    """A row of an id-only operation as a str.format template and the getter of its values."""
    names = tuple(f.name for f in dataclasses.fields(cls) if f.name != "index")
    keys = "".join(f',"{n}":{{{i + 1}}}' for i, n in enumerate(names))
    return f'{{{{"kind":"{kind.label}","index":{{0}}{keys}}}}}', operator.attrgetter("index", *names)


# Create/destroy rows also name the object's kind: they take the general path.
_ID_ROWS = {
    cls: _id_row_template(kind, cls)
    for kind, (cls, _) in ID_OPERATIONS.items()
    if kind not in (m.OperationKind.CREATE_OBJECT, m.OperationKind.DESTROY_OBJECT)
}


def _xyz(d: tuple[int, int, int]) -> str:
    return f"{d[0]},{d[1]},{d[2]}"


def _function_row(index: int, fn: m.Function) -> dict[str, Any]:
    readable = demangle(fn.name)
    return {
        "index": index,
        "name": fn.name,
        **({"demangled": readable} if readable != fn.name else {}),
        "parameters_known": fn.parameters_known,
        "parameters": [
            {"offset": p.offset, "size": p.size, "kind": label_of(p.kind), "name": p.name, "dtype": label_of(p.dtype)}
            for p in fn.parameters
        ],
        "registers": fn.registers,
        "static_shared_memory": fn.static_shared_memory,
        "max_dynamic_shared_memory": fn.max_dynamic_shared_memory,
        "max_threads_per_block": fn.max_threads_per_block,
        "local_memory": fn.local_memory,
        "required_cluster": list(fn.required_cluster),
    }


def _ids_of(op: m.Operation) -> set[int]:
    """Every object id an operation refers to (for --object): the one table's
    (replayfmt.format.uses)."""
    return set(uses(op).ids())


def collective_text(op: m.Collective) -> str:
    """One rank's collective as dump-replay shows it, e.g. ``AllReduce 1024 x dtype 7 (op 0)
    buffer#3+0 -> buffer#3+0, rank 0 of 2 on c3f1 stream=2``."""
    send = f"buffer#{op.send_buffer}+{op.send_offset}" if op.send_size else "-"
    recv = f"buffer#{op.recv_buffer}+{op.recv_offset}" if op.recv_size else "-"
    root = f" root/peer {op.root}" if op.root >= 0 else ""
    group = f" group {op.group}" if op.group else ""
    received = f", received payload#{op.received}" if op.received else ""
    return (
        f"{op.operation.label} {op.count} x dtype {op.datatype} (reduction {op.reduction}){root} {send} -> {recv}, "
        f"rank {op.rank} of {op.ranks} on {op.communicator}{group} stream={op.stream}{received}"
    )
