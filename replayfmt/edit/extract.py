"""Cut operations out of a capture into a standalone capture shaped like one recorded in kernel mode.

The new capture holds, in one scope (named ``kernel#K`` for one launch, as the recorder's kernel
mode names it; the scope's own name for a scope): the starting state of every byte range the
work reads, the work itself, and a checkpoint of every range it may write; only the objects the
work needs (:mod:`replayfmt.edit.closure`); the original program's times of the extracted
operations, renumbered; and where it came from, in the metadata's properties
(``extract.source``, ``extract.source_digest``, ``extract.source_operations``, ...).

Starting state and checkpoint come from the capture's own data where it holds them
(:mod:`replayfmt.edit.shadow`: states, uploads, memsets, copies, checkpoints); otherwise from a
replay of the operations before the range on a GPU (:mod:`replayfmt.edit.prefix`), and the result
says which (``ExtractResult.state_source``). Without a GPU allowed, bytes the capture cannot give
are an error naming the buffer, the range and the operation that wrote them.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import xxhash

from replayfmt.edit.closure import Closure, compute_closure
from replayfmt.edit.select import Resolved, Selection, SelectionKind, resolve
from replayfmt.edit.shadow import ByteState, Shadow, iter_ranges
from replayfmt.edit.snapshots import Narrowing
from replayfmt.edit.transplant import Transplant, derived_metadata
from replayfmt.errors import DeviceUnavailableError, ReplayUsageError, UnsupportedOperationError
from replayfmt.format import model as m, timings
from replayfmt.format.layout import DEFAULT_LIMITS, Limits
from replayfmt.reader import Capture, open_capture
from replayfmt.writer import CaptureWriter

_K = m.OperationKind
# operations that leave device memory as it is: a checkpoint or state after them still tells what
# the extracted work left behind
_NO_DEVICE_WRITES = {
    _K.CHECKPOINT,
    _K.STATE,
    _K.SCOPE_BEGIN,
    _K.SCOPE_END,
    _K.STREAM_SYNCHRONIZE,
    _K.DEVICE_SYNCHRONIZE,
    _K.EVENT_SYNCHRONIZE,
    _K.EVENT_RECORD,
    _K.STREAM_WAIT_EVENT,
    _K.HOST_FUNCTION,
    _K.COPY_DEVICE_TO_HOST,
    _K.DESTROY_OBJECT,
    _K.CREATE_OBJECT,
    _K.MODULE_LOAD,
}
_DROPPED = {_K.CREATE_OBJECT, _K.DESTROY_OBJECT, _K.MODULE_LOAD, _K.STATE}  # objects come first; state is folded in
TOOL = "replayfmt extract-replay"


class StateSource(enum.StrEnum):
    """Where an extract's starting state and checkpoint came from."""

    CAPTURE = "capture"  # the capture's states, uploads, memsets, copies and checkpoints
    GPU = "gpu-replay"  # a replay of the prefix on a GPU


@dataclass(frozen=True)
class ExtractOptions:
    """``allow_gpu``: replay the prefix on a GPU where the capture lacks bytes (else refuse);
    ``overwrite``: replace an existing output file; ``max_gpu_read``: the most bytes of buffers
    the GPU path may read back (it reads the buffers the work uses whole, before and after)."""

    allow_gpu: bool = True
    overwrite: bool = False
    max_gpu_read: int = 8 << 30  # bytes the GPU path may read back whole (host memory, twice)
    limits: Limits = DEFAULT_LIMITS  # the reader's caps (--limit NAME=VALUE)


@dataclass
class ExtractResult:
    """What :func:`extract` wrote."""

    output: Path
    source: str
    first: int  # source operation range, both included
    last: int
    scope: str
    operations: int  # in the new capture
    state_source: StateSource
    checkpoint_source: StateSource
    gpu_device: str = ""
    state_bytes: int = 0
    checkpoint_bytes: int = 0
    timed_operations: int = 0
    kept: dict[str, int] = field(default_factory=dict)  # object kind -> count
    source_size: int = 0
    output_size: int = 0
    needs: list[str] = field(default_factory=list)  # why the GPU was needed (buffer, range, writer)
    narrowed: str = ""  # how the GPU replay narrowed whole buffers to the bytes kept
    unchecked: list[str] = field(default_factory=list)  # written ranges the checkpoint lacks (--no-gpu)


