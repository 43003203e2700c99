"""The summary dump-replay prints first: counts, sizes, compression and replayability.

The verdict (``replayable`` and why not) is not decided here: it is the plan's, the one every tool
gives (``replayfmt.replay.replayable``), handed in by the caller; this room only reads the file."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from replayfmt.dump.code import CodeTargetCache, capture_targets
from replayfmt.dump.fields import label_of
from replayfmt.errors import ReplayFormatError
from replayfmt.format import model as m
from replayfmt.reader import Capture

_K = m.OperationKind
_KNOWN_KINDS = frozenset(int(k) for k in _K)
_COPY_CODES = [int(_K.COPY_HOST_TO_DEVICE), int(_K.COPY_DEVICE_TO_HOST), int(_K.COPY_DEVICE_TO_DEVICE)]


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
    rank: str = ""  # "R of N (local rank L)": one rank's capture of a job recorded under a launcher
    objects: dict[str, int] = field(default_factory=dict)
    operations: dict[str, int] = field(default_factory=dict)
    unsupported: dict[str, int] = field(default_factory=dict)
    scopes: dict[str, int] = field(default_factory=dict)
    files: dict[str, int] = field(default_factory=dict)  # "policy/validation" -> count
    needs_from_host: list[str] = field(default_factory=list)  # files replay reads from the host
    payloads: int = 0
    payload_logical_bytes: int = 0
    payload_stored_bytes: int = 0
    compression_ratio: float = 1.0
    dedup_saved_bytes: int = 0
    missing_frames: int = 0
    recovered: bool = False
    discarded_bytes: int = 0
    recovery_reason: str = ""
    partial: str = ""  # (1.3) why the capture stopped before its program did; "" complete
    damaged: str = ""
    replayable: bool | None = None  # the plan's verdict (None: not judged)
    not_replayable_because: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # what a replay goes on without; oddities seen
    operation_count: int = 0
    object_count: int = 0
    state_bytes: int = 0  # starting state (format 1.1 state operations): restored, not work
    upload_bytes: int = 0  # host-to-device copies the program made
    stored_pointers: int = 0  # (1.3) pointers inside state and uploads, relocated on replay
    # which GPUs the capture's code loads on (replayfmt.dump.code): sm_XY names, executable ids
    runs_on_by_cubin: list[str] = field(default_factory=list)
    runs_on_by_ptx: list[str] = field(default_factory=list)
    executables_without_ptx: list[int] = field(default_factory=list)
    executables_unknown_targets: list[int] = field(default_factory=list)
    runs_on: str = ""  # the text line

    def as_row(self) -> dict[str, Any]:
        row: dict[str, Any] = {"kind": "summary"}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            row[name] = list(value) if isinstance(value, tuple) else value
        return row


class BatchSketch(NamedTuple):
    """What the summary takes of one record batch: a few counts and the rows it walks in order."""

    kinds: dict[int, int]  # operation kind code -> count
    upload_bytes: int
    stored_pointers: int
    table_ops: list[Any]  # states, unsupported calls, scope markers
    objects: Counter[str]  # object kind label -> count
    files: list[m.FileReference]
    executables: list[m.Executable]  # which GPUs the capture loads on reads their images


_SUMMARY_TABLE_KINDS = frozenset((_K.STATE, _K.UNSUPPORTED, _K.SCOPE_BEGIN, _K.SCOPE_END))


def sketch_batch(batch: Any) -> BatchSketch:
    """The summary's part of a decoded record batch (container.batches.DecodedBatch)."""
    codes, counts = np.unique(batch.kinds, return_counts=True)
    copy_kinds = batch.kinds[np.isin(batch.kinds, _COPY_CODES)]
    objects: Counter[str] = Counter()
    files, executables = [], []
    for obj in batch.objects:
        objects[obj.kind.label if not isinstance(obj, m.UnknownObject) else "unknown_object"] += 1
        if isinstance(obj, m.FileReference):
            files.append(obj)
        elif isinstance(obj, m.Executable):
            executables.append(obj)
    return BatchSketch(
        dict(zip(codes.tolist(), counts.tolist(), strict=True)),
        int(batch.copies["size"][copy_kinds == int(_K.COPY_HOST_TO_DEVICE)].sum()),
        sum(len(rows) for rows in batch.data_relocations.values()),
        [op for op in batch.table_ops if op.kind in _SUMMARY_TABLE_KINDS],
        objects,
        files,
        executables,
    )


