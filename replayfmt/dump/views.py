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
import enum
import functools
import json
import os
import re
import struct
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from replayfmt import __version__
from replayfmt.container.reader import Capture
from replayfmt.errors import ReplayFormatError, ReplayUsageError
from replayfmt.format import model as m
from replayfmt.format.payloads import hash_hex
from replayfmt.format.records import ID_OPERATIONS

JSONL_VERSION = 1
_CACHE_LIMIT = 65536
_K = m.OperationKind
_COPY_LABELS = {"copy_h2d", "copy_d2h", "copy_d2d"}
OPERATION_LABELS = {k.label for k in _K if k != _K.NONE}
OBJECT_LABELS = {k.label for k in m.ObjectKind if k != m.ObjectKind.NONE}
ROW_KINDS = OPERATION_LABELS | OBJECT_LABELS | {"copy", "unknown", "unknown_object"}


class PayloadMode(enum.Enum):
    NONE = "none"
    HEX = "hex"
    BASE64 = "base64"
    FILES = "files"


@dataclass(frozen=True)
class DumpFilter:
    """Which rows to produce. ``kinds`` holds row kind labels ("launch", "buffer", "copy", ...)."""

    start: int = 0
    stop: int | None = None
    kinds: frozenset[str] | None = None
    object_id: int | None = None
    grep: re.Pattern[str] | None = None

    @classmethod
    def parse(
        cls, *, ops: str | None = None, kinds: str | None = None, object_id: int | None = None, grep: str | None = None
    ) -> DumpFilter:
        """Build a filter from the command-line spellings (``--ops=START:END`` etc.)."""
        start, stop = 0, None
        if ops:
            lo, sep, hi = ops.partition(":")
            try:
                start = int(lo) if lo else 0
                stop = (int(hi) if hi else None) if sep else start + 1
            except ValueError:
                raise ReplayUsageError(f"--ops {ops!r}: expected START:END (operation indices)") from None
            if start < 0 or (stop is not None and stop < start):
                raise ReplayUsageError(f"--ops {ops!r}: START must be >= 0 and END >= START")
        kind_set = None
        if kinds:
            kind_set = frozenset(k.strip() for k in kinds.split(",") if k.strip())
            unknown = sorted(kind_set - ROW_KINDS)
            if unknown:
                raise ReplayUsageError(
                    f"--kind: unknown kind(s) {', '.join(unknown)}; known: {', '.join(sorted(ROW_KINDS))}"
                )
            if "copy" in kind_set:
                kind_set |= _COPY_LABELS
        pattern = None
        if grep:
            try:
                pattern = re.compile(grep)
            except re.error as exc:
                raise ReplayUsageError(f"--grep {grep!r}: invalid regular expression ({exc})") from None
        return cls(start, stop, kind_set, object_id, pattern)

    def wants_kind(self, label: str) -> bool:
        return self.kinds is None or label in self.kinds


# ----------------------------------------------------------------------------------------------
# Summary


@dataclass
class Summary:
    format_version: str
    tool: str
    tool_version: str
    created_unix_ns: int
    host: str
    gpu: str
    driver: str
    command_line: tuple[str, ...]
    objects: dict[str, int] = field(default_factory=dict)
    operations: dict[str, int] = field(default_factory=dict)
    unsupported: dict[str, int] = field(default_factory=dict)
    scopes: dict[str, int] = field(default_factory=dict)
    files: dict[str, int] = field(default_factory=dict)  # "policy/validation" -> count
    payloads: int = 0
    payload_logical_bytes: int = 0
    payload_stored_bytes: int = 0
    compression_ratio: float = 1.0
    dedup_saved_bytes: int = 0
    missing_frames: int = 0
    recovered: bool = False
    discarded_bytes: int = 0
    recovery_reason: str = ""
    damaged: str = ""
    replayable: bool = True
    not_replayable_because: list[str] = field(default_factory=list)
    operation_count: int = 0
    object_count: int = 0

    def as_row(self) -> dict[str, Any]:
        row: dict[str, Any] = {"kind": "summary"}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            row[name] = list(value) if isinstance(value, tuple) else value
        return row


