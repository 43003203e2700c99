"""A corpus: every capture of a directory replayed (or planned, without a GPU) on a fan-out of
workers, one row each, for compiler teams that replay hundreds of captures per change; compared
with a baseline (another directory of the same captures, or a CSV of an earlier run) to find
regressions.

Each capture is one task on a worker pinned to one GPU (the verify verb's,
:func:`replayfmt.verbs.corpus_runs.verify_row`). A capture that breaks its CUDA context poisons
its worker, which is replaced; one that crashes or hangs its process loses it, which is replaced
too; the row says so. Some rows need several GPUs at once (:func:`corpus_entries`): a capture of
a process that drove several devices, and a job's ranks (``NAME.rank0.kreplay``, ...) replayed
together. Here: which files make which rows, the rows, their CSV, and the comparison with a
baseline.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from replayfmt.errors import ReplayError, ReplayUsageError
from replayfmt.format import model as m
from replayfmt.format.layout import DEFAULT_LIMITS, Limits
from replayfmt.measure.fanout import FanOut, Task
from replayfmt.reader import open_capture

SUFFIX = ".kreplay"
_RANK_FILE = re.compile(r"(?P<prefix>.+)\.rank(?P<rank>[0-9]+)" + re.escape(SUFFIX))  # what torchrun's ranks write

# verdicts, best first: a row is worse than its baseline when its verdict comes later here
VERDICTS = ("verified", "replayed", "planned", "mismatch", "failed", "unavailable", "lost")


@dataclass
class CorpusRow:
    """One capture's outcome."""

    capture: str  # its file name in the corpus directory
    verdict: str = ""  # one of VERDICTS: verified (compared N > 0 ranges), replayed (nothing to
    # compare), planned (--dry-run), mismatch, failed, unavailable (no GPU here), lost (its worker died)
    operations: int = 0
    ranges: int = 0  # checkpoint ranges compared
    device_ms: float | None = None  # median device time of a run
    host_s: float | None = None  # open + plan (+ setup): the host's work before the device's
    worker: str = ""
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.verdict in ("verified", "replayed", "planned")


CSV_FIELDS = [f.name for f in fields(CorpusRow)]


def corpus_files(directory: Path, flag: str = "DIR") -> list[Path]:
    """The captures (``*.kreplay``) of ``directory``, sorted by name; a usage error when none."""
    if not directory.is_dir():
        raise ReplayUsageError(f"{flag} {directory}: not a directory")
    found = sorted(p for p in directory.iterdir() if p.suffix == SUFFIX and p.is_file())
    if not found:
        raise ReplayUsageError(f"{flag} {directory}: no {SUFFIX} files")
    return found


@dataclass(frozen=True)
class CorpusEntry:
    """One row's work: one capture, or a job's ranks replayed together; ``gpus``: how many GPUs
    it needs at once."""

    name: str  # the row's name: the file's, or PREFIX.rank*.kreplay for a job's ranks
    paths: tuple[Path, ...]  # one capture, or every rank's, in rank order
    gpus: int = 1

    @property
    def job(self) -> bool:
        """A job's ranks (replayed together, a process each), not one capture."""
        return len(self.paths) > 1

    @property
    def why(self) -> str:
        """Why it needs its GPUs, in words."""
        return f"{self.gpus} ranks together" if self.job else f"a capture on {self.gpus} devices"


@dataclass(frozen=True)
class _Seen:
    devices: int
    properties: dict[str, str]


def corpus_entries(paths: Sequence[Path], *, limits: Limits = DEFAULT_LIMITS) -> list[CorpusEntry]:
    """The rows ``paths`` make, by name. Files named ``PREFIX.rank<N>.kreplay`` whose group is
    complete (as many files as their recorded ``world_size``, ranks 0 to n-1 as named and as
    recorded, each a capture of one device) make one row of n GPUs, ``PREFIX.rank*.kreplay``; a
    capture of D > 1 devices needs D GPUs; any other file, an incomplete group's included, is a row
    of one GPU. Each file's header, metadata and objects are read (no operation); a file that cannot
    be read is a row of one GPU, whose worker says why."""
    seen = {path: _look(path, limits) for path in paths}
    groups: dict[str, list[tuple[int, Path]]] = {}
    for path in paths:
        if (match := _RANK_FILE.fullmatch(path.name)) is not None:
            groups.setdefault(match["prefix"], []).append((int(match["rank"]), path))
    entries, in_jobs = [], set()
    for prefix, members in groups.items():
        if _complete(sorted(members), seen):
            ranked = tuple(path for _, path in sorted(members))
            entries.append(CorpusEntry(f"{prefix}.rank*{SUFFIX}", ranked, len(ranked)))
            in_jobs.update(ranked)
    for path in paths:
        if path not in in_jobs:
            found = seen[path]
            entries.append(CorpusEntry(path.name, (path,), max(1, found.devices) if found is not None else 1))
    return sorted(entries, key=lambda e: e.name)


def _look(path: Path, limits: Limits) -> _Seen | None:
    """A capture's device count and metadata properties; None when it cannot be read."""
    try:
        with open_capture(path, limits=limits) as cap:
            devices = sum(1 for obj in cap.object_table().others.values() if isinstance(obj, m.Device))
            return _Seen(devices, dict(cap.metadata.properties))
    except (ReplayError, OSError):
        return None


