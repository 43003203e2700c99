"""Which operations to cut out of a capture: one launch, a scope, or a range, and the region they
lie in.

Selections (each resolves to an inclusive operation range ``first..last``):

* ``Selection.operation(N)``: operation ``N`` alone (usually a launch);
* ``Selection.range(A, B)``: operations ``A`` to ``B``, both included;
* ``Selection.kernel("REGEX#K")``: the ``K``-th launch (from 0, capture order) whose kernel name,
  raw or demangled, the regular expression finds; without ``#K`` the pattern must find exactly
  one launch;
* ``Selection.scope("NAME")``: the scope named ``NAME``, from its ``ScopeBegin`` to its
  ``ScopeEnd``; ``NAME#K`` is the ``K``-th of several scopes of that name, unless a scope is
  named ``NAME#K`` itself (kernel-mode captures name theirs ``kernel#K``).

A range must lie inside one region (docs/FORMAT.md 4.2: an outermost scope, or a stretch outside
every scope), because each region's starting state applies where that region begins.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from replayfmt.errors import ReplayUsageError
from replayfmt.format import model as m
from replayfmt.format.names import demangle, matches_kernel

_K = m.OperationKind
_OCCURRENCE = re.compile(r"^(?P<base>.*)#(?P<k>\d+)$", re.S)


class SelectionKind(enum.Enum):
    OPERATION = "operation"
    RANGE = "operations"
    KERNEL = "kernel"
    SCOPE = "scope"


@dataclass(frozen=True, slots=True)
class Selection:
    """What to extract (see the module docstring); build with the class methods."""

    kind: SelectionKind
    first: int = 0
    last: int = 0
    text: str = ""

    @classmethod
    def operation(cls, index: int) -> Selection:
        return cls(SelectionKind.OPERATION, index, index)

    @classmethod
    def range(cls, first: int, last: int) -> Selection:
        if last < first:
            raise ReplayUsageError(f"operation range {first}..{last} is empty (the last comes before the first)")
        return cls(SelectionKind.RANGE, first, last)

    @classmethod
    def kernel(cls, pattern: str) -> Selection:
        return cls(SelectionKind.KERNEL, text=pattern)

    @classmethod
    def scope(cls, name: str) -> Selection:
        return cls(SelectionKind.SCOPE, text=name)

    def describe(self) -> str:
        if self.kind == SelectionKind.OPERATION:
            return f"operation {self.first}"
        if self.kind == SelectionKind.RANGE:
            return f"operations {self.first}..{self.last}"
        return f"{self.kind.value} {self.text!r}"


@dataclass(frozen=True, slots=True)
class Resolved:
    """A selection resolved against one capture: operations ``first..last`` (both included)."""

    first: int
    last: int
    name: str  # the extracted capture's scope name
    region_start: int  # the operation where the region holding the range begins


@dataclass(frozen=True, slots=True)
class ScopeSpan:
    name: str
    begin: int
    end: int  # -1 while open (a capture cut short)
    depth: int  # 0: outermost (a region)


def scope_spans(ops: Iterable[m.Operation]) -> tuple[list[ScopeSpan], list[int]]:
    """Every scope (begin, end, depth) in capture order, and each operation's region start."""
    spans: list[ScopeSpan] = []
    stack: list[int] = []  # positions in spans
    region_of: list[int] = []
    region = 0
    after_scope = False
    for op in ops:
        if op.kind == _K.SCOPE_BEGIN:
            if not stack:
                region = op.index
            stack.append(len(spans))
            spans.append(ScopeSpan(op.name, op.index, -1, len(stack) - 1))  # type: ignore[union-attr]
            after_scope = False
        elif after_scope and not stack:
            region, after_scope = op.index, False
        region_of.append(region)
        if op.kind == _K.SCOPE_END and stack:
            k = stack.pop()
            s = spans[k]
            spans[k] = ScopeSpan(s.name, s.begin, op.index, s.depth)
            after_scope = not stack
    return spans, region_of


