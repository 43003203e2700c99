"""The corpus verb: every capture of a directory verified (or planned) on a fan-out of workers, one
row each, compared with a baseline (``corpus-replay`` calls :func:`corpus`).

Each capture is one task (:func:`verify_row`) on a worker pinned to one GPU: the verify verb with
run-replay --verify's options, then timed runs (their median is the row's device time). So a
corpus row's "verified" is run-replay --verify's and the recorder's self-check's: one function, one
option set. A capture that breaks its CUDA context poisons its worker, which is replaced; one that
crashes or hangs its process loses it, which is replaced too; the row says so.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from replayfmt.errors import DeviceError, DeviceUnavailableError, ReplayError, ReplayUsageError
from replayfmt.format.layout import DEFAULT_LIMITS, Limits
from replayfmt.measure.corpus import (
    VERDICTS,
    Comparison,
    CorpusRow,
    compare,
    corpus_files,
    read_csv,
    run_corpus,
    write_csv as write_rows,
)
from replayfmt.measure.fanout import Outcome, open_fanout
from replayfmt.measure.tune import check_output_writable
from replayfmt.replay.verify_types import Outcome as Verified, VerifyOptions, VerifyResult
from replayfmt.verbs.verifying import verify

Progress = Callable[[str], None]

# a verification's outcome as a corpus row's verdict (VERDICTS)
ROW_VERDICTS = {
    Verified.VERIFIED: "verified",
    Verified.NOTHING_TO_VERIFY: "replayed",
    Verified.REPLAYED: "replayed",
    Verified.PLANNED: "planned",
    Verified.MISMATCH: "mismatch",
    Verified.FAILED: "failed",
    Verified.UNAVAILABLE: "failed",  # an unreadable file: its row fails (no GPU here: "unavailable", below)
}


def verify_row(path: str, settings: dict[str, Any]) -> Outcome:
    """A fan-out task: one capture's row (as a dict). ``settings``: ``dry_run`` (plan only),
    ``repetitions`` (timed runs after the verified one). Poisoned after a sticky CUDA error."""
    dry_run = bool(settings.get("dry_run"))
    timed = 0 if dry_run else max(1, int(settings.get("repetitions", 3)))
    limits = DEFAULT_LIMITS.overridden(settings.get("limits", {}))
    poisoned, verdict = False, ""
    try:
        options = VerifyOptions(dry_run=dry_run, timed_runs=timed, limits=limits)
        result = verify(path, options)
    except ReplayError as exc:
        result = VerifyResult.from_error(path, exc)
        poisoned = isinstance(exc, DeviceError) and exc.sticky
        verdict = "unavailable" if isinstance(exc, DeviceUnavailableError) else ""
    row = CorpusRow(
        Path(path).name,
        verdict or ROW_VERDICTS[result.outcome],
        operations=result.operations,
        ranges=result.compared,
        device_ms=statistics.median(result.timed_ms) if result.timed_ms else None,
        host_s=result.setup_s or None,
        error=result.detail,
    )
    return Outcome(asdict(row), poisoned=poisoned)


@dataclass(frozen=True)
class CorpusOptions:
    """What :func:`corpus` is asked; the defaults are ``corpus-replay DIR``'s."""

    dry_run: bool = False  # plan every capture; run nothing (no GPU needed)
    repetitions: int = 3  # timed runs after the verified one
    devices: tuple[int, ...] = (0,)  # one worker per GPU
    scheduler: str | None = None  # a Dask cluster's address
    engine: str | None = None  # auto, dask, local
    timeout_s: float = 600.0  # per capture; past it the worker is replaced and the row is lost
    csv: Path | None = None  # the rows written here (a new file)
    baseline: Path | None = None  # another directory of the same captures, or a CSV of an earlier run
    threshold: float = 1.05  # device time over this times the baseline's is a regression
    limits: Limits = DEFAULT_LIMITS  # the reader's caps (--limit NAME=VALUE), the workers' too

    def __post_init__(self) -> None:
        if self.repetitions < 1 or not self.timeout_s > 0 or not self.threshold > 0:
            raise ReplayUsageError("repetitions must be >= 1, timeout and threshold > 0")


@dataclass(frozen=True)
class CorpusResult:
    """Every capture's row (by name), and the comparison with the baseline when one was given."""

    directory: str
    rows: tuple[CorpusRow, ...]
    comparisons: tuple[Comparison, ...] | None = None  # None: no baseline
    replaced: int = 0  # workers replaced (a capture broke its CUDA context, crashed or hung)

    @property
    def failed(self) -> list[CorpusRow]:
        return [r for r in self.rows if not r.ok]

    @property
    def regressions(self) -> list[Comparison]:
        return [c for c in self.comparisons or () if c.regression]

    @property
    def counts(self) -> dict[str, int]:
        """Rows per verdict, best first (verdicts no row has left out)."""
        return {v: n for v in VERDICTS if (n := sum(1 for r in self.rows if r.verdict == v))}

    @property
    def nowhere_to_run(self) -> bool:
        """Every row is unavailable: no GPU for any worker."""
        return bool(self.rows) and all(r.verdict == "unavailable" for r in self.rows)


def corpus(
    directory: str | os.PathLike[str], options: CorpusOptions | None = None, *, progress: Progress | None = None
) -> CorpusResult:
    """Verify (or plan) every capture of ``directory`` on the workers ``options`` name; compare
    with ``options.baseline``; write ``options.csv``. ``progress`` is told the captures and workers."""
    options = options or CorpusOptions()
    say = progress or (lambda _line: None)
    paths = corpus_files(Path(directory))
    baseline, baseline_paths = options.baseline, None
    if baseline is not None:
        if baseline.is_dir():
            baseline_paths = corpus_files(baseline, "--compare-to")
        elif not baseline.is_file():
            raise ReplayUsageError(f"--compare-to {baseline}: no such directory or CSV file")
    before = read_csv(baseline) if baseline is not None and baseline_paths is None else None  # before any work
    if options.csv is not None:
        if options.csv.exists():
            raise ReplayUsageError(f"--csv {options.csv}: already exists; choose another file")
        check_output_writable(options.csv, "--csv")
    settings = {"dry_run": options.dry_run, "repetitions": options.repetitions, "limits": options.limits.changes()}
    timeout, gpus = options.timeout_s, list(options.devices)
    with open_fanout(gpus, engine=options.engine or "auto", scheduler=options.scheduler, pin=not options.dry_run) as f:
        say(f"corpus: {len(paths)} capture(s) in {directory}; workers: {f.describe()}")
        rows = sorted(run_corpus(f, paths, settings, timeout=timeout, task=verify_row), key=lambda r: r.capture)
        if baseline_paths is not None:
            before = sorted(
                run_corpus(f, baseline_paths, settings, timeout=timeout, task=verify_row), key=lambda r: r.capture
            )
        replaced = f.replaced
    if options.csv is not None:
        write_rows(options.csv, rows)
    comparisons = tuple(compare(rows, before, options.threshold)) if before is not None else None
    return CorpusResult(os.fspath(directory), tuple(rows), comparisons, replaced)
