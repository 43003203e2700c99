"""The corpus verb: every capture of a directory verified (or planned) on a fan-out of workers, one
row each, compared with a baseline (``corpus-replay`` calls :func:`corpus`).

Each capture is one task (:func:`verify_row`) on a worker pinned to one GPU: the verify verb with
run-replay --verify's options, then timed runs (their median is the row's device time). So a
corpus row's "verified" is run-replay --verify's and the recorder's self-check's: one function, one
option set. A capture that breaks its CUDA context poisons its worker, which is replaced; one that
crashes or hangs its process loses it, which is replaced too; the row says so.

Rows that need several GPUs (:func:`~replayfmt.measure.corpus.corpus_entries`) run after the
others, one at a time, on the first of ``options.devices``: a capture of several devices as the
same task on a fresh local worker pinned to as many GPUs; a job's ranks through
:func:`~replayfmt.verbs.ranks.verify_ranks` from this process (it starts a process per rank, which
a worker, a daemon, may not).
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
    CorpusEntry,
    CorpusRow,
    compare,
    corpus_entries,
    corpus_files,
    read_csv,
    run_corpus,
    write_csv as write_rows,
)
from replayfmt.measure.fanout import LocalFanOut, Outcome, open_fanout, worker_name
from replayfmt.measure.tune import check_output_writable
from replayfmt.replay.collectives import cuda_gpu_count
from replayfmt.replay.verify_types import Outcome as Verified, VerifyOptions, VerifyResult
from replayfmt.verbs.ranks import RanksOptions, RanksResult, verify_ranks
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
    ``repetitions`` (timed runs after the verified one), ``devices`` (the ordinals its captured
    devices run on, as the worker sees them; default cuda:0). Poisoned after a sticky CUDA error."""
    dry_run = bool(settings.get("dry_run"))
    timed = 0 if dry_run else max(1, int(settings.get("repetitions", 3)))
    limits = DEFAULT_LIMITS.overridden(settings.get("limits", {}))
    devices = tuple(settings.get("devices", (0,)))
    poisoned, verdict = False, ""
    try:
        options = VerifyOptions(dry_run=dry_run, timed_runs=timed, limits=limits, devices=devices)
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
    devices: tuple[int, ...] = (0,)  # one worker per GPU; a row that needs k GPUs runs on the first k
    scheduler: str | None = None  # a Dask cluster's address
    engine: str | None = None  # auto, dask, local
    timeout_s: float = 600.0  # per row; past it the worker is replaced (row lost) or a job's ranks stopped (failed)
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
        """Every row is unavailable: nothing could run here (no GPU, or fewer than a row needs)."""
        return bool(self.rows) and all(r.verdict == "unavailable" for r in self.rows)


def corpus(
    directory: str | os.PathLike[str], options: CorpusOptions | None = None, *, progress: Progress | None = None
) -> CorpusResult:
    """Verify (or plan) every capture of ``directory`` on the workers ``options`` name; compare
    with ``options.baseline``; write ``options.csv``. ``progress`` is told the captures and workers.
    A job's ranks make one row, and so does a capture of several devices, run after the others on
    as many of ``options.devices`` (module docstring); ``dry_run`` plans every file alone."""
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
    entries = _entries(paths, options)
    baseline_entries = _entries(baseline_paths, options) if baseline_paths is not None else []
    alone = [[e.paths[0] for e in found if e.gpus == 1] for found in (entries, baseline_entries)]
    together = [[e for e in found if e.gpus > 1] for found in (entries, baseline_entries)]
    timeout, gpus = options.timeout_s, list(options.devices)
    counted = f"corpus: {len(paths)} capture(s) in {directory}"
    if together[0]:
        counted += f" ({len(together[0])} row(s) needing several GPUs run after the others)"
    rows, before_rows, replaced = [], [], 0
    if alone[0] or alone[1]:
        engine, pin = options.engine or "auto", not options.dry_run
        with open_fanout(gpus, engine=engine, scheduler=options.scheduler, pin=pin) as f:
            say(f"{counted}; workers: {f.describe()}")
            rows = list(run_corpus(f, alone[0], settings, timeout=timeout, task=verify_row))
            before_rows = list(run_corpus(f, alone[1], settings, timeout=timeout, task=verify_row))
            replaced = f.replaced
    else:
        say(counted)
    for found, out in zip(together, (rows, before_rows), strict=True):  # the fan-out is gone: its GPUs are free
        for entry in found:
            row, lost = _row_on_several_gpus(entry, options, settings, say)
            out.append(row)
            replaced += lost
    rows.sort(key=lambda r: r.capture)
    if baseline_paths is not None:
        before = sorted(before_rows, key=lambda r: r.capture)
    if options.csv is not None:
        write_rows(options.csv, rows)
    comparisons = tuple(compare(rows, before, options.threshold)) if before is not None else None
    return CorpusResult(os.fspath(directory), tuple(rows), comparisons, replaced)


