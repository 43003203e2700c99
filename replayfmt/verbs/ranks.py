"""The ranks of one job replayed together: each rank's capture replays in a process of its own, on
a GPU of its own, and their collectives (format 1.5) run among them through NCCL as they ran
among the program's ranks. :func:`verify_ranks` verifies each rank's outputs as :func:`verify`
verifies one capture (``run-replay --verify job.rank0.kreplay job.rank1.kreplay``);
:func:`benchmark_ranks` times each rank's region as :func:`benchmark` does
(``benchmark-replay job.rank0.kreplay job.rank1.kreplay``), every rank making the same runs.

Before any GPU work the captures are read and matched: every communicator a capture's collectives
use must be held by as many captures as it has ranks, each with a rank of its own. The launcher
makes one NCCL unique id per communicator and gives every rank's process the ids
(:class:`~replayfmt.replay.collectives.Peers`). A rank that fails stops the others: they would wait
in their next collective forever.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import queue
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from replayfmt.errors import ReplayError, ReplayUsageError
from replayfmt.format import model as m
from replayfmt.measure.benchmark import BenchmarkResult
from replayfmt.reader import open_capture
from replayfmt.replay.collectives import REDUCTIONS, Nccl, Peers, cuda_gpu_count, local_peers
from replayfmt.replay.verify_types import Outcome, VerifyOptions, VerifyResult
from replayfmt.verbs.benchmarking import BenchmarkReplayOptions, benchmark
from replayfmt.verbs.verifying import verify

Progress = Callable[[int, str], None]  # (rank, a line of that rank's replay)
_GRACE_S = 20.0  # how long the other ranks may finish once one has failed
_RANK_ITERATIONS = 20  # timed iterations of each rank when none are asked
_O = m.CollectiveOperation
_REDUCING = {_O.ALL_REDUCE, _O.REDUCE, _O.REDUCE_SCATTER}
_WORST_FIRST = (Outcome.UNAVAILABLE, Outcome.FAILED, Outcome.MISMATCH, Outcome.NOTHING_TO_VERIFY, Outcome.REPLAYED)


@dataclass(frozen=True)
class RankCapture:
    """One rank's capture, as read before any replay."""

    path: str
    rank: int  # the job's rank (its metadata's, else its place among the captures given)
    devices: int
    communicators: dict[str, tuple[int, int]]  # communicator -> (this rank in it, its ranks)
    collectives: tuple[tuple[int, str], ...]  # (operation, communicator) of each collective, in order
    received: tuple[tuple[int, int, int, int, str], ...] = ()  # (operation, buffer, offset, size, what) written
    held: tuple[int, ...] = ()  # the ranks this one capture holds (a process that drove several devices)

    @property
    def label(self) -> str:
        return f"ranks {', '.join(map(str, self.held))}" if self.held else f"rank {self.rank}"

    def collectives_into(self, buffer: int, offset: int, size: int, before: int) -> list[str]:
        """The collectives before operation ``before`` that wrote into the range, latest first."""
        found = [
            f"operation {index} ({what})"
            for index, b, o, n, what in self.received
            if index < before and b == buffer and o < offset + size and offset < o + n
        ]
        return found[::-1]


@dataclass(frozen=True)
class RankOutcome:
    """What one rank's replay answered."""

    capture: RankCapture
    device: int  # the CUDA ordinal it ran on
    result: VerifyResult


@dataclass(frozen=True)
class RanksResult:
    ranks: tuple[RankOutcome, ...]
    collectives: int = 0  # collectives among the ranks, in all captures

    @property
    def outcome(self) -> Outcome:
        """The worst rank's outcome (verified only when every rank is)."""
        found = {r.result.outcome for r in self.ranks}
        return next((o for o in _WORST_FIRST if o in found), self.ranks[0].result.outcome)

    @property
    def exit_code(self) -> int:
        return max(r.result.exit_code for r in self.ranks)


@dataclass(frozen=True)
class PlantedReduction:
    """Issue one collective with another reduction in every rank (a planted wrong collective):
    operation ``operation`` of the first capture given, and its counterparts in the others."""

    operation: int
    reduction: int


@dataclass(frozen=True)
class RanksOptions:
    verify: VerifyOptions = field(default_factory=VerifyOptions)
    devices: tuple[int, ...] = ()  # rank k (in the order given) runs on cuda:devices[k] (empty: cuda:k)
    planted: tuple[PlantedReduction, ...] = ()
    timeout_s: float = 600.0