def summarize(cap: Capture) -> Summary:
    """Counts and verdicts over a whole capture; a damaged batch ends the count and is noted."""
    meta = cap.metadata
    s = Summary(
        format_version=f"{cap.header.major}.{cap.header.minor}",
        tool=meta.tool, tool_version=meta.tool_version, created_unix_ns=meta.created_unix_ns,
        host=meta.host, gpu=meta.gpu, driver=meta.driver, command_line=meta.command_line,
        recovered=cap.recovered, discarded_bytes=cap.discarded_bytes, recovery_reason=cap.recovery_reason,
        operation_count=cap.operation_count, object_count=cap.object_count,
    )  # fmt: skip
    kind_counts: Counter[int] = Counter()
    objects: Counter[str] = Counter()
    unsupported: Counter[str] = Counter()
    scopes: Counter[str] = Counter()
    files: Counter[str] = Counter()
    open_scopes: list[tuple[str, int]] = []
    problems: list[str] = []
    try:
        for bi in range(cap.batch_count):
            batch = cap._batch(bi)
            codes, counts = np.unique(batch.kinds, return_counts=True)
            kind_counts.update(dict(zip(codes.tolist(), counts.tolist())))
            for op in batch.table_ops:
                kind = op.kind
                if kind == _K.UNSUPPORTED:
                    unsupported[op.call] += 1
                elif kind == _K.SCOPE_BEGIN:
                    scopes[op.name] += 1
                    open_scopes.append((op.name, op.index))
                elif kind == _K.SCOPE_END:
                    if not open_scopes or open_scopes[-1][0] != op.name:
                        problems.append(f"scope end '{op.name}' at operation {op.index} matches no open scope")
                    else:
                        open_scopes.pop()
                elif isinstance(op, m.UnknownOperation):
                    problems.append(f"operation {op.index} has kind {op.code}, unknown to this reader")
            for obj in batch.objects:
                objects[obj.kind.label if not isinstance(obj, m.UnknownObject) else "unknown_object"] += 1
                if isinstance(obj, m.FileReference):
                    files[f"{_label(obj.policy)}/{_label(obj.validation)}"] += 1
                    if obj.policy == m.FilePolicy.FAIL:
                        problems.append(f"file reference {obj.id} ({obj.path}) was refused at capture (policy fail)")
                elif isinstance(obj, m.UnknownObject):
                    problems.append(f"object {obj.id} has kind {obj.type_code}, unknown to this reader")
        stats = cap.payload_stats()
        s.payloads, s.payload_logical_bytes = stats.payloads, stats.logical_bytes
        s.payload_stored_bytes, s.compression_ratio = stats.stored_bytes, round(stats.compression_ratio, 4)
        s.dedup_saved_bytes, s.missing_frames = stats.dedup_saved_bytes, stats.missing_frames
    except ReplayFormatError as exc:
        s.damaged = str(exc)
        problems.append(f"the file is damaged: {exc}")
    for name, index in open_scopes:
        problems.append(f"scope '{name}' opened at operation {index} is never closed")
    s.operations = {_K(k).label if k in m.OperationKind._value2member_map_ else f"unknown_{k}": n
                    for k, n in sorted(kind_counts.items())}  # fmt: skip
    s.objects, s.unsupported, s.scopes, s.files = dict(objects), dict(unsupported), dict(scopes), dict(files)
    if unsupported:
        calls = ", ".join(f"{name} x{n}" for name, n in unsupported.most_common())
        problems.insert(0, f"unsupported operations: {calls}")
    if s.missing_frames:
        problems.append(f"{s.missing_frames} payload frame(s) missing (the capture was cut short)")
    s.not_replayable_because = [p for p in problems if not p.startswith(("scope end", "scope '"))]
    s.replayable = not s.not_replayable_because
    s.not_replayable_because += [p for p in problems if p.startswith(("scope end", "scope '"))]
    return s