def _entries(paths: list[Path], options: CorpusOptions) -> list[CorpusEntry]:
    """The rows ``paths`` make: every file alone for a dry run (a plan needs no GPU)."""
    if options.dry_run:
        return [CorpusEntry(path.name, (path,)) for path in paths]
    return corpus_entries(paths, limits=options.limits)


def _row_on_several_gpus(
    entry: CorpusEntry, options: CorpusOptions, settings: dict[str, Any], say: Progress
) -> tuple[CorpusRow, int]:
    """The row of an entry that needs several GPUs, run on the first of ``options.devices``; and
    how many workers were replaced."""
    need = f"needs {entry.gpus} GPUs ({entry.why})"
    if options.scheduler is not None:
        why = f"{need}: such rows run on local processes only (--device), not on the Dask cluster at --scheduler"
        return CorpusRow(entry.name, "unavailable", error=why), 0
    if len(options.devices) < entry.gpus:
        wanted = [*options.devices, *(k for k in range(entry.gpus) if k not in options.devices)][: entry.gpus]
        flags = " ".join(f"--device cuda:{k}" for k in wanted)
        why = f"{need}; --device gives {len(options.devices)}: give {flags}"
        return CorpusRow(entry.name, "unavailable", error=why), 0
    gpus = options.devices[: entry.gpus]
    say(f"corpus: {entry.name}: {entry.why} on {', '.join(f'cuda:{k}' for k in gpus)}")
    if entry.job:
        return _job_row(entry, gpus, options), 0
    with LocalFanOut([gpus], pin=True) as fanout:  # the worker sees its GPUs as cuda:0, cuda:1, ...
        each = {**settings, "devices": tuple(range(entry.gpus))}
        (row,) = run_corpus(fanout, entry.paths, each, timeout=options.timeout_s, task=verify_row)
        return row, fanout.replaced


def _job_row(entry: CorpusEntry, gpus: tuple[int, ...], options: CorpusOptions) -> CorpusRow:
    """A job's row: its ranks verified together (:func:`verify_ranks`, rank k on ``gpus[k]``),
    then timed as other rows are. Its device time is the slowest rank's median (none where a rank
    made no timed run), its ranges and operations every rank's, its verdict the worst rank's, its
    error the first of the worst ranks'."""
    worker = worker_name(gpus)
    # each rank's process would find its GPU missing and fail: a machine with too few is told here
    try:
        count = cuda_gpu_count()
    except ReplayError as exc:
        return CorpusRow(entry.name, "unavailable", worker=worker, error=f"needs {entry.gpus} GPUs: {exc}")
    if max(gpus) >= count:
        named = ", ".join(f"cuda:{k}" for k in gpus)
        why = f"needs {entry.gpus} GPUs ({entry.why}) on {named}; this machine has {count}"
        return CorpusRow(entry.name, "unavailable", worker=worker, error=why)
    verify_options = VerifyOptions(timed_runs=options.repetitions, limits=options.limits)
    ranks_options = RanksOptions(verify=verify_options, devices=gpus, timeout_s=options.timeout_s)
    try:
        result = verify_ranks([str(p) for p in entry.paths], ranks_options)
    except ReplayError as exc:  # they do not form one job, NCCL is missing, ...
        verdict = "unavailable" if isinstance(exc, DeviceUnavailableError) else "failed"
        return CorpusRow(entry.name, verdict, worker=worker, error=str(exc))
    return _ranks_row(entry.name, result, worker)


def _ranks_row(name: str, result: RanksResult, worker: str = "") -> CorpusRow:
    """The row of a job whose ranks :func:`verify_ranks` replayed together (:func:`_job_row`)."""
    each = [r.result for r in result.ranks]
    medians = [statistics.median(r.timed_ms) for r in each if r.timed_ms]
    setups = [r.setup_s for r in each if r.setup_s]
    # the detail of a rank as bad as the row says (an earlier rank with a lesser complaint, nothing
    # to verify say, would name the wrong problem)
    failing = next((r for r in each if r.outcome is result.outcome and r.detail), None)
    return CorpusRow(
        name,
        ROW_VERDICTS[result.outcome],
        operations=sum(r.operations for r in each),
        ranges=sum(r.compared for r in each),
        device_ms=max(medians) if medians and len(medians) == len(each) else None,  # a rank untimed: unknown
        host_s=max(setups) if setups else None,  # the ranks set up side by side
        worker=worker,
        error=failing.detail if failing is not None else "",
    )