def read_ranks(paths: Sequence[str | os.PathLike[str]], options: VerifyOptions) -> list[RankCapture]:
    """Read each capture's rank and collectives, and check they form one job (no GPU)."""
    captures = []
    for position, path in enumerate(paths):
        with open_capture(path, limits=options.limits) as cap:
            properties = dict(cap.metadata.properties)
            communicators: dict[str, tuple[int, int]] = {}
            collectives, received = [], []
            for op in cap.iter_operations():
                if isinstance(op, m.Collective):
                    if op.operation in _REDUCING and op.reduction not in REDUCTIONS.values():
                        raise ReplayUsageError(
                            f"{path}: operation {op.index} ({op.describe()}) reduces with NCCL operation "
                            f"{op.reduction}, one the program made (a pre-multiplied sum): its ranks cannot "
                            "replay it together; each rank replays alone"
                        )
                    communicators[op.communicator] = (op.rank, op.ranks)
                    collectives.append((op.index, op.communicator))
                    if op.recv_size:
                        received.append((op.index, op.recv_buffer, op.recv_offset, op.recv_size, op.operation.label))
            devices = sum(1 for obj in cap.object_table().others.values() if isinstance(obj, m.Device))
            rank = int(properties["rank"]) if properties.get("rank", "").isdigit() else position
            collected = (tuple(collectives), tuple(received))
            captures.append(RankCapture(os.fspath(path), rank, devices, communicators, *collected))
    _check_job(captures)
    return captures


def _check_job(captures: list[RankCapture]) -> None:
    ranks = [c.rank for c in captures]
    if len(set(ranks)) != len(ranks):
        raise ReplayUsageError(f"two of the captures given are rank {max(ranks, key=ranks.count)} of their job")
    for c in captures:
        if c.devices > 1:
            raise ReplayUsageError(f"{c.path}: a rank that works on {c.devices} devices is not replayed among ranks")
    members: dict[str, dict[int, str]] = {}
    for c in captures:
        for communicator, (rank, _size) in c.communicators.items():
            held = members.setdefault(communicator, {})
            if rank in held:
                raise ReplayUsageError(f"{c.path} and {held[rank]} are both rank {rank} of communicator {communicator}")
            held[rank] = c.path
    for c in captures:
        for communicator, (_rank, size) in c.communicators.items():
            held = members[communicator]
            if len(held) != size:
                missing = sorted(set(range(size)) - set(held))
                raise ReplayUsageError(
                    f"{c.path}: communicator {communicator} has {size} ranks, but the captures given hold "
                    f"{len(held)} of them (missing rank(s) {', '.join(map(str, missing))}): give every rank's capture"
                )


def _planted_by_rank(captures: list[RankCapture], planted: Sequence[PlantedReduction]) -> list[dict[int, int]]:
    """Each capture's operations to issue with another reduction: the planted operation of the
    first capture, found in each other by its place among its communicator's collectives."""
    out: list[dict[int, int]] = [{} for _ in captures]
    for plant in planted:
        first = captures[0].collectives
        found = [k for k, (index, _) in enumerate(first) if index == plant.operation]
        if not found:
            raise ReplayUsageError(
                f"--collective-reduction: operation {plant.operation} of {captures[0].path} is no collective"
            )
        communicator = first[found[0]][1]
        place = sum(1 for index, c in first[: found[0]] if c == communicator)
        for k, capture in enumerate(captures):
            on_it = [index for index, c in capture.collectives if c == communicator]
            if place < len(on_it):
                out[k][on_it[place]] = plant.reduction
    return out


@dataclass(frozen=True)
class _Job:
    """The ranks' captures matched, their GPUs and each one's peers (NCCL ids made)."""

    captures: list[RankCapture]
    devices: tuple[int, ...]
    peers: list[Peers]


def _job(
    paths: Sequence[str | os.PathLike[str]],
    verify_options: VerifyOptions,
    devices: tuple[int, ...],
    planted: Sequence[PlantedReduction],
    nccl: Callable[[], Nccl],
) -> _Job:
    if len(paths) < 2:
        raise ReplayUsageError("replaying ranks together needs the capture of every rank (two or more)")
    captures = read_ranks(paths, verify_options)
    devices = devices or tuple(range(len(captures)))
    if len(devices) != len(captures):
        raise ReplayUsageError(f"--device is given {len(devices)} times for {len(captures)} ranks' captures")
    reductions = _planted_by_rank(captures, planted)
    communicators = sorted({name for c in captures for name in c.communicators})
    library = nccl() if communicators else None
    unique_ids = {name: library.unique_id() for name in communicators} if library is not None else {}
    return _Job(captures, devices, [Peers(unique_ids, reductions[k]) for k in range(len(captures))])