def _label(value: Any) -> str:
    """The lower-case name of an enum value; ``unknown_N`` for a value from a newer writer."""
    if hasattr(value, "label"):
        return value.label
    if isinstance(value, enum.Enum):
        return value.name.lower()
    return f"unknown_{int(value)}"


@functools.cache
def _fields_of(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if f.name != "index")


def _field_names(op: Any) -> tuple[str, ...]:
    return _fields_of(type(op))


def render_summary_text(s: Summary) -> list[str]:
    def counts(d: dict[str, int]) -> str:
        return ", ".join(f"{k} {v}" for k, v in d.items()) or "none"

    lines = [
        f"format        {s.format_version}",
        f"captured by   {s.tool or '?'} {s.tool_version}".rstrip(),
        f"host          {s.host or '?'}   gpu {s.gpu or '?'}   driver {s.driver or '?'}",
    ]
    if s.command_line:
        lines.append(f"command       {' '.join(s.command_line)}")
    lines += [
        f"objects       {s.object_count}: {counts(s.objects)}",
        f"operations    {s.operation_count}: {counts(s.operations)}",
        f"unsupported   {counts(s.unsupported)}",
        f"scopes        {counts(s.scopes)}",
        f"files         {counts(s.files)}",
        f"payloads      {s.payloads}: {_size(s.payload_logical_bytes)} logical, "
        f"{_size(s.payload_stored_bytes)} stored, compression {s.compression_ratio:.2f}x, "
        f"dedup saved {_size(s.dedup_saved_bytes)}",
    ]
    if s.recovered:
        lines.append(f"recovered     yes: {s.discarded_bytes} bytes discarded ({s.recovery_reason})")
    else:
        lines.append("recovered     no (index and footer intact)")
    if s.replayable:
        lines.append("replayable    yes (strict)")
    else:
        lines.append("replayable    no:")
        lines += [f"  - {reason}" for reason in s.not_replayable_because]
    return lines


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


# ----------------------------------------------------------------------------------------------
# Rows

_DTYPE_FORMATS = {
    m.DType.BOOL: "?", m.DType.INT8: "b", m.DType.UINT8: "B", m.DType.INT16: "h", m.DType.UINT16: "H",
    m.DType.INT32: "i", m.DType.UINT32: "I", m.DType.INT64: "q", m.DType.UINT64: "Q", m.DType.FLOAT16: "e",
    m.DType.FLOAT32: "f", m.DType.FLOAT64: "d",
}  # fmt: skip
_SIZE_FORMATS = {1: "B", 2: "H", 4: "I", 8: "Q"}


_POINTER, _TENSOR_MAP = int(m.ParameterKind.POINTER), int(m.ParameterKind.TENSOR_MAP)


def _float_json(value: float) -> str:
    text = repr(value)
    return text if text[-1].isdigit() else f'"{text}"'  # "nan", "inf", "-inf": strict JSON has no such numbers