def _complete(members: list[tuple[int, Path]], seen: dict[Path, _Seen | None]) -> bool:
    """Whether a group of rank files (sorted by rank) is a whole job of one-device ranks."""
    if len(members) < 2 or [rank for rank, _ in members] != list(range(len(members))):
        return False
    for rank, path in members:
        found = seen[path]
        if found is None or found.devices > 1:
            return False
        recorded = (found.properties.get("rank", ""), found.properties.get("world_size", ""))
        if not all(value.isdigit() for value in recorded) or tuple(map(int, recorded)) != (rank, len(members)):
            return False
    return True


def run_corpus(
    fanout: FanOut,
    paths: Iterable[Path],
    settings: dict[str, Any],
    *,
    timeout: float | None = None,
    task: Callable[[str, dict[str, Any]], Any],
) -> Iterator[CorpusRow]:
    """Every capture of ``paths`` as a row, in the order they complete (``task(path, settings)``
    does one, on a worker, and answers an Outcome holding the row as a dict:
    :func:`replayfmt.verbs.corpus_runs.verify_row`)."""
    tasks = [Task(path.name, task, (str(path), settings)) for path in paths]
    for outcome in fanout.run(tasks, timeout=timeout):
        if outcome.error:
            row = CorpusRow(outcome.key, "lost", worker=outcome.worker, error=outcome.error)
        else:
            row = CorpusRow(**outcome.value)
            row.worker = outcome.worker
        if outcome.worker_replaced and row.verdict != "lost":
            row.error = (row.error + "; " if row.error else "") + "its worker was replaced after it"
        yield row


# ------------------------------------------------------------------------------------------
# CSV and comparison


def write_csv(path: Path, rows: list[CorpusRow]) -> None:
    try:
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, CSV_FIELDS)
            writer.writeheader()
            for row in rows:
                writer.writerow({k: "" if v is None else v for k, v in asdict(row).items()})
    except OSError as exc:
        raise ReplayUsageError(f"--csv {path}: cannot write ({exc.strerror})") from None


def read_csv(path: Path, flag: str = "--compare-to") -> list[CorpusRow]:
    """The rows of a CSV that :func:`write_csv` wrote (an earlier run); ReplayUsageError, one line,
    for anything else (another CSV, a text or binary file, one that cannot be read)."""
    rows = []
    try:
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            missing = [
                k
                for k in ("capture", "verdict", "operations", "ranges", "device_ms", "host_s")
                if k not in (reader.fieldnames or ())
            ]
            if missing:
                raise ReplayUsageError(
                    f"{flag} {path}: not a corpus-replay CSV (its first line lacks the column(s) "
                    f"{', '.join(missing)}); give a directory of captures or an earlier run's --csv"
                )
            for line, record in enumerate(reader, start=2):
                try:
                    rows.append(
                        CorpusRow(
                            record["capture"],
                            record["verdict"],
                            int(record["operations"] or 0),
                            int(record["ranges"] or 0),
                            float(record["device_ms"]) if record["device_ms"] else None,
                            float(record["host_s"]) if record["host_s"] else None,
                            record.get("worker", ""),
                            record.get("error", ""),
                        )
                    )
                except (KeyError, ValueError, TypeError) as exc:
                    raise ReplayUsageError(f"{flag} {path}: line {line} is not a corpus-replay row ({exc})") from None
    except OSError as exc:
        raise ReplayUsageError(f"{flag} {path}: cannot read ({exc.strerror})") from None
    except csv.Error as exc:
        raise ReplayUsageError(f"{flag} {path}: not a CSV ({exc})") from None
    except UnicodeDecodeError as exc:
        raise ReplayUsageError(f"{flag} {path}: not a CSV (not UTF-8 text: byte {exc.start})") from None
    return rows


@dataclass(frozen=True)
class Comparison:
    """A capture against its baseline."""

    capture: str
    row: CorpusRow | None
    baseline: CorpusRow | None
    ratio: float | None  # device time now / baseline (over 1: slower)
    regression: str  # why it is one ("" when not)


def compare(rows: list[CorpusRow], baseline: list[CorpusRow], threshold: float) -> list[Comparison]:
    """Pair rows with the baseline's by capture name: a regression is a verdict worse than the
    baseline's, a capture the baseline had and this run lacks, or device time over ``threshold``
    times the baseline's."""
    now = {r.capture: r for r in rows}
    before = {r.capture: r for r in baseline}
    out = []
    for name in sorted(now.keys() | before.keys()):
        row, base = now.get(name), before.get(name)
        ratio = None
        why = ""
        if row is None:
            why = "missing from this run"
        elif base is not None:
            if row.device_ms is not None and base.device_ms:
                ratio = row.device_ms / base.device_ms
            if _rank(row.verdict) > _rank(base.verdict) and not row.ok:
                why = f"{base.verdict} before, {row.verdict} now"
            elif ratio is not None and ratio > threshold:
                why = f"{ratio:.2f}x the baseline's device time (over {threshold:g}x)"
        out.append(Comparison(name, row, base, ratio, why))
    return out


def _rank(verdict: str) -> int:
    return VERDICTS.index(verdict) if verdict in VERDICTS else len(VERDICTS)
