"""What dump-replay shows: which rows a filter keeps, and how payload bytes are written."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from replayfmt.errors import ReplayUsageError
from replayfmt.format import model as m

JSONL_VERSION = 6  # 2: state rows, buffer ranges, summary state/upload bytes, original_ns, demangled names;
# 3: relocations of state and copy_h2d rows (pointers stored in data), checkpoint types, summary partial and
# stored_pointers; 4: which GPUs the code loads on (executable cubin_targets, ptx_targets, has_ptx; summary
# runs_on, runs_on_by_cubin, runs_on_by_ptx, executables_without_ptx, executables_unknown_targets);
# 5: state rows' undefined (format 1.6); 6: graph rows' edge_data (format 1.7)
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