class _LaunchTemplate:
    """Renders launch rows of one (executable, function) as JSON text quickly.

    When the function's parameter layout is known, one precompiled struct unpacks every parameter
    at once and each is written under its name: values typed by dtype, relocated pointers as
    {"buffer", "offset"}, other pointers as hex strings, opaque blobs (tensor maps) as hex.
    """

    def __init__(self, dumper: Dumper, executable: int, function: int) -> None:
        fn = dumper.function(executable, function)
        self.name = fn.name if fn else ""
        self.head = f',"executable":{executable},"function":{json.dumps(self.name)},"function_index":{function},'
        self.render: Any = None
        self.slots: list[tuple[str, int, int, str]] = []
        if fn is None or not fn.parameters_known:
            return
        fmt, end, seen = "<", 0, set()
        params = sorted(fn.parameters, key=lambda p: p.offset)
        for i, p in enumerate(params):
            if p.offset < end:
                return  # overlapping parameters: leave this function to the raw-bytes form
            fmt += "x" * (p.offset - end)
            name = p.name if p.name and p.name not in seen else f"p{i}"
            seen.add(name)
            if p.kind == m.ParameterKind.POINTER and p.size == 8:
                code, conv = "Q", "pointer"
            elif p.dtype == m.DType.BFLOAT16 and p.size == 2:
                code, conv = "H", "bf16"
            elif p.dtype in _DTYPE_FORMATS and struct.calcsize("<" + _DTYPE_FORMATS[p.dtype]) == p.size:
                code = _DTYPE_FORMATS[p.dtype]
                conv = "float" if code in "efd" else ("bool" if code == "?" else "int")
            elif p.kind != m.ParameterKind.TENSOR_MAP and p.size in _SIZE_FORMATS:
                code, conv = _SIZE_FORMATS[p.size], "int"
            else:
                code, conv = f"{p.size}s", "hex"
            fmt += code
            end = p.offset + p.size
            self.slots.append((json.dumps(name) + ":", p.offset, int(p.kind), conv))
        self.render = _compile_renderer(struct.Struct(fmt), self.slots)

    def parameters_json(self, op: m.Launch) -> str:
        raw = op.parameters
        if self.render is not None:
            text = self.render(raw, op.relocations)
            if text is not None:
                return text
        return f'"parameter_bytes":"{raw.hex()}"'


def _bf16_json(value: int) -> str:
    return _float_json(struct.unpack("<f", (value << 16).to_bytes(4, "little"))[0])


def _target_json(relocation: m.Relocation | None) -> str | None:
    return f'{{"buffer":{relocation[1]},"offset":{relocation[3]}}}' if relocation else None


def _hex_json(value: int | bytes) -> str:
    return f'"{value:#x}"' if isinstance(value, int) else f'"{value.hex()}"'