def _first(problems: list[str]) -> str:
    return problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")


def file_digest(path: str | os.PathLike[str]) -> str:
    """``xxh3-128:HEX`` of a whole file (the source capture's identity)."""
    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        while piece := f.read(16 << 20):
            h.update(piece)
    return f"xxh3-128:{h.hexdigest()}"


class _Names:
    """Kernel names of launches (cached per executable and function)."""

    def __init__(self, capture: Capture) -> None:
        self.capture = capture
        self._cache: dict[tuple[int, int], str] = {}

    def __call__(self, op: m.Launch) -> str:
        key = (op.executable, op.function)
        name = self._cache.get(key)
        if name is None:
            exe = self.capture.object(op.executable)
            fns = exe.functions if isinstance(exe, m.Executable) else ()
            name = (
                fns[op.function].name
                if op.function < len(fns)
                else f"executable {op.executable} function {op.function}"
            )
            self._cache[key] = name
        return name


def extract(
    source: str | os.PathLike[str],
    selection: Selection,
    output: str | os.PathLike[str],
    options: ExtractOptions | None = None,
    *,
    snapshot: Callable[..., object] | None = None,
) -> ExtractResult:
    """Write the operations ``selection`` names, with their closure, state and checkpoint, to
    ``output`` (see the module docstring). ``snapshot`` replaces the GPU prefix replay
    (:func:`replayfmt.edit.prefix.replay_snapshots`, loaded only when needed)."""
    options = options or ExtractOptions()
    output = Path(output)
    if output.exists() and not options.overwrite:
        raise ReplayUsageError(f"{output} exists; pass --force to replace it")
    if output.resolve() == Path(source).resolve():
        raise ReplayUsageError(f"{output} is the source capture: write the extract elsewhere")
    with open_capture(source, limits=options.limits) as cap:
        names = _Names(cap)
        ops = list(cap.iter_operations(0, None))
        where = resolve(selection, ops, names)
        work = ops[where.first : where.last + 1]
        for op in work:
            if op.kind == _K.UNSUPPORTED:
                raise UnsupportedOperationError(
                    f"operation {op.index} ({op.call}: {op.reason}) cannot be replayed, so it cannot be extracted"  # type: ignore[union-attr]
                )
            if op.kind == _K.NONE:
                raise UnsupportedOperationError(f"operation {op.index} is of a kind this reader does not know")
        closure = compute_closure(work, cap.object, cap.object_count)
        if not closure.device_work:
            what = selection.describe()
            if selection.kind not in (SelectionKind.OPERATION, SelectionKind.RANGE):
                what += f" (operations {where.first}..{where.last})"
            raise ReplayUsageError(f"{what} holds no device work (launches, copies, memsets or graph launches)")
        _refuse_stored_pointers(ops[: where.last + 1], closure)
        plan = _Contents(cap, ops, where, closure, names)
        if plan.missing_state and not options.allow_gpu:
            raise ReplayUsageError(
                f"the capture does not hold the starting state {selection.describe()} needs: "
                + _first(plan.missing_state)
                + "; drop --no-gpu to produce it by replaying the operations before it on a GPU"
            )
        if plan.missing_checkpoint and not options.allow_gpu and not plan.checkpoint:
            raise ReplayUsageError(
                f"the capture holds no checkpoint of what {selection.describe()} writes, so nothing could be "
                f"verified: {_first(plan.missing_checkpoint)}; drop --no-gpu to produce one on a GPU"
            )
        if options.allow_gpu and (plan.missing_state or plan.missing_checkpoint):
            _check_read_size(cap, closure, options.max_gpu_read)
            kwargs: dict[str, object] = {}
            if snapshot is None:
                from replayfmt.edit.prefix import replay_snapshots as snapshot

                kwargs = {
                    "narrowing": narrowing(cap, ops, work, closure),
                    "sizes": _sizes(cap, closure),
                    "limits": options.limits,
                }
            try:
                snapshots = snapshot(str(source), where.first, where.last, closure.reads, closure.writes, **kwargs)
            except DeviceUnavailableError as exc:
                lacking = _first(plan.missing_state or plan.missing_checkpoint)
                fix = "" if plan.missing_state else " (or --no-gpu: a checkpoint of only what the capture holds)"
                raise DeviceUnavailableError(
                    f"the capture does not hold {lacking}; producing it needs a GPU{fix}: {exc}"
                ) from None
            plan.from_gpu(snapshots)
        result = ExtractResult(
            output=output,
            source=str(source),
            first=where.first,
            last=where.last,
            scope=where.name,
            operations=0,
            state_source=plan.source,
            checkpoint_source=plan.source,
            gpu_device=plan.gpu_device,
            needs=plan.missing_state + plan.missing_checkpoint if plan.source == StateSource.GPU else [],
            unchecked=plan.missing_checkpoint if plan.source == StateSource.CAPTURE else [],
            narrowed=plan.narrowed,
            source_size=cap.size,
        )
        metadata = _metadata(cap, source, selection, where, plan)
        with CaptureWriter(output, metadata=metadata, overwrite=options.overwrite) as w:
            _write(cap, w, work, where, closure, plan, result)
            result.operations = w.operation_count
        result.output_size = output.stat().st_size
    return result


