"""Two captures of one program compared: which kernels appeared, vanished or changed (executable
image, launch shape, parameters), and how each kernel's and each scope's original times moved.

Matching rule (documented in docs/LOOPS.md): each capture's launches, in capture order, form a
sequence of kernel names (demangled). The two sequences are aligned as ``diff --patience`` aligns
lines (:mod:`replayfmt.edit.align`: common ends, then names unique on both sides as anchors,
difflib's longest matching blocks in small stretches; bounded time however often a kernel
repeats): launches in equal blocks are matched one to one.
Inside a stretch the alignment replaces, the k-th launch of a name on the left is matched with
the k-th launch of the same name on the right; whatever is left there is *removed* (left only) or
*inserted* (right only). So an inserted or removed launch shifts nothing after it, and a kernel
whose name changed counts as one removed and one inserted.

Matched launches are compared by launch shape (grid, block, cluster, dynamic shared memory), by
their parameters, and by the hash of their executable's image (XXH3-128 of the stored image: a
recompiled kernel of the same name differs). Parameters are read by what the function declares
(:mod:`replayfmt.edit.parameter_meaning`): pointers as the buffer and offset they point to (in
structs too), values by value, PyTorch's TensorInfo up to its dims; a difference only in the other
bytes of a struct passed by value, which a host program may leave unwritten and two runs of one
program fill differently, is a ``struct-bytes`` change, apart from ``parameters``. A capture that is
damaged (a payload whose bytes do not match their hash) or was recovered after a crash is listed
in ``Diff.damage``: the diff never passes it.

Times are the original program's (TIMINGS: CUPTI activity records of the recording); a capture
without them shows none. Scopes are matched by name and occurrence.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from replayfmt.edit.align import opcodes
from replayfmt.edit.parameter_meaning import (
    UNKNOWN_LAYOUT,
    BufferAddresses,
    ParameterLayout,
    Side,
    Sites,
    canonical,
    compare,
    layout_of,
)
from replayfmt.edit.select import scope_spans
from replayfmt.errors import ReplayFormatError
from replayfmt.format import model as m
from replayfmt.format.names import demangle
from replayfmt.reader import Capture
from replayfmt.replay.plan_checks import FrameChecks

_K = m.OperationKind
_NAMED_DAMAGE = 4  # damaged payloads named one by one; the rest are counted
_SEEN_PAIRS = 1 << 16  # parameter block pairs remembered (bounded memory on hostile input)


@dataclass(frozen=True, slots=True)
class LaunchInfo:
    """One launch as the diff sees it."""

    index: int  # operation index in its capture
    name: str  # demangled kernel name
    grid: m.Dims
    block: m.Dims
    cluster: m.Dims
    shared_memory: int
    parameters: bytes  # relocated pointers as (target buffer, offset), gaps and unused entries zeroed
    image: str  # XXH3-128 of the executable's image ("" when it is not stored)
    duration_ns: int | None  # the original program's device time
    sites: Sites = field(default_factory=dict)  # its relocated sites
    layout: ParameterLayout = UNKNOWN_LAYOUT  # how its function's parameter bytes are read
    buffers: BufferAddresses | None = None  # its capture's buffers, for pointers left unrelocated

    @property
    def shape(self) -> tuple[m.Dims, m.Dims, m.Dims, int]:
        return (self.grid, self.block, self.cluster, self.shared_memory)


@dataclass(frozen=True, slots=True)
class LaunchPair:
    """A launch on one side or both: ``a``/``b`` None where it exists only on the other side."""

    a: LaunchInfo | None
    b: LaunchInfo | None
    changes: tuple[str, ...]  # "removed", "inserted", "shape", "parameters", "struct-bytes", "executable"

    @property
    def name(self) -> str:
        return (self.a or self.b).name  # type: ignore[union-attr]


@dataclass
class KernelRow:
    """One kernel name's launches and total original time on both sides."""

    name: str
    count_a: int = 0
    count_b: int = 0
    time_a_ns: int | None = None
    time_b_ns: int | None = None
    shape_changes: int = 0
    parameter_changes: int = 0
    struct_byte_changes: int = 0
    executable_changes: int = 0

    @property
    def side(self) -> str:
        return "both" if self.count_a and self.count_b else ("a" if self.count_a else "b")

    @property
    def ratio(self) -> float | None:
        return ratio(self.time_a_ns, self.time_b_ns)