def resolve(
    selection: Selection,
    ops: list[m.Operation],
    kernel_name: Callable[[m.Launch], str],
) -> Resolved:
    """The operation range ``selection`` names in a capture whose operations are ``ops``."""
    count = len(ops)
    spans, region_of = scope_spans(ops)
    if selection.kind in (SelectionKind.OPERATION, SelectionKind.RANGE):
        first, last = selection.first, selection.last
        if first < 0 or last >= count:
            raise ReplayUsageError(
                f"{selection.describe()} is outside the capture (operations 0..{count - 1}); "
                "dump-replay lists them with their indices"
            )
        op = ops[first]
        if first == last and op.kind == _K.LAUNCH:
            name = _launch_scope_name(ops, first, kernel_name)
        elif first == last:
            name = f"{op.kind.label}@{first}"
        else:
            name = f"operations {first}..{last}"
    elif selection.kind == SelectionKind.KERNEL:
        first = last = _find_kernel(selection.text, ops, kernel_name)
        name = _launch_scope_name(ops, first, kernel_name)
    else:
        span = _find_scope(selection.text, spans)
        if span.end < 0:
            raise ReplayUsageError(
                f"scope {span.name!r} (operation {span.begin}) never ends: the capture was cut short"
            )
        first, last, name = span.begin, span.end, span.name
    _check_one_region(first, last, region_of)
    return Resolved(first, last, name, region_of[first])


def _launch_scope_name(ops: list[m.Operation], index: int, kernel_name: Callable[[m.Launch], str]) -> str:
    """``kernel#K`` as the recorder's kernel mode names a launch's scope: K counts that kernel's
    launches before it (from 0)."""
    name = kernel_name(ops[index])  # type: ignore[arg-type]
    before = sum(1 for op in ops[:index] if op.kind == _K.LAUNCH and kernel_name(op) == name)  # type: ignore[arg-type]
    return f"{name}#{before}"


def _find_kernel(text: str, ops: list[m.Operation], kernel_name: Callable[[m.Launch], str]) -> int:
    match = _OCCURRENCE.match(text)
    pattern_text, occurrence = (match["base"], int(match["k"])) if match else (text, None)
    try:
        pattern = re.compile(pattern_text)
    except re.error as exc:
        raise ReplayUsageError(f"--kernel {text!r}: not a regular expression: {exc}") from None
    found = [op.index for op in ops if op.kind == _K.LAUNCH and matches_kernel(pattern, kernel_name(op))]  # type: ignore[arg-type]
    if not found:
        names = sorted({demangle(kernel_name(op)) for op in ops if op.kind == _K.LAUNCH})  # type: ignore[arg-type]
        shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
        raise ReplayUsageError(
            f"--kernel {text!r}: no launch's kernel matches {pattern_text!r} (kernels: {shown or 'none'})"
        )
    if occurrence is None:
        if len(found) > 1:
            raise ReplayUsageError(
                f"--kernel {text!r} matches {len(found)} launches (operations {found[0]}..{found[-1]}); "
                f"pick one with '{pattern_text}#K', K from 0 to {len(found) - 1}"
            )
        return found[0]
    if occurrence >= len(found):
        raise ReplayUsageError(
            f"--kernel {text!r}: {pattern_text!r} matches {len(found)} launches, so #{occurrence} does not exist "
            f"(K from 0 to {len(found) - 1})"
        )
    return found[occurrence]


def _find_scope(text: str, spans: list[ScopeSpan]) -> ScopeSpan:
    exact = [s for s in spans if s.name == text]
    if len(exact) == 1:
        return exact[0]
    match = _OCCURRENCE.match(text)
    if not exact and match:
        named = [s for s in spans if s.name == match["base"]]
        k = int(match["k"])
        if k < len(named):
            return named[k]
        if named:
            raise ReplayUsageError(
                f"--scope {text!r}: there are {len(named)} scopes named {match['base']!r} (#0..#{len(named) - 1})"
            )
    if len(exact) > 1:
        raise ReplayUsageError(f"--scope {text!r}: {len(exact)} scopes have that name; pick one with '{text}#K'")
    names = sorted({s.name for s in spans})
    shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
    raise ReplayUsageError(f"--scope {text!r}: no such scope (scopes: {shown or 'none'})")


def _check_one_region(first: int, last: int, region_of: list[int]) -> None:
    if region_of[first] != region_of[last]:
        raise ReplayUsageError(
            f"operations {first}..{last} span regions (one begins at operation {region_of[last]}); "
            "each region's starting state applies where it begins: extract one region (a scope) at a time"
        )