def verify_ranks(
    paths: Sequence[str | os.PathLike[str]],
    options: RanksOptions | None = None,
    *,
    progress: Progress | None = None,
    nccl: Callable[[], Nccl] = Nccl,
) -> RanksResult:
    """Replay the captures of one job's ranks together, each in a process of its own, and verify
    every rank. Raises ReplayError when they do not form one job or NCCL cannot be reached."""
    options = options or RanksOptions()
    if len(paths) == 1:
        return _verify_held(os.fspath(paths[0]), options, progress, nccl)
    job = _job(paths, options.verify, options.devices, options.planted, nccl)
    each = [
        dataclasses.replace(options.verify, devices=(job.devices[k],), peers=job.peers[k], dry_run=False)
        for k in range(len(job.captures))
    ]
    answers = _run(job.captures, _verify_worker, each, options.timeout_s, progress)
    results = [
        _with_suspects(c, a) if isinstance(a, VerifyResult) else _stopped(c, a)
        for c, a in zip(job.captures, answers, strict=True)
    ]
    outcomes = tuple(RankOutcome(c, job.devices[k], results[k]) for k, c in enumerate(job.captures))
    return RanksResult(outcomes, sum(len(c.collectives) for c in job.captures))


@dataclass(frozen=True)
class RankBenchmark:
    capture: RankCapture
    device: int
    result: BenchmarkResult | None
    error: str = ""  # why it has no result


def benchmark_ranks(
    paths: Sequence[str | os.PathLike[str]],
    options: BenchmarkReplayOptions | None = None,
    *,
    devices: tuple[int, ...] = (),
    timeout_s: float = 600.0,
    nccl: Callable[[], Nccl] = Nccl,
) -> list[RankBenchmark]:
    """Time the region of every rank's capture with the ranks replayed together (their
    collectives among them): each rank makes the same runs, a fixed number of iterations."""
    options = options or BenchmarkReplayOptions()
    if options.measure.repetitions is None:  # timed to a minimum time, ranks would run unlike counts
        measure = dataclasses.replace(options.measure, repetitions=_RANK_ITERATIONS)
        options = dataclasses.replace(options, measure=measure)
    job = _job(paths, VerifyOptions(limits=options.limits), devices, (), nccl)
    each = [
        dataclasses.replace(options, devices=(job.devices[k],), peers=job.peers[k]) for k in range(len(job.captures))
    ]
    answers = _run(job.captures, _benchmark_worker, each, timeout_s, None)
    return [
        RankBenchmark(c, job.devices[k], a, "")
        if isinstance(a, BenchmarkResult)
        else RankBenchmark(c, job.devices[k], None, str(a))
        for k, (c, a) in enumerate(zip(job.captures, answers, strict=True))
    ]


def _verify_worker(position: int, path: str, options: VerifyOptions, answers: multiprocessing.Queue) -> None:
    try:
        result = verify(path, options, progress=lambda line: answers.put(("line", position, line)))
    except ReplayError as exc:
        result = VerifyResult.from_error(path, exc)
    answers.put(("result", position, result))


def _benchmark_worker(
    position: int, path: str, options: BenchmarkReplayOptions, answers: multiprocessing.Queue
) -> None:
    try:
        answers.put(("result", position, benchmark(path, options)))
    except ReplayError as exc:
        answers.put(("result", position, _Failed(str(exc))))


class _Failed(str):
    """A rank's answer that is no result: why (a worker's error, or why it was stopped)."""


def _run(
    captures: list[RankCapture], target: Callable[..., None], options: list, timeout_s: float, progress: Progress | None
) -> list:
    """Run ``target(position, path, options[k], answers)`` for each rank, each in a process of its
    own; each rank's answer, or a :class:`_Failed` saying why it has none."""
    context = multiprocessing.get_context("spawn")  # CUDA does not survive a fork
    answers = context.Queue()
    workers = []
    for k, capture in enumerate(captures):
        worker = context.Process(target=target, args=(k, capture.path, options[k], answers), daemon=True)
        worker.start()
        workers.append(worker)
    return _gather(captures, workers, answers, timeout_s, progress)