def _check_read_size(cap: Capture, closure: Closure, limit: int) -> None:
    sizes = _sizes(cap, closure)
    if sum(sizes.values()) > limit:
        largest = max(sizes, key=lambda b: sizes[b])
        raise ReplayUsageError(
            f"producing the missing bytes on a GPU reads the {len(sizes)} buffers the work uses whole, "
            f"{sum(sizes.values())} bytes (buffer {largest}: {sizes[largest]}), over --max-read-gib "
            f"({limit} bytes); raise it if the host has the memory (twice that)"
        )


def _sizes(cap: Capture, closure: Closure) -> dict[int, int]:
    return {b: cap.object(b).size for b in closure.buffers}  # type: ignore[attr-defined]


def _relocations(op: m.Operation, lookup: Callable[[int], m.ObjectDef]) -> Iterator[m.Relocation]:
    if op.kind == _K.LAUNCH:
        yield from op.relocations  # type: ignore[union-attr]
    elif op.kind == _K.GRAPH_LAUNCH:
        graph = lookup(op.graph)  # type: ignore[union-attr]
        if isinstance(graph, m.Graph):
            for node in graph.nodes:
                yield from node.relocations


def _carried_types(
    after: Iterable[m.Operation], t: Transplant, entries: list[m.CheckpointEntry]
) -> list[m.TypedTensor]:
    """The typed tensors (format 1.3) of the source's first checkpoint at or after the work's end
    that lie inside the extract's checkpoint entries, renumbered: verification then compares values."""
    first = next((op for op in after if isinstance(op, m.Checkpoint) and op.types), None)
    if first is None:
        return []
    out = []
    for typed in first.types:
        if typed.buffer not in t.ids:
            continue
        moved = replace(typed, buffer=t.id(typed.buffer))
        if any(
            e.buffer == moved.buffer and e.offset <= moved.offset and moved.offset + moved.size <= e.offset + e.size
            for e in entries
        ):
            out.append(moved)
    return out


def _refuse_stored_pointers(ops: list[m.Operation], closure: Closure) -> None:
    """Pointers the program stored in memory (1.3 data relocations) in a buffer the extract keeps:
    the extract's starting state is rebuilt as plain bytes, which would replay those pointers as
    captured (they fault wherever buffers move), so such an extract is refused, not written wrong."""
    for op in ops:
        if isinstance(op, m.State | m.Copy) and op.relocations:
            holder = op.buffer if isinstance(op, m.State) else op.dst_buffer
            if holder in closure.buffers:
                raise UnsupportedOperationError(
                    f"operation {op.index} ({op.kind.label}) stores {len(op.relocations)} pointer(s) in buffer "
                    f"{holder}, which the extract needs: extract-replay cannot carry stored pointers yet "
                    "(replay the whole capture, or a capture recorded with --mode kernel)"
                )


