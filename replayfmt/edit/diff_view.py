"""A :class:`~replayfmt.edit.diff.Diff` judged against ``--fail-on`` thresholds, and shown as a
table for people or as JSON rows for jq.

Thresholds (``parse_fail_on``): ``time=P%`` (a kernel on both sides whose total original time
moved by more than P percent; ``time=+P%``: only slower), ``scope-time=P%`` (a scope's busy
time), ``total-time=P%`` (all launches' time), and the structural checks ``shape``,
``parameters``, ``executable``, ``new-kernels`` (kernels only in the second capture),
``missing-kernels`` (only in the first), ``launches`` (any launch inserted or removed); ``any``
is every structural check. Without thresholds the structural checks apply (``DEFAULT_FAIL_ON``):
times always jitter, so they fail only where a threshold says how much is too much.
``struct-bytes`` (launches that differ only in bytes of a struct passed by value that the diff
has no layout for: see edit/parameter_meaning) is no structural check: two runs of one program
differ there, so it fails only where asked for.

JSON rows (one object per line): ``{"kind":"summary", ...}`` first, then ``kernel`` rows, ``scope``
rows and ``launch`` rows (changed launches only, or every launch with ``all_launches``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from replayfmt.edit.diff import Diff, LaunchInfo, LaunchPair, ratio
from replayfmt.errors import ReplayUsageError

STRUCTURAL = ("shape", "parameters", "executable", "new-kernels", "missing-kernels", "launches")
TIMED = ("time", "scope-time", "total-time")
STRUCT_BYTES = "struct-bytes"
COUNTED = ("removed", "inserted", "shape", "parameters", "executable")  # what a launch pair lists as changed
_THRESHOLD = re.compile(r"^(?P<check>[a-z-]+)(?:=(?P<sign>\+)?(?P<pct>\d+(?:\.\d+)?)%)?$")


@dataclass(frozen=True, slots=True)
class Threshold:
    """One ``--fail-on`` check; ``percent`` for the timed ones."""

    check: str
    percent: float | None = None
    slower_only: bool = False

    def describe(self) -> str:
        return self.check + (f"={'+' if self.slower_only else ''}{self.percent:g}%" if self.percent is not None else "")


DEFAULT_FAIL_ON = tuple(Threshold(c) for c in STRUCTURAL)


def parse_fail_on(text: str) -> list[Threshold]:
    """Thresholds from one ``--fail-on`` value (comma-separated checks)."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        match = _THRESHOLD.match(part)
        check = match["check"] if match else ""
        if not match or check not in (*STRUCTURAL, STRUCT_BYTES, *TIMED, "any"):
            raise ReplayUsageError(
                f"--fail-on {part!r}: expected one of {', '.join(STRUCTURAL)}, any, {STRUCT_BYTES}, or time=P%, "
                "scope-time=P%, total-time=P% (a leading + counts only slowdowns)"
            )
        if (check in TIMED) != (match["pct"] is not None):
            need = "needs a percentage, e.g. time=5%" if check in TIMED else "takes no percentage"
            raise ReplayUsageError(f"--fail-on {part!r}: {check} {need}")
        if check == "any":
            out += DEFAULT_FAIL_ON
        else:
            out.append(Threshold(check, float(match["pct"]) if match["pct"] else None, bool(match["sign"])))
    return out


def _beyond(r: float | None, t: Threshold) -> bool:
    if r is None or t.percent is None:
        return False
    moved = r - 1.0 if t.slower_only else abs(r - 1.0)
    return moved * 100.0 > t.percent