def summarize(
    cap: Capture,
    *,
    problems: Sequence[str] | None = None,
    warnings: Sequence[str] = (),
    sketches: Mapping[int, BatchSketch] | None = None,
) -> Summary:
    """Counts over a whole capture; a damaged batch ends the count and is noted. ``problems`` and
    ``warnings`` are the plan's verdict (``replayfmt.replay.replayable``): none given, the summary says
    the capture was not judged. ``sketches``: what :func:`sketch_batch` took of batches as they
    were decoded for something else (those are not decoded again)."""
    meta = cap.metadata
    s = Summary(
        format_version=f"{cap.header.major}.{cap.header.minor}",
        tool=meta.tool,
        tool_version=meta.tool_version,
        created_unix_ns=meta.created_unix_ns,
        host=meta.host,
        gpu=meta.gpu,
        driver=meta.driver,
        command_line=meta.command_line,
        rank=_rank(dict(meta.properties)),
        recovered=cap.recovered,
        discarded_bytes=cap.discarded_bytes,
        recovery_reason=cap.recovery_reason,
        partial=cap.partial,
        operation_count=cap.operation_count,
        object_count=cap.object_count,
    )
    kind_counts: Counter[int] = Counter()
    objects: Counter[str] = Counter()
    unsupported: Counter[str] = Counter()
    scopes: Counter[str] = Counter()
    files: Counter[str] = Counter()
    open_scopes: list[tuple[str, int]] = []
    notes: list[str] = []
    executables: list[m.Executable] = []
    try:
        for bi in range(cap.batch_count):
            sketch = sketches.get(bi) if sketches is not None else None
            sketch = sketch or sketch_batch(cap.batch(bi))
            kind_counts.update(sketch.kinds)
            s.upload_bytes += sketch.upload_bytes
            s.stored_pointers += sketch.stored_pointers
            for op in sketch.table_ops:
                kind = op.kind
                if kind == _K.STATE:
                    s.state_bytes += op.size
                elif kind == _K.UNSUPPORTED:
                    unsupported[op.call] += 1
                elif kind == _K.SCOPE_BEGIN:
                    scopes[op.name] += 1
                    open_scopes.append((op.name, op.index))
                elif kind == _K.SCOPE_END:
                    if not open_scopes or open_scopes[-1][0] != op.name:
                        notes.append(f"scope end '{op.name}' at operation {op.index} matches no open scope")
                    else:
                        open_scopes.pop()
            objects.update(sketch.objects)
            executables.extend(sketch.executables)
            for obj in sketch.files:
                files[f"{label_of(obj.policy)}/{label_of(obj.validation)}"] += 1
                if obj.policy == m.FilePolicy.REFERENCE and obj.path not in s.needs_from_host:
                    s.needs_from_host.append(obj.path)
        stats = cap.payload_stats()
        s.payloads, s.payload_logical_bytes = stats.payloads, stats.logical_bytes
        s.payload_stored_bytes, s.compression_ratio = stats.stored_bytes, round(stats.compression_ratio, 4)
        s.dedup_saved_bytes, s.missing_frames = stats.dedup_saved_bytes, stats.missing_frames
        reach = capture_targets(CodeTargetCache(cap), executables)
        s.runs_on = reach.line()
        s.runs_on_by_cubin, s.runs_on_by_ptx = reach.by_cubin, reach.by_ptx
        s.executables_without_ptx, s.executables_unknown_targets = reach.without_ptx, reach.unreadable
    except ReplayFormatError as exc:
        s.damaged = str(exc)
    for name, index in open_scopes:
        notes.append(f"scope '{name}' opened at operation {index} is never closed")
    s.operations = {_K(k).label if k in _KNOWN_KINDS else f"unknown_{k}": n for k, n in sorted(kind_counts.items())}
    s.objects, s.unsupported, s.scopes, s.files = dict(objects), dict(unsupported), dict(scopes), dict(files)
    if problems is not None:
        s.replayable = not problems
        s.not_replayable_because = list(problems)
    s.warnings = [*warnings, *notes]
    return s


def _rank(properties: dict[str, str]) -> str:
    """The rank a capture's metadata records (capture/ranks.py writes it), as people read it."""
    if "rank" not in properties:
        return ""
    local = properties.get("local_rank")
    return f"{properties['rank']} of {properties.get('world_size', '?')}" + (f" (local rank {local})" if local else "")


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
    if s.rank:
        lines.append(f"rank          {s.rank}")
    lines += [
        f"objects       {s.object_count}: {counts(s.objects)}",
        f"operations    {s.operation_count}: {counts(s.operations)}",
        f"unsupported   {counts(s.unsupported)}",
        f"scopes        {counts(s.scopes)}",
        f"files         {counts(s.files)}",
        "host needs    " + (", ".join(s.needs_from_host) or "nothing (the capture holds everything replay reads)"),
        f"payloads      {s.payloads}: {_size(s.payload_logical_bytes)} logical, "
        f"{_size(s.payload_stored_bytes)} stored, compression {s.compression_ratio:.2f}x, "
        f"dedup saved {_size(s.dedup_saved_bytes)}",
        f"state         {_size(s.state_bytes)} starting state (restored, not timed); "
        f"{_size(s.upload_bytes)} uploaded by the program",
    ]
    if s.recovered:
        lines.append(f"recovered     yes: {s.discarded_bytes} bytes discarded ({s.recovery_reason})")
    else:
        lines.append("recovered     no (index and footer intact)")
    lines.append(f"partial       yes: {s.partial}" if s.partial else "partial       no")
    if s.runs_on:
        lines.append(f"runs on       {s.runs_on}")
    if s.stored_pointers:
        lines.append(f"pointers      {s.stored_pointers} stored in state and uploads (relocated on replay)")
    if s.replayable is None:
        lines.append("replayable    not judged (the plan was not run)")
    elif s.replayable:
        lines.append("replayable    yes (strict)" + (": the recovered operations only" if s.recovered else ""))
    else:
        lines.append("replayable    no:")
        lines += [f"  - {reason}" for reason in s.not_replayable_because]
    lines += [f"warning       {warning}" for warning in s.warnings]
    return lines


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)