def _compile_renderer(unpack: struct.Struct, slots: list[tuple[str, int, int, str]]) -> Any:
    """Build, once per kernel signature, a function that renders the "parameters" object.

    Unrolled code (one unpack, one concatenation) is several times faster than interpreting the
    layout for every launch: this is what keeps JSONL fast. Which buffer each relocated pointer
    names depends only on the launch's relocations, which repeat from launch to launch, so that
    part is worked out once per distinct relocation set. The generated code holds no literals:
    every string it joins comes from the namespace below.
    """
    values = ", ".join(f"v{i}" for i in range(len(slots)))
    pointers = [(i, offset) for i, (_, offset, kind, _) in enumerate(slots) if kind in (_POINTER, _TENSOR_MAP)]
    namespace: dict[str, Any] = {
        "UNPACK": unpack.unpack_from, "SIZE": unpack.size, "FLOAT": _float_json, "BF16": _bf16_json,
        "HEX": _hex_json, "TARGET": _target_json, "CACHE": {}, "TRUE": "true", "FALSE": "false",
        "HEAD": '"parameters":', "TAIL": "}",
    }  # fmt: skip
    lines = [
        "def render(raw, relocations):",
        "    if len(raw) < SIZE:",
        "        return None",
        f"    ({values},) = UNPACK(raw)",
    ]
    if pointers:
        targets = ", ".join(f"t{i}" for i, _ in pointers)
        lines += ["    targets = CACHE.get(relocations)", "    if targets is None:"]
        lines += [f"        r{i} = None" for i, _ in pointers]
        lines += ["        for r in relocations:", "            if not r[0]:", "                o = r[2]"]
        lines += [
            f"                {'elif' if n else 'if'} o == {off}: r{i} = r" for n, (i, off) in enumerate(pointers)
        ]
        lines += [f"        targets = ({', '.join(f'TARGET(r{i})' for i, _ in pointers)},)"]
        lines += ["        if len(CACHE) > 4096:", "            CACHE.clear()", "        CACHE[relocations] = targets"]
        lines += [f"    ({targets},) = targets"]
    pieces = ["HEAD"]
    for i, (key, _offset, kind, conv) in enumerate(slots):
        namespace[f"K{i}"] = ("{" if i == 0 else ",") + key
        if kind in (_POINTER, _TENSOR_MAP):
            value = f"(t{i} or HEX(v{i}))"
        else:
            value = {"int": f"str(v{i})", "float": f"FLOAT(v{i})", "bool": f"(TRUE if v{i} else FALSE)",
                     "bf16": f"BF16(v{i})"}.get(conv, f"HEX(v{i})")  # fmt: skip
        pieces += [f"K{i}", value]
    pieces.append("TAIL" if slots else "'{}'")
    lines.append("    return " + " + ".join(pieces))
    exec("\n".join(lines), namespace)
    return namespace["render"]


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
            try:
                payload_dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ReplayUsageError(f"--payloads=files:{payload_dir}: cannot create ({exc.strerror})") from None
        self._templates: dict[tuple[int, int], _LaunchTemplate] = {}
        self._relocations_json: dict[tuple[m.Relocation, ...], str] = {}
        self._shapes: dict[tuple[Any, ...], str] = {}
        self._payload_json: dict[int, str] = {}
        self._encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
        self._payload_refs: dict[int, dict[str, Any] | None] = {}
        self._executables: dict[int, m.Executable | None] = {}

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
            ref = self._payload_refs[pid] = self._make_payload_ref(pid)
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
            "id": pid, "hash": info.hash_hex, "size": info.size,
            "stored_size": self.cap.payload_stored_size(info), "codec": codec,
        }  # fmt: skip
        if self.payload_mode != PayloadMode.NONE and not missing:
            if self.payload_mode == PayloadMode.FILES:
                assert self.payload_dir is not None
                target = self.payload_dir / f"{info.hash_hex}.bin"
                if not (target.exists() and target.stat().st_size == info.size):
                    tmp = target.with_suffix(".tmp")
                    tmp.write_bytes(self.cap.read_payload(pid))
                    os.replace(tmp, target)
                ref["file"] = str(target)
            else:
                data = self.cap.read_payload(pid)
                ref["data"] = data.hex() if self.payload_mode == PayloadMode.HEX else base64.b64encode(data).decode()
        return ref

    # -- rows ---------------------------------------------------------------------------------

    def file_row(self) -> dict[str, Any]:
        h = self.cap.header
        return {
            "kind": "file", "path": self.cap.path, "size": self.cap.size,
            "format_version": f"{h.major}.{h.minor}", "format_major": h.major, "format_minor": h.minor,
            "jsonl_version": JSONL_VERSION, "replayfmt_version": __version__,
        }  # fmt: skip

    def object_row(self, obj: m.ObjectDef) -> dict[str, Any]:
        row: dict[str, Any] = {"kind": "unknown_object" if isinstance(obj, m.UnknownObject) else obj.kind.label}
        row["id"], row["label"] = obj.id, obj.label
        if isinstance(obj, m.Device):
            row.update(ordinal=obj.ordinal, name=obj.name, uuid=obj.uuid.hex(),
                       compute_capability=f"{obj.compute_capability[0]}.{obj.compute_capability[1]}",
                       total_memory=obj.total_memory, driver_version=obj.driver_version,
                       multiprocessor_count=obj.multiprocessor_count)  # fmt: skip
        elif isinstance(obj, m.Stream):
            row.update(device=obj.device, priority=obj.priority, flags=obj.flags)
        elif isinstance(obj, m.Event):
            row.update(device=obj.device, flags=obj.flags)
        elif isinstance(obj, m.Buffer):
            row.update(device=obj.device, size=obj.size, alignment=obj.alignment, address=f"{obj.address:#x}",
                       memory=_label(obj.memory), dtype=_label(obj.dtype), shape=list(obj.shape),
                       strides=list(obj.strides), element_offset=obj.element_offset,
                       requires_fixed_address=obj.requires_fixed_address)  # fmt: skip
        elif isinstance(obj, m.Executable):
            row.update(format=_label(obj.format), target_arch=obj.target_arch,
                       payload=self.payload_ref(obj.payload), file=obj.file,
                       functions=[_function_row(i, fn) for i, fn in enumerate(obj.functions)])  # fmt: skip
        elif isinstance(obj, m.Global):
            row.update(executable=obj.executable, symbol=obj.symbol, size=obj.size,
                       initial_payload=self.payload_ref(obj.initial_payload))  # fmt: skip
        elif isinstance(obj, m.FileReference):
            row.update(path=obj.path, size=obj.size, device=obj.device, inode=obj.inode, mtime_ns=obj.mtime_ns,
                       digest=hash_hex(obj.digest) if obj.digest else None, policy=_label(obj.policy),
                       validation=_label(obj.validation),
                       ranges=[{"offset": r.offset, "size": r.size, "payload": self.payload_ref(r.payload)}
                               for r in obj.ranges],
                       payload=self.payload_ref(obj.payload))  # fmt: skip
        elif isinstance(obj, m.UnknownObject):
            row["type_code"] = obj.type_code
        return row

    def operation_row(self, op: m.Operation) -> dict[str, Any]:
        """Every operation but launches (which are rendered straight to text)."""
        label = op.kind.label if not isinstance(op, m.UnknownOperation) else "unknown"
        row: dict[str, Any] = {"kind": label, "index": op.index}
        if isinstance(op, m.Copy):
            row.update(stream=op.stream, src_buffer=op.src_buffer, dst_buffer=op.dst_buffer, src_offset=op.src_offset,
                       dst_offset=op.dst_offset, size=op.size, src_file=op.src_file, flags=op.flags,
                       payload=self.payload_ref(op.payload))  # fmt: skip
        elif isinstance(op, m.Memset):
            row.update(stream=op.stream, buffer=op.buffer, offset=op.offset, value=op.value,
                       element_size=op.element_size, count=op.count)  # fmt: skip
        elif isinstance(op, m.Checkpoint):
            entries = [
                {"buffer": e.buffer, "offset": e.offset, "size": e.size, "payload": self.payload_ref(e.payload)}
                for e in op.entries
            ]
            row.update(name=op.name, entries=entries)
        elif isinstance(op, m.UnknownOperation):
            row["code"] = op.code
        else:
            for name in _field_names(op):
                row[name] = getattr(op, name)
            if isinstance(op, m.CreateObject | m.DestroyObject):
                obj = self._object_or_none(op.object)
                row["object_kind"] = obj.kind.label if obj is not None else None
        return row

    def launch_json(self, op: m.Launch) -> str:
        key = (op.executable, op.function)
        template = self._templates.get(key)
        if template is None:
            template = self._templates[key] = _LaunchTemplate(self, op.executable, op.function)
        shape_key = (op.grid, op.block, op.cluster, op.shared_memory, op.flags, op.stream)
        shape = self._shapes.get(shape_key)
        if shape is None:
            if len(self._shapes) >= _CACHE_LIMIT:
                self._shapes.clear()
            g, b, c = op.grid, op.block, op.cluster
            shape = self._shapes[shape_key] = (
                f'"stream":{op.stream},"grid":[{g[0]},{g[1]},{g[2]}],"block":[{b[0]},{b[1]},{b[2]}],'
                f'"cluster":[{c[0]},{c[1]},{c[2]}],"shared_memory":{op.shared_memory},"flags":{op.flags},'
            )
        relocs = self._relocations_json.get(op.relocations)
        if relocs is None:
            if len(self._relocations_json) >= _CACHE_LIMIT:
                self._relocations_json.clear()
            relocs = self._relocations_json[op.relocations] = ",".join(
                f'{{"site_buffer":{r.site_buffer},"site_offset":{r.site_offset},"target_buffer":{r.target_buffer},'
                f'"target_offset":{r.target_offset},"kind":"{"tensor_map" if r.kind == 1 else "pointer"}"}}'
                for r in op.relocations
            )
        return (
            f'{{"kind":"launch","index":{op.index}{template.head}{shape}{template.parameters_json(op)},'
            f'"relocations":[{relocs}]}}'
        )

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
                f'"size":{op.size},"src_file":{op.src_file},"flags":{op.flags},"payload":{self.payload_json(op.payload)}}}'
            )
        if isinstance(op, m.Memset):
            return (
                f'{{"kind":"memset","index":{op.index},"stream":{op.stream},"buffer":{op.buffer},"offset":{op.offset},'
                f'"value":{op.value},"element_size":{op.element_size},"count":{op.count}}}'
            )
        if type(op) in _ID_ROW_PREFIXES and not isinstance(op, m.CreateObject | m.DestroyObject):
            names = _field_names(op)
            prefix = _ID_ROW_PREFIXES[type(op)]
            fields = ",".join(f'"{n}":{getattr(op, n)}' for n in names)
            return f"{prefix}{op.index},{fields}}}"
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
        return f.grep is None or any(f.grep.search(n) for n in _object_names(obj))

    def _names_of(self, op: m.Operation) -> list[str]:
        if isinstance(op, m.Launch):
            fn = self.function(op.executable, op.function)
            return [fn.name] if fn else []
        if isinstance(op, m.ScopeBegin | m.ScopeEnd):
            return [op.name]
        if isinstance(op, m.Checkpoint):
            return [op.name]
        if isinstance(op, m.Unsupported):
            return [op.call, op.reason]
        if isinstance(op, m.CreateObject | m.DestroyObject):
            obj = self._object_or_none(op.object)
            return _object_names(obj) if obj is not None else []
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
        cap = self.cap
        for op in cap.iter_operations(self.filter.start, self.filter.stop):
            if op.kind == launch:
                if plain or self._op_selected(op, "launch"):
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
                yield _object_text(obj)
            label = op.kind.label if not isinstance(op, m.UnknownOperation) else "unknown"
            if self._op_selected(op, label):
                yield self._op_text(op, label)

    def _op_text(self, op: m.Operation, label: str) -> str:
        head = f"op {op.index:>7} {label:<18}"
        if isinstance(op, m.Launch):
            fn = self.function(op.executable, op.function)
            name = fn.name if fn else f"function#{op.function}"
            extra = f" cluster={_xyz(op.cluster)}" if any(op.cluster) else ""
            return (f"{head} {name} exe={op.executable} stream={op.stream} grid={_xyz(op.grid)} "
                    f"block={_xyz(op.block)}{extra} smem={op.shared_memory} params={len(op.parameters)}B "
                    f"relocs={len(op.relocations)}")  # fmt: skip
        if isinstance(op, m.Copy):
            src = f"file#{op.src_file}+{op.src_offset}" if op.src_file else (
                f"buffer#{op.src_buffer}+{op.src_offset}" if op.src_buffer else f"payload#{op.payload}")  # fmt: skip
            dst = f"buffer#{op.dst_buffer}+{op.dst_offset}" if op.dst_buffer else "host"
            return f"{head} {src} -> {dst} size={op.size} stream={op.stream}"
        if isinstance(op, m.Memset):
            return (f"{head} buffer#{op.buffer}+{op.offset} value={op.value:#x} x{op.count} "
                    f"({op.element_size}B) stream={op.stream}")  # fmt: skip
        if isinstance(op, m.CreateObject | m.DestroyObject):
            obj = self._object_or_none(op.object)
            return f"{head} {obj.kind.label if obj else 'object'}#{op.object}"
        if isinstance(op, m.Checkpoint):
            entries = ", ".join(f"buffer#{e.buffer}+{e.offset}:{e.size}" for e in op.entries)
            return f"{head} {op.name!r} {entries}"
        if isinstance(op, m.Unsupported):
            return f"{head} {op.call}: {op.reason}"
        if isinstance(op, m.UnknownOperation):
            return f"{head} code={op.code}"
        fields = " ".join(f"{n}={getattr(op, n)}" for n in _field_names(op))
        return f"{head} {fields}"