def failures(d: Diff, thresholds: list[Threshold] | tuple[Threshold, ...]) -> list[str]:
    """Why ``d`` counts as different under ``thresholds`` (empty: the same within them). A damaged
    or recovered input fails whatever the thresholds: nothing it says can be trusted."""
    out: list[str] = [f"damaged: {why}" for why in d.damage]
    for t in thresholds:
        c = t.check
        if c in ("shape", "parameters", "executable", STRUCT_BYTES) and (n := d.count(c)):
            names = sorted({p.name for p in d.pairs if c in p.changes})
            out.append(f"{c}: {n} matched launches differ ({_names(names)})")
        elif c == "new-kernels" and (names := [k.name for k in d.kernels if k.side == "b"]):
            out.append(f"new-kernels: {len(names)} kernels only in the second capture ({_names(names)})")
        elif c == "missing-kernels" and (names := [k.name for k in d.kernels if k.side == "a"]):
            out.append(f"missing-kernels: {len(names)} kernels only in the first capture ({_names(names)})")
        elif c == "launches" and (d.count("inserted") or d.count("removed")):
            out.append(f"launches: {d.count('inserted')} inserted, {d.count('removed')} removed")
        elif c == "time":
            moved = [k for k in d.kernels if k.side == "both" and _beyond(k.ratio, t)]
            if moved:
                shown = ", ".join(f"{k.name} x{k.ratio:.3f}" for k in moved[:3])
                out.append(f"{t.describe()}: {len(moved)} kernels moved ({shown}{', ...' if len(moved) > 3 else ''})")
        elif c == "scope-time":
            moved_scopes = [s for s in d.scopes if _beyond(s.ratio, t)]
            if moved_scopes:
                shown = ", ".join(f"{s.name}#{s.occurrence} x{s.ratio:.3f}" for s in moved_scopes[:3])
                out.append(f"{t.describe()}: {len(moved_scopes)} scopes moved ({shown})")
        elif c == "total-time" and _beyond(r := ratio(d.total_a_ns, d.total_b_ns), t):
            out.append(f"{t.describe()}: all launches together x{r:.3f}")
    return out