@dataclass(frozen=True, slots=True)
class ScopeRow:
    name: str
    occurrence: int
    busy_a_ns: int | None
    busy_b_ns: int | None

    @property
    def ratio(self) -> float | None:
        return ratio(self.busy_a_ns, self.busy_b_ns)


@dataclass
class Diff:
    """Everything :func:`diff_captures` found."""

    path_a: str
    path_b: str
    pairs: list[LaunchPair] = field(default_factory=list)
    kernels: list[KernelRow] = field(default_factory=list)
    scopes: list[ScopeRow] = field(default_factory=list)
    timed: bool = False  # both captures carry the original's times
    damage: list[str] = field(default_factory=list)  # why an input cannot be trusted (never passes)

    def count(self, change: str) -> int:
        return sum(1 for p in self.pairs if change in p.changes)

    @property
    def total_a_ns(self) -> int | None:
        return _total(p.a.duration_ns for p in self.pairs if p.a is not None)

    @property
    def total_b_ns(self) -> int | None:
        return _total(p.b.duration_ns for p in self.pairs if p.b is not None)


def ratio(a: int | None, b: int | None) -> float | None:
    """b / a (above 1: the right side is slower), or None where either is missing or a is 0."""
    return b / a if a and b is not None else None


def _total(values: Iterable[int | None]) -> int | None:
    vals = [v for v in values if v is not None]
    return sum(vals) if vals else None


def launches(cap: Capture) -> list[LaunchInfo]:
    """Every launch of a capture, in capture order (graph launches are not launches here)."""
    times = cap.original_times()
    buffers = BufferAddresses(lambda: [o for o in cap.object_table().others.values() if isinstance(o, m.Buffer)])
    images: dict[int, str] = {}
    names: dict[tuple[int, int], str] = {}
    layouts: dict[tuple[int, int], ParameterLayout] = {}
    out = []
    for op in cap:
        if op.kind != _K.LAUNCH:
            continue
        key = (op.executable, op.function)  # type: ignore[union-attr]
        if key not in names:
            exe = cap.object(op.executable) if 1 <= op.executable <= cap.object_count else None  # type: ignore[union-attr]
            fns = exe.functions if isinstance(exe, m.Executable) else ()
            fn = fns[op.function] if 0 <= op.function < len(fns) else None  # type: ignore[union-attr]
            names[key] = demangle(fn.name) if fn is not None else f"executable {op.executable}#{op.function}"  # type: ignore[union-attr]
            layouts[key] = layout_of(fn, names[key])
            images[op.executable] = (  # type: ignore[union-attr]
                cap.payload(exe.payload).hash_hex
                if isinstance(exe, m.Executable) and 1 <= exe.payload <= cap.payload_count
                else ""
            )
        params, sites = canonical(op, layouts[key])  # type: ignore[arg-type]
        out.append(
            LaunchInfo(
                op.index,
                names[key],
                op.grid,  # type: ignore[union-attr]
                op.block,  # type: ignore[union-attr]
                op.cluster,  # type: ignore[union-attr]
                op.shared_memory,  # type: ignore[union-attr]
                params,
                images[op.executable],  # type: ignore[union-attr]
                times.duration_ns(op.index),
                sites,
                layouts[key],
                buffers,
            )
        )
    return out


def align(a: list[LaunchInfo], b: list[LaunchInfo]) -> list[LaunchPair]:
    """Launches of both sides paired by the module docstring's matching rule."""
    pairs: list[LaunchPair] = []
    seen: dict[tuple[object, ...], str] = {}  # launches repeat: each pair of parameter blocks read once
    for tag, i1, i2, j1, j2 in opcodes([x.name for x in a], [x.name for x in b]):
        if tag == "equal":
            pairs += [_pair(a[i], b[j], seen) for i, j in zip(range(i1, i2), range(j1, j2))]
            continue
        right: dict[str, deque[LaunchInfo]] = defaultdict(deque)
        for y in b[j1:j2]:
            right[y.name].append(y)
        used: set[int] = set()
        for x in a[i1:i2]:
            same = right.get(x.name)
            if same:
                y = same.popleft()
                used.add(y.index)
                pairs.append(_pair(x, y, seen))
            else:
                pairs.append(LaunchPair(x, None, ("removed",)))
        pairs += [LaunchPair(None, y, ("inserted",)) for y in b[j1:j2] if y.index not in used]
    return pairs