_ID_ROW_PREFIXES = {cls: f'{{"kind":"{kind.label}","index":' for kind, (cls, _) in ID_OPERATIONS.items()}


def _xyz(d: tuple[int, int, int]) -> str:
    return f"{d[0]},{d[1]},{d[2]}"


def _function_row(index: int, fn: m.Function) -> dict[str, Any]:
    return {
        "index": index, "name": fn.name, "parameters_known": fn.parameters_known,
        "parameters": [{"offset": p.offset, "size": p.size, "kind": _label(p.kind), "name": p.name,
                        "dtype": _label(p.dtype)} for p in fn.parameters],
        "registers": fn.registers, "static_shared_memory": fn.static_shared_memory,
        "max_dynamic_shared_memory": fn.max_dynamic_shared_memory,
        "max_threads_per_block": fn.max_threads_per_block, "local_memory": fn.local_memory,
        "required_cluster": list(fn.required_cluster),
    }  # fmt: skip


def _object_names(obj: m.ObjectDef) -> list[str]:
    names = [obj.label] if obj.label else []
    if isinstance(obj, m.Device):
        names.append(obj.name)
    elif isinstance(obj, m.Executable):
        names += [fn.name for fn in obj.functions]
    elif isinstance(obj, m.Global):
        names.append(obj.symbol)
    elif isinstance(obj, m.FileReference):
        names.append(obj.path)
    return names