def _gather(
    captures: list[RankCapture],
    workers: list,
    answers: multiprocessing.Queue,
    timeout_s: float,
    progress: Progress | None,
) -> list:
    results: dict[int, object] = {}
    deadline = time.monotonic() + timeout_s
    stop_at: float | None = None  # once a rank failed: when the others are stopped
    while len(results) < len(captures):
        now = time.monotonic()
        if now > deadline or (stop_at is not None and now > stop_at):
            break
        try:
            kind, position, value = answers.get(timeout=0.5)
        except queue.Empty:
            for k, worker in enumerate(workers):
                if k not in results and not worker.is_alive() and worker.exitcode != 0:
                    results[k] = _Failed(f"its process ended with exit code {worker.exitcode}")
                    stop_at = stop_at or time.monotonic() + _GRACE_S
            continue
        if kind == "line":
            if progress is not None:
                progress(captures[position].rank, value)
            continue
        results[position] = value
        if _failed(value) and stop_at is None:
            stop_at = time.monotonic() + _GRACE_S
    first_failed = next((captures[k].rank for k, r in sorted(results.items()) if _failed(r)), None)
    for k, worker in enumerate(workers):
        if k not in results:
            why = (
                f"stopped after rank {first_failed} failed (it would wait for that rank in its next collective)"
                if first_failed is not None
                else f"no answer within {timeout_s:.0f} s (a collective its peers never reached?)"
            )
            results[k] = _Failed(why)
        if worker.is_alive():
            worker.terminate()
        worker.join(5)
    return [results[k] for k in range(len(captures))]


def _with_suspects(capture: RankCapture, result: VerifyResult) -> VerifyResult:
    """A rank's result whose first wrong range a collective wrote: the detail names the rank and
    that collective (what a wrong collective looks like from its outputs)."""
    if result.outcome is not Outcome.MISMATCH or result.report is None:
        return dataclasses.replace(result, detail=f"{capture.label}: {result.detail}" if result.detail else "")
    for wrong in (r for r in result.report["ranges"] if not r["passed"]):
        suspects = capture.collectives_into(wrong["buffer"], wrong["offset"], wrong["size"], wrong["operation"])
        if suspects:
            detail = f"{capture.label}: {result.detail}; the range was last written by collective {suspects[0]}"
            return dataclasses.replace(result, detail=detail)
    return dataclasses.replace(result, detail=f"{capture.label}: {result.detail}")


def _verify_held(path: str, options: RanksOptions, progress: Progress | None, nccl: Callable[[], Nccl]) -> RanksResult:
    """One capture that holds several ranks of a communicator (a process that drove several
    devices): its ranks replayed together in this process, each on a GPU of its own (the verify
    verb's ``with_local_peers``), a planted reduction issued by each rank's counterpart call."""
    devices = options.devices or options.verify.devices
    with open_capture(path, limits=options.verify.limits) as cap:
        calls: dict[tuple[str, int], list[int]] = {}  # (communicator, rank) -> its collectives, in order
        where: dict[int, tuple[str, int]] = {}
        received = []
        for op in cap.iter_operations():
            if isinstance(op, m.Collective):
                calls.setdefault((op.communicator, op.rank), []).append(op.index)
                where[op.index] = (op.communicator, op.rank)
                if op.recv_size:
                    what = f"{op.operation.label} of rank {op.rank}"
                    received.append((op.index, op.recv_buffer, op.recv_offset, op.recv_size, what))
        reductions: dict[int, int] = {}
        for plant in options.planted:
            if plant.operation not in where:
                raise ReplayUsageError(
                    f"--collective-reduction: operation {plant.operation} of {path} is no collective"
                )
            communicator, rank = where[plant.operation]
            place = calls[(communicator, rank)].index(plant.operation)
            for (name, _), indices in calls.items():
                if name == communicator and place < len(indices):
                    reductions[indices[place]] = plant.reduction
        count = sum(1 for obj in cap.object_table().others.values() if isinstance(obj, m.Device))
        peers, note = local_peers(cap, count, devices, gpu_count=cuda_gpu_count, nccl=nccl, reductions=reductions)
    if peers is None:
        why = note or "it holds one rank of each communicator"
        raise ReplayUsageError(
            f"{path}: its ranks cannot replay together here ({why}); replaying ranks together needs the capture "
            "of every rank (two or more), or one capture that holds several ranks of a communicator, a GPU per rank"
        )
    held = tuple(sorted({rank for ranks in peers.local.values() for rank, _ in ranks}))
    capture = RankCapture(
        path, held[0], count, {}, tuple((i, c) for i, (c, _) in sorted(where.items())), tuple(received), held
    )
    verify_options = dataclasses.replace(options.verify, devices=devices, peers=peers, dry_run=False)
    say = (lambda line: progress(held[0], line)) if progress is not None else None
    try:
        result = verify(path, verify_options, progress=say)
    except ReplayError as exc:
        result = VerifyResult.from_error(path, exc)
    outcome = RankOutcome(capture, devices[0] if devices else 0, _with_suspects(capture, result))
    return RanksResult((outcome,), len(where))


def _failed(answer: object) -> bool:
    return isinstance(answer, _Failed) or (isinstance(answer, VerifyResult) and answer.exit_code != 0)


def _stopped(capture: RankCapture, why: str) -> VerifyResult:
    return VerifyResult(capture.path, Outcome.FAILED, detail=f"rank {capture.rank}: {why}", errors=(why,))