def narrowing(cap: Capture, ops: list[m.Operation], work: list[m.Operation], closure: Closure) -> Narrowing:
    """The candidate windows of :mod:`replayfmt.edit.prefix`'s narrowing: from each pointer the
    work passes to the next pointer target in that buffer anywhere in the capture (tier 1: 4 KiB
    where there is none; tier 2: the buffer's end). Nothing is narrowed in a capture that stores
    device addresses in memory (it needs fixed addresses), nor a buffer holding pointer sites."""
    sizes = _sizes(cap, closure)
    if any(isinstance(o, m.Buffer) and o.requires_fixed_address for o in cap.object_table().others.values()):
        return Narrowing((), frozenset(sizes))
    targets: dict[int, set[int]] = {}
    sites: set[int] = set()
    for op in ops:
        for r in _relocations(op, cap.object):
            targets.setdefault(r.target_buffer, set()).add(r.target_offset)
            if r.site_buffer:
                sites.add(r.site_buffer)
    ordered = {b: sorted(t) for b, t in targets.items()}
    tier1: dict[int, list[tuple[int, int]]] = {}
    tier2: dict[int, list[tuple[int, int]]] = {}
    for op in work:
        for r in _relocations(op, cap.object):
            b, o = r.target_buffer, r.target_offset
            size = sizes.get(b, 0)
            if not 0 <= o < size:
                continue
            later = [t for t in ordered.get(b, ()) if t > o]
            end = min(later[0], size) if later else None
            tier1.setdefault(b, []).append((o, end if end is not None else min(size, o + 4096)))
            tier2.setdefault(b, []).append((o, end if end is not None else size))
    return Narrowing((tier1, tier2), frozenset(sites))


class _Contents:
    """The starting state and the checkpoint of the extracted work: from the capture's data, or
    (where it lacks bytes) to be filled from a GPU replay by :meth:`from_gpu`."""

    def __init__(self, cap: Capture, ops: list[m.Operation], where: Resolved, closure: Closure, names: _Names):
        self.source: StateSource = StateSource.CAPTURE
        self.gpu_device = ""
        self.narrowed = ""  # how a GPU replay narrowed the kept bytes (prefix.py), in words
        self.missing_state: list[str] = []  # bytes the work reads that the capture does not give
        self.missing_checkpoint: list[str] = []  # bytes it may write that the capture does not give
        tracked = set(closure.buffers)
        # device-to-device copies into tracked buffers make their sources matter too
        copies = [op for op in ops[: where.last + 1] if op.kind == _K.COPY_DEVICE_TO_DEVICE]
        grew = True
        while grew:
            grew = False
            for c in copies:
                if c.dst_buffer in tracked and c.src_buffer not in tracked:  # type: ignore[union-attr]
                    tracked.add(c.src_buffer)  # type: ignore[union-attr]
                    grew = True
        sizes = {b: cap.object(b).size for b in tracked}  # type: ignore[attr-defined]
        shadow = Shadow(sizes, lambda p, out, at: cap.read_payload_into(p, out, at), cap.object)
        for op in ops[: where.first]:
            shadow.apply(op, names)
        for op in ops[where.first : where.last + 1]:
            if op.kind == _K.STATE:  # hoisted: it holds where the region begins (FORMAT.md 4.2)
                shadow.apply(op)
        self.state = self._known(shadow, closure.reads, "before operation", where.first, self.missing_state)
        for op in ops[where.first : where.last + 1]:
            shadow.apply(op, names)
        for op in ops[where.last + 1 :]:  # checkpoints (and states) before any more work say what it left
            if op.kind not in _NO_DEVICE_WRITES:
                break
            shadow.apply(op)
        self.checkpoint = self._known(shadow, closure.writes, "after operation", where.last, self.missing_checkpoint)

    def _known(
        self, shadow: Shadow, ranges: dict, when: str, at: int, missing: list[str]
    ) -> list[tuple[int, int, bytes]]:
        out = []
        for buffer, lo, hi in iter_ranges(ranges):
            dirty = shadow.state_runs(buffer, lo, hi - lo, ByteState.DIRTY)
            if dirty:
                why = shadow.dirtied(buffer)
                by = f"; operation {why.operation} ({why.what}) wrote them" if why else ""
                missing.append(
                    f"buffer {buffer} bytes [{dirty[0][0]}, {dirty[-1][1]}) {when} {at}{by} "
                    "and no state or checkpoint of the capture gives them afterwards"
                )
            for a, b in shadow.state_runs(buffer, lo, hi - lo, ByteState.KNOWN):
                out.append((buffer, a, shadow.read(buffer, a, b - a).tobytes()))
        return out

    def from_gpu(self, snapshots: object) -> None:
        self.source = StateSource.GPU
        self.gpu_device = getattr(snapshots, "device", "")
        self.narrowed = getattr(snapshots, "narrowed", "")
        before, after = snapshots.before, snapshots.after  # type: ignore[attr-defined]
        self.state = [(b, lo, data) for (b, lo, _hi), data in sorted(before.items())]
        self.checkpoint = [(b, lo, data) for (b, lo, _hi), data in sorted(after.items())]