def _pair(x: LaunchInfo, y: LaunchInfo, seen: dict[tuple[object, ...], str]) -> LaunchPair:
    changes: list[str] = []
    if x.shape != y.shape:
        changes.append("shape")
    if x.parameters != y.parameters:
        changes.append(_parameters_change(x, y, seen))
    if x.image != y.image:
        changes.append("executable")
    return LaunchPair(x, y, tuple(c for c in changes if c))


def _parameters_change(x: LaunchInfo, y: LaunchInfo, seen: dict[tuple[object, ...], str]) -> str:
    if x.layout != y.layout or x.buffers is None or y.buffers is None:
        return "parameters"  # declared otherwise (another image): every byte counts
    key = (x.parameters, y.parameters, tuple(x.sites.items()), tuple(y.sites.items()), x.layout)
    if (known := seen.get(key)) is None:
        sides = Side(x.parameters, x.sites, x.buffers), Side(y.parameters, y.sites, y.buffers)
        known = compare(*sides, x.layout) or ""
        if len(seen) < _SEEN_PAIRS:
            seen[key] = known
    return known


def _kernel_rows(pairs: list[LaunchPair]) -> list[KernelRow]:
    rows: dict[str, KernelRow] = {}
    for p in pairs:
        for side, info in (("a", p.a), ("b", p.b)):
            if info is None:
                continue
            row = rows.setdefault(info.name, KernelRow(info.name))
            setattr(row, f"count_{side}", getattr(row, f"count_{side}") + 1)
            if info.duration_ns is not None:
                before = getattr(row, f"time_{side}_ns")
                setattr(row, f"time_{side}_ns", (before or 0) + info.duration_ns)
        if p.a is not None and p.b is not None:
            row = rows[p.a.name]
            row.shape_changes += "shape" in p.changes
            row.parameter_changes += "parameters" in p.changes
            row.struct_byte_changes += "struct-bytes" in p.changes
            row.executable_changes += "executable" in p.changes
    return sorted(rows.values(), key=lambda r: -max(r.time_a_ns or 0, r.time_b_ns or 0))


def _scope_times(cap: Capture) -> dict[tuple[str, int], int | None]:
    times = cap.original_times()
    spans, _ = scope_spans(cap)
    out: dict[tuple[str, int], int | None] = {}
    seen: dict[str, int] = defaultdict(int)
    for s in spans:
        k = seen[s.name]
        seen[s.name] += 1
        st = times.scope(s.begin)
        out[(s.name, k)] = st.busy_ns if st is not None else None
    return out


def diff_captures(a: Capture, b: Capture, *, check_payloads: bool = True) -> Diff:
    """Compare captures ``a`` (before) and ``b`` (after); see the module docstring.
    ``check_payloads``: read every payload of both and check it against its hashes (a damaged
    one is named in ``Diff.damage``)."""
    d = Diff(a.path, b.path)
    d.damage = damage(a, "a", check_payloads) + damage(b, "b", check_payloads)
    d.pairs = align(launches(a), launches(b))
    d.kernels = _kernel_rows(d.pairs)
    d.timed = bool(a.original_times()) and bool(b.original_times())
    sa, sb = _scope_times(a), _scope_times(b)
    keys = list(sa) + [k for k in sb if k not in sa]
    d.scopes = [ScopeRow(name, k, sa.get((name, k)), sb.get((name, k))) for name, k in keys]
    return d


def damage(cap: Capture, side: str, check_payloads: bool) -> list[str]:
    """Why capture ``cap`` (``side`` a or b) cannot be trusted: recovered after a crash (a
    prefix survived), or payloads whose bytes do not match their hash (every payload read, each
    distinct frame once, when ``check_payloads``): the first few named, each with its frame (a
    damaged frame that payloads share names each of them), then how many more."""
    out = []
    if cap.recovered:
        out.append(
            f"{side}: {cap.path} was not closed properly and was recovered: {cap.discarded_bytes} bytes at its end "
            f"were discarded ({cap.recovery_reason}); only what survived is compared"
        )
    if check_payloads:
        frames = FrameChecks(cap, verify=True)
        damaged = 0
        for payload in range(1, cap.payload_count + 1):
            try:
                frames.check(None, payload, f"{side}: the capture")
            except ReplayFormatError as exc:
                damaged += 1
                if damaged <= _NAMED_DAMAGE:
                    out.append(str(exc))
        if damaged > _NAMED_DAMAGE:
            out.append(f"{side}: {damaged - _NAMED_DAMAGE} more damaged payloads")
    return out