def _names(names: list[str]) -> str:
    return ", ".join(_short(n, 60) for n in names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _ms(ns: int | None) -> str:
    if ns is None:
        return "-"
    return f"{ns / 1e6:.3f} ms" if ns >= 1_000_000 else f"{ns / 1e3:.1f} us"


def _ratio(r: float | None) -> str:
    return "-" if r is None else f"{r:.3f}"


def _shape_text(x: LaunchInfo) -> str:
    s = f"grid={','.join(map(str, x.grid))} block={','.join(map(str, x.block))}"
    if any(x.cluster):
        s += f" cluster={','.join(map(str, x.cluster))}"
    return s + f" smem={x.shared_memory}"


def _pair_detail(p: LaunchPair) -> str:
    parts = []
    if p.a is None or p.b is None:
        return p.changes[0]
    if "shape" in p.changes:
        parts.append(f"shape {_shape_text(p.a)} -> {_shape_text(p.b)}")
    for change, what in (("parameters", "parameters differ"), (STRUCT_BYTES, "only struct bytes differ")):
        if change in p.changes:
            at = [i for i, (x, y) in enumerate(zip(p.a.parameters, p.b.parameters)) if x != y]
            if not at:
                where = f"size {len(p.a.parameters)} -> {len(p.b.parameters)}"
            else:
                where = f"byte {at[0]}" if at[0] == at[-1] else f"bytes {at[0]}..{at[-1]}"
            parts.append(f"{what} ({where})")
    if "executable" in p.changes:
        parts.append(f"executable image {p.a.image[:12]} -> {p.b.image[:12]}")
    return "; ".join(parts)


def render_text(
    d: Diff, failed: list[str], *, all_launches: bool = False, struct_bytes: bool = False, width: int = 48
) -> Iterator[str]:
    """The human table: summary, kernels, scopes, changed launches (those differing only in struct
    bytes too with ``struct_bytes``), verdict."""
    na = sum(1 for p in d.pairs if p.a is not None)
    nb = sum(1 for p in d.pairs if p.b is not None)
    yield f"a  {d.path_a}: {na} launches, {_ms(d.total_a_ns)} original device time"
    yield f"b  {d.path_b}: {nb} launches, {_ms(d.total_b_ns)} original device time"
    matched = sum(1 for p in d.pairs if p.a is not None and p.b is not None)
    yield (
        f"launches  {matched} matched, {d.count('inserted')} inserted, {d.count('removed')} removed; changed: "
        f"{d.count('shape')} shape, {d.count('parameters')} parameters, {d.count('executable')} executable"
    )
    if n := d.count(STRUCT_BYTES):
        yield (
            f"struct    {n} matched launches differ only in struct bytes (bytes of a struct passed by value "
            "that the diff has no layout for, which a program may leave unwritten: two runs of one program "
            f"differ there); --fail-on {STRUCT_BYTES} counts them"
        )
    for why in d.damage:
        yield f"damaged   {why}"
    if not d.timed:
        yield "times     not both captures carry the original program's times: ratios shown where both do"
    yield ""
    yield f"{'kernel':<{width}} {'n a':>5} {'n b':>5} {'time a':>11} {'time b':>11} {'b/a':>7}  changes"
    for k in d.kernels:
        changes = []
        if k.side != "both":
            changes.append(f"only in {k.side}")
        for label, n in (
            ("shape", k.shape_changes),
            ("parameters", k.parameter_changes),
            ("struct bytes", k.struct_byte_changes),
            ("executable", k.executable_changes),
        ):
            if n:
                changes.append(f"{label} x{n}")
        yield (
            f"{_short(k.name, width):<{width}} {k.count_a:>5} {k.count_b:>5} {_ms(k.time_a_ns):>11} "
            f"{_ms(k.time_b_ns):>11} {_ratio(k.ratio):>7}  {', '.join(changes)}"
        )
    if d.scopes:
        yield ""
        yield f"{'scope':<{width}} {'busy a':>11} {'busy b':>11} {'b/a':>7}"
        for s in d.scopes:
            label = f"{s.name}#{s.occurrence}" if s.occurrence else s.name
            yield f"{_short(label, width):<{width}} {_ms(s.busy_a_ns):>11} {_ms(s.busy_b_ns):>11} {_ratio(s.ratio):>7}"
    shown = [p for p in d.pairs if all_launches or _listed(p, struct_bytes)]
    if shown:
        yield ""
        yield "launches (operation index in a / in b)"
        for p in shown:
            ia = str(p.a.index) if p.a else "-"
            ib = str(p.b.index) if p.b else "-"
            yield f"  {ia:>6} {ib:>6}  {_short(p.name, width)}  {_pair_detail(p) or 'same'}"
    yield ""
    yield "verdict: " + ("different: " + "; ".join(failed) if failed else "same within the thresholds")


def _listed(p: LaunchPair, struct_bytes: bool) -> bool:
    return any(c in COUNTED or (struct_bytes and c == STRUCT_BYTES) for c in p.changes)


def _launch_json(x: LaunchInfo | None) -> dict[str, Any] | None:
    if x is None:
        return None
    return {
        "operation": x.index,
        "grid": list(x.grid),
        "block": list(x.block),
        "cluster": list(x.cluster),
        "shared_memory": x.shared_memory,
        "executable_hash": x.image,
        "original_ns": x.duration_ns,
    }


def json_rows(
    d: Diff, failed: list[str], thresholds: list[Threshold] | tuple[Threshold, ...], *, all_launches: bool = False
) -> Iterator[dict[str, Any]]:
    """The JSON rows (see the module docstring)."""
    yield {
        "kind": "summary",
        "a": d.path_a,
        "b": d.path_b,
        "launches_a": sum(1 for p in d.pairs if p.a is not None),
        "launches_b": sum(1 for p in d.pairs if p.b is not None),
        "matched": sum(1 for p in d.pairs if p.a is not None and p.b is not None),
        "inserted": d.count("inserted"),
        "removed": d.count("removed"),
        "changed_shape": d.count("shape"),
        "changed_parameters": d.count("parameters"),
        "changed_struct_bytes": d.count(STRUCT_BYTES),
        "changed_executable": d.count("executable"),
        "kernels_only_a": [k.name for k in d.kernels if k.side == "a"],
        "kernels_only_b": [k.name for k in d.kernels if k.side == "b"],
        "time_a_ns": d.total_a_ns,
        "time_b_ns": d.total_b_ns,
        "ratio": ratio(d.total_a_ns, d.total_b_ns),
        "fail_on": [t.describe() for t in thresholds],
        "damaged": d.damage,
        "verdict": "different" if failed else "same",
        "failed": failed,
    }
    for k in d.kernels:
        yield {
            "kind": "kernel",
            "name": k.name,
            "side": k.side,
            "count_a": k.count_a,
            "count_b": k.count_b,
            "time_a_ns": k.time_a_ns,
            "time_b_ns": k.time_b_ns,
            "ratio": k.ratio,
            "shape_changes": k.shape_changes,
            "parameter_changes": k.parameter_changes,
            "struct_byte_changes": k.struct_byte_changes,
            "executable_changes": k.executable_changes,
        }
    for s in d.scopes:
        yield {
            "kind": "scope",
            "name": s.name,
            "occurrence": s.occurrence,
            "busy_a_ns": s.busy_a_ns,
            "busy_b_ns": s.busy_b_ns,
            "ratio": s.ratio,
        }
    for p in d.pairs:
        if all_launches or p.changes:
            yield {
                "kind": "launch",
                "name": p.name,
                "changes": list(p.changes),
                "a": _launch_json(p.a),
                "b": _launch_json(p.b),
                "ratio": ratio(p.a.duration_ns if p.a else None, p.b.duration_ns if p.b else None),
            }