def _metadata(
    cap: Capture, source: str | os.PathLike[str], selection: Selection, where: Resolved, plan: _Contents
) -> m.CaptureMetadata:
    src = cap.metadata
    state = plan.source + (f" ({plan.gpu_device})" if plan.gpu_device else "")
    props = (
        ("extract.source", str(Path(source).resolve())),
        ("extract.source_digest", file_digest(source)),
        ("extract.source_operations", f"{where.first}..{where.last}"),
        ("extract.selection", selection.describe()),
        ("extract.source_tool", f"{src.tool} {src.tool_version}".strip()),
        ("extract.state", state),
        ("extract.checkpoint", state),
        *((("extract.narrowed", plan.narrowed),) if plan.narrowed else ()),
    )
    return derived_metadata(src, TOOL, "extract.", props)


def _write(
    cap: Capture,
    w: CaptureWriter,
    work: list[m.Operation],
    where: Resolved,
    closure: Closure,
    plan: _Contents,
    result: ExtractResult,
) -> None:
    t = Transplant(cap, w)
    t.add_objects(closure.objects)
    for oid in closure.objects:
        label = type(cap.object(oid)).__name__.lower()
        result.kept[label] = result.kept.get(label, 0) + 1
    pairs = _scope_pairs(work)
    # a range that is one scope becomes the extract's scope: its own markers are not repeated inside
    inner = work[1:-1] if pairs.get(work[0].index) == work[-1].index else work
    balanced = set(pairs) | set(pairs.values())
    old_times = cap.original_times()
    new_times: list[timings.OperationTime] = []
    w.scope_begin(where.name)
    for buffer, offset, data in plan.state:
        w.state(buffer=t.id(buffer), data=data, offset=offset)
        result.state_bytes += len(data)
    # a checkpoint closing the work is superseded by the one written below, at the same point
    superseded = inner[-1].index if inner and inner[-1].kind == _K.CHECKPOINT and plan.checkpoint else -1
    for op in inner:
        if op.index == superseded:
            continue
        if op.kind in _DROPPED or (op.kind in (_K.SCOPE_BEGIN, _K.SCOPE_END) and op.index not in balanced):
            continue
        if op.kind in (_K.STREAM_WAIT_EVENT, _K.EVENT_SYNCHRONIZE) and op.event not in closure.events:  # type: ignore[union-attr]
            continue  # waits on work before the range: done before the state is set
        index = t.operation(op)
        timed = old_times.operations.get(op.index)
        if index is not None and timed is not None:
            new_times.append(timings.OperationTime(index, timed.start_ns, timed.duration_ns))
    entries = [
        m.CheckpointEntry(t.id(b), w.add_payload(data), offset, len(data)) for b, offset, data in plan.checkpoint
    ]
    result.checkpoint_bytes = sum(e.size for e in entries)
    if entries:
        w.checkpoint(entries, name=where.name, types=_carried_types(cap.iter_operations(where.last), t, entries))
    w.scope_end(where.name)
    if new_times:
        w.set_original_times(new_times, old_times.clock or timings.CUPTI_CLOCK)
    result.timed_operations = len(new_times)


def _scope_pairs(ops: list[m.Operation]) -> dict[int, int]:
    """ScopeBegin index -> its ScopeEnd index, for the scopes whose both markers are in ``ops``."""
    stack: list[int] = []
    pairs: dict[int, int] = {}
    for op in ops:
        if op.kind == _K.SCOPE_BEGIN:
            stack.append(op.index)
        elif op.kind == _K.SCOPE_END and stack:
            pairs[stack.pop()] = op.index
    return pairs