def _object_text(obj: m.ObjectDef) -> str:
    label = "unknown_object" if isinstance(obj, m.UnknownObject) else obj.kind.label
    head = f"obj {obj.id:>6} {label:<18}"
    tag = f" {obj.label!r}" if obj.label else ""
    if isinstance(obj, m.Device):
        return f"{head}{tag} {obj.name} sm_{obj.compute_capability[0]}{obj.compute_capability[1]} ordinal={obj.ordinal}"
    if isinstance(obj, m.Buffer):
        shape = f" {_label(obj.dtype)}{list(obj.shape)}" if obj.dtype else ""
        return f"{head}{tag} size={obj.size} device={obj.device} address={obj.address:#x}{shape}"
    if isinstance(obj, m.Executable):
        names = ", ".join(fn.name for fn in obj.functions)
        return f"{head}{tag} {_label(obj.format)} {obj.target_arch} payload#{obj.payload} functions: {names}"
    if isinstance(obj, m.FileReference):
        return f"{head}{tag} {obj.path} size={obj.size} policy={_label(obj.policy)} validation={_label(obj.validation)}"
    if isinstance(obj, m.Global):
        return f"{head}{tag} {obj.symbol} exe={obj.executable} size={obj.size}"
    if isinstance(obj, m.Stream | m.Event):
        return f"{head}{tag} device={obj.device} flags={obj.flags}"
    return f"{head}{tag}"


def _ids_of(op: m.Operation) -> set[int]:
    """Every object id an operation refers to (for --object)."""
    if isinstance(op, m.Launch):
        ids = {op.executable, op.stream}
        for r in op.relocations:
            ids.add(r.target_buffer)
            if r.site_buffer:
                ids.add(r.site_buffer)
        return ids
    if isinstance(op, m.Copy):
        return {op.stream, op.src_buffer, op.dst_buffer, op.src_file} - {0}
    if isinstance(op, m.Memset):
        return {op.stream, op.buffer}
    if isinstance(op, m.Checkpoint):
        return {e.buffer for e in op.entries}
    if isinstance(op, m.UnknownOperation | m.ScopeBegin | m.ScopeEnd):
        return set()
    return {getattr(op, n) for n in _field_names(op) if n in ("object", "executable", "device", "event", "stream")}
