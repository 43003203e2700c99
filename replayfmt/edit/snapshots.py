"""What a GPU prefix replay hands back to the extraction (:mod:`replayfmt.edit.prefix`), and the
narrowing it is asked to try: plain data, importable without a GPU."""

from __future__ import annotations

from dataclasses import dataclass, field

Ranges = dict[int, list[tuple[int, int]]]  # buffer id -> [start, end) ranges


@dataclass(frozen=True)
class Narrowing:
    """Candidate windows per buffer, most narrow first (see the module docstring); ``whole``:
    buffers never narrowed."""

    tiers: tuple[Ranges, ...] = ()
    whole: frozenset[int] = frozenset()


@dataclass
class Snapshots:
    """Bytes of buffer ranges, keyed ``(buffer, start, end)`` (source buffer ids)."""

    device: str = ""
    before: dict[tuple[int, int, int], bytes] = field(default_factory=dict)
    after: dict[tuple[int, int, int], bytes] = field(default_factory=dict)
    narrowed: str = ""  # which tier was used, in words
