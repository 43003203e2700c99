"""The diff verb: two captures compared, kernels added, removed or changed, and the original
program's times side by side (``diff-replay`` calls :func:`diff`), judged against thresholds."""

from __future__ import annotations

import os
from dataclasses import dataclass

from replayfmt.edit.diff import Diff, diff_captures
from replayfmt.edit.diff_view import DEFAULT_FAIL_ON, Threshold, failures
from replayfmt.errors import ReplayUsageError
from replayfmt.format.layout import DEFAULT_LIMITS, Limits
from replayfmt.reader import open_capture


@dataclass(frozen=True)
class DiffOptions:
    """What :func:`diff` is asked; the defaults are ``diff-replay A B``'s (every structural change fails)."""

    fail_on: tuple[Threshold, ...] = DEFAULT_FAIL_ON
    limits: Limits = DEFAULT_LIMITS  # the reader's caps (--limit NAME=VALUE)

    def __post_init__(self) -> None:
        if not self.fail_on:
            raise ReplayUsageError("fail_on: at least one threshold (the default: every structural change)")


@dataclass(frozen=True)
class DiffResult:
    """The comparison, and which thresholds it crossed (empty: none; the tool exits 0)."""

    diff: Diff
    failed: tuple[str, ...]


def diff(
    before: str | os.PathLike[str], after: str | os.PathLike[str], options: DiffOptions | None = None
) -> DiffResult:
    """Compare the captures at ``before`` and ``after`` (no GPU)."""
    options = options or DiffOptions()
    with open_capture(before, limits=options.limits) as a, open_capture(after, limits=options.limits) as b:
        compared = diff_captures(a, b)
    return DiffResult(compared, tuple(failures(compared, options.fail_on)))
