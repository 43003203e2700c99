"""Searching launch shapes on a replayed kernel, with every candidate verified and failures isolated.

The search space is the product of grids, blocks and dynamic shared-memory sizes (each optional:
an absent axis keeps the captured value). Points over the device's or the function's limits are
pruned before anything runs. Candidates are evaluated by a worker process (replayfmt.measure.tune_worker)
that owns one prepared replay: for each candidate it sets the target launches' shape, replays the
whole capture once and verifies every checkpoint, then times the target launches with CUDA events
(warm-up, repetitions, median). A candidate that faults, hangs or computes a wrong answer is
recorded as such; a worker that faulted (or timed out) is replaced and the search goes on.
Results are appended to a CSV as they come, so an interrupted search resumes where it stopped.
With several GPUs (or a Dask cluster), :func:`fan_out_search` spreads the candidates over one
worker per GPU (replayfmt.measure.fanout), each holding its own prepared replay.
"""

from __future__ import annotations

import csv
import itertools
import json
import os
import random
import re
import select
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import xxhash

from replayfmt.errors import DeviceUnavailableError, ReplayError, ReplayUsageError
from replayfmt.format import model as m
from replayfmt.format.names import demangle, matches_kernel
from replayfmt.measure.fanout import FanOut
from replayfmt.reader import Capture
from replayfmt.replay.graph_plan import kernel_nodes, node_launch
from replayfmt.replay.plan import Plan
from replayfmt.replay.plan_options import MAX_BLOCK, MAX_GRID, MAX_THREADS_PER_BLOCK, ShapeOverride

CSV_FIELDS = [
    "kernel",
    "operations",
    "grid",
    "block",
    "smem",
    "max_registers",
    "median_ms",
    "stddev_ms",
    "verified",
    "error",
    "baseline",
    "capture",
]
DEFAULT_MAX_SHARED = 227 * 1024  # Hopper's opt-in limit; the worker checks the real device


def _dims(d: m.Dims | None) -> str:
    return "" if d is None else f"{d[0]},{d[1]},{d[2]}"


@dataclass(frozen=True)
class Candidate:
    """One point: ``None`` keeps the captured value of that axis."""

    grid: m.Dims | None = None
    block: m.Dims | None = None
    smem: int | None = None
    max_registers: int | None = None  # re-JIT the PTX with this register cap

    def key(self) -> tuple[str, str, str, str]:
        return (
            _dims(self.grid),
            _dims(self.block),
            "" if self.smem is None else str(self.smem),
            "" if self.max_registers is None else str(self.max_registers),
        )

    @property
    def reshape(self) -> ShapeOverride:
        """The shape change this candidate makes to every launch it tunes."""
        return ShapeOverride(self.grid, self.block, self.smem)

    def describe(self) -> str:
        parts = [
            f"grid={_dims(self.grid)}" if self.grid else "",
            f"block={_dims(self.block)}" if self.block else "",
            f"smem={self.smem}" if self.smem is not None else "",
            f"max_registers={self.max_registers}" if self.max_registers is not None else "",
        ]
        return ",".join(p for p in parts if p) or "captured shape"


@dataclass
class CandidateResult:
    candidate: Candidate
    median_ms: float | None = None
    stddev_ms: float | None = None
    verified: bool | None = None  # None: not verified (no checkpoints) or not reached
    error: str = ""
    baseline: bool = False

    @property
    def ok(self) -> bool:
        return not self.error and self.verified is not False and self.median_ms is not None


def parse_dims_list(values: tuple[str, ...] | list[str], flag: str) -> list[m.Dims]:
    """``--block 64 --block "128;256" --block 32,4,1``: entries are x or x,y,z."""
    out = []
    for value in values:
        for entry in filter(None, (e.strip() for e in re.split(r"[;\s]+", value))):
            parts = entry.split(",")
            if len(parts) not in (1, 3) or not all(p.isdigit() and int(p) > 0 for p in parts):
                raise ReplayUsageError(f"{flag} {entry!r}: expected X or X,Y,Z with positive integers")
            x, y, z = (int(parts[0]), 1, 1) if len(parts) == 1 else tuple(int(p) for p in parts)
            out.append((x, y, z))
    return list(dict.fromkeys(out))


def parse_int_list(values: tuple[str, ...] | list[str], flag: str) -> list[int]:
    out = []
    for value in values:
        for entry in filter(None, (e.strip() for e in re.split(r"[;,\s]+", value))):
            if not entry.isdigit():
                raise ReplayUsageError(f"{flag} {entry!r}: expected a non-negative integer")
            out.append(int(entry))
    return list(dict.fromkeys(out))


@dataclass
class SearchSpace:
    grids: list[m.Dims] = field(default_factory=list)
    blocks: list[m.Dims] = field(default_factory=list)
    smems: list[int] = field(default_factory=list)
    max_registers: list[int] = field(default_factory=list)

    def points(self) -> list[Candidate]:
        axes = [self.grids or [None], self.blocks or [None], self.smems or [None], self.max_registers or [None]]
        return [Candidate(g, b, s, r) for g, b, s, r in itertools.product(*axes)]


@dataclass(frozen=True)
class Targets:
    """The launches tuned together (one kernel): their operation indices and captured shape.
    Kernel nodes of CUDA graphs are tuned as launches are: ``nodes`` names them (graph id, node
    index) and ``operations`` holds the graph launches that run them (what is timed)."""

    operations: tuple[int, ...]
    executable: int
    function: int
    kernel: str
    grid: m.Dims
    block: m.Dims
    smem: int
    nodes: tuple[tuple[int, int], ...] = ()
    graph_launches: tuple[int, ...] = ()  # the operations that are graph launches


def find_targets(plan: Plan, *, launch: int | None, kernel: str | None) -> Targets:
    """``--launch=OP``: that launch; ``--kernel=REGEX``: every launch of the one kernel it matches."""
    if (launch is None) == (kernel is None):
        raise ReplayUsageError("give exactly one of --launch=OP and --kernel=REGEX")
    if len(plan.devices) > 1:
        raise ReplayUsageError("tune-replay tunes single-device captures only in this version")
    pattern = compile_kernel_pattern(kernel) if kernel is not None else None
    found: list[m.Launch] = []
    nodes: dict[tuple[int, int], m.Launch] = {}  # (graph, node) -> the node as a launch of its first graph launch
    node_launches: list[int] = []
    for op in plan.capture.iter_operations():
        if isinstance(op, m.GraphLaunch) and pattern is not None:
            for graph, index, node in kernel_nodes(plan.graphs, op.graph, plan.capture.limits):
                if matches_kernel(pattern, plan.function(node.executable, node.function).name):
                    nodes.setdefault((graph, index), node_launch(op.index, node))
                    node_launches.append(op.index)
            continue
        if not isinstance(op, m.Launch):
            continue
        name = plan.function(op.executable, op.function).name
        if (launch is not None and op.index == launch) or (pattern is not None and matches_kernel(pattern, name)):
            found.append(op)
    launch_ops = [op.index for op in found]
    found += nodes.values()
    if not found:
        what = (
            f"--launch {launch}: operation {launch} is not a launch"
            if launch is not None
            else (f"--kernel {kernel!r}: no kernel matches (names: dump-replay --kind=executable CAPTURE)")
        )
        raise ReplayUsageError(what)
    kernels = {(op.executable, op.function) for op in found}
    if len(kernels) > 1:
        names = sorted({demangle(plan.function(e, f).name) for e, f in kernels})
        raise ReplayUsageError(f"--kernel {kernel!r} matches several kernels ({', '.join(names)}); narrow it")
    first = found[0]
    return Targets(
        tuple(sorted({*launch_ops, *node_launches})),
        first.executable,
        first.function,
        plan.function(first.executable, first.function).name,
        first.grid,
        first.block,
        first.shared_memory,
        tuple(nodes),
        tuple(sorted(set(node_launches))),
    )


def compile_kernel_pattern(kernel: str) -> re.Pattern[str]:
    """``--kernel REGEX``, matched against raw and demangled names; a bad pattern is a usage error."""
    try:
        return re.compile(kernel)
    except re.error as exc:
        raise ReplayUsageError(f"--kernel {kernel!r}: not a regular expression ({exc})") from None


def prune(
    plan: Plan, targets: Targets, points: list[Candidate], max_shared: int = DEFAULT_MAX_SHARED
) -> tuple[list[Candidate], list[tuple[Candidate, str]]]:
    """Split points into those worth running and those over a limit (with the reason)."""
    fn = plan.function(targets.executable, targets.function)
    image = plan.images.get(targets.executable)
    thread_limit = fn.max_threads_per_block or MAX_THREADS_PER_BLOCK
    if image is not None and image.cubin is not None and fn.name in image.cubin.kernels:
        bounds = image.cubin.kernels[fn.name].max_threads
        if bounds:
            thread_limit = min(thread_limit, bounds[0] * bounds[1] * bounds[2])
    smem_limit = min(fn.max_dynamic_shared_memory or max_shared, max_shared)
    valid, pruned = [], []
    for c in points:
        grid, block = c.grid or targets.grid, c.block or targets.block
        smem = targets.smem if c.smem is None else c.smem
        reason = ""
        if any(not 1 <= v <= limit for v, limit in zip(grid, MAX_GRID)):
            reason = f"grid {_dims(grid)} outside the device's limits"
        elif any(not 1 <= v <= limit for v, limit in zip(block, MAX_BLOCK)):
            reason = f"block {_dims(block)} outside the device's limits"
        elif block[0] * block[1] * block[2] > thread_limit:
            threads = block[0] * block[1] * block[2]
            reason = f"{threads} threads per block, over {demangle(fn.name)}'s limit of {thread_limit}"
        elif smem > smem_limit:
            reason = f"{smem} bytes of dynamic shared memory, over the limit of {smem_limit}"
        elif c.max_registers is not None and not 16 <= c.max_registers <= 255:
            reason = f"a register cap of {c.max_registers} is outside [16, 255]"
        (pruned.append((c, reason)) if reason else valid.append(c))
    return valid, pruned


# ------------------------------------------------------------------------------------------
# CSV (results, and resuming)


def capture_identity(cap: Capture) -> str:
    """A short fingerprint of a capture's content (its metadata, counts and every payload's hash),
    written in every CSV row so that a search resumes only from results of the same capture."""
    h = xxhash.xxh3_64()
    md = cap.metadata
    h.update(
        repr(
            (
                md.created_unix_ns,
                md.host,
                md.tool,
                md.gpu,
                md.command_line,
                cap.operation_count,
                cap.object_count,
                cap.payload_count,
            )
        ).encode()
    )
    for info in cap.payloads():
        h.update(info.hash)
    return h.hexdigest()


def read_csv(
    path: Path, targets: Targets | None = None, capture: str = ""
) -> dict[tuple[str, str, str, str], CandidateResult]:
    """The results already in ``path``. With ``targets`` (and ``capture``, a
    :func:`capture_identity`), every row must be of this kernel, these operations and this
    capture: resuming from another search's CSV would rank its timings as this one's."""
    if not path.exists():
        return {}
    done = {}
    operations = " ".join(map(str, targets.operations)) if targets is not None else ""
    try:
        with path.open(newline="") as f:
            for line, row in enumerate(csv.DictReader(f), start=2):
                if targets is not None and (row["kernel"], row["operations"]) != (targets.kernel, operations):
                    raise ReplayUsageError(
                        f"--csv {path}: line {line} is for kernel {row['kernel']} (operations {row['operations']}), "
                        f"not this search's {targets.kernel} (operations {operations}); choose another --csv file"
                    )
                if capture and row.get("capture") and row["capture"] != capture:
                    raise ReplayUsageError(
                        f"--csv {path}: line {line} was measured on another capture ({row['capture']}, this one is "
                        f"{capture}); choose another --csv file"
                    )
                c = Candidate(
                    _parse_dims(row["grid"]),
                    _parse_dims(row["block"]),
                    int(row["smem"]) if row["smem"] else None,
                    int(row["max_registers"]) if row["max_registers"] else None,
                )
                done[c.key()] = CandidateResult(
                    c,
                    float(row["median_ms"]) if row["median_ms"] else None,
                    float(row["stddev_ms"]) if row["stddev_ms"] else None,
                    {"yes": True, "no": False}.get(row["verified"]),
                    row["error"],
                    row.get("baseline") == "yes",
                )
    except (KeyError, ValueError, csv.Error) as exc:
        raise ReplayUsageError(
            f"--csv {path}: not a tune-replay CSV ({exc}); choose another file to start anew"
        ) from None
    return done


def _parse_dims(text: str) -> m.Dims | None:
    if not text:
        return None
    x, y, z = (int(v) for v in text.split(","))
    return (x, y, z)


def check_output_writable(path: Path, flag: str) -> None:
    """Fail before any work when ``path`` could not be written (missing or read-only directory)."""
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        what = "is not a directory" if parent.exists() else "does not exist"
        raise ReplayUsageError(f"{flag} {path}: {parent} {what}")
    target = path if path.exists() else parent
    if not os.access(target, os.W_OK):
        raise ReplayUsageError(f"{flag} {path}: {'the file' if path.exists() else 'the directory'} is not writable")


class CsvLog:
    """Appends one row per result, flushed at once (an interrupted search loses nothing). The file
    is created with the first result, so a search that never ran leaves no header-only CSV."""

    def __init__(self, path: Path | None, targets: Targets, capture: str = "") -> None:
        self.targets = targets
        self.path = path
        self.capture = capture
        self.file: Any = None
        if path is not None:
            check_output_writable(path, "--csv")

    def _open(self, path: Path) -> None:
        new = not path.exists() or path.stat().st_size == 0
        try:
            self.file = path.open("a", newline="")
        except OSError as exc:
            raise ReplayUsageError(f"--csv {path}: cannot write ({exc.strerror})") from None
        self.writer = csv.writer(self.file)
        if new:
            self.writer.writerow(CSV_FIELDS)

    def write(self, r: CandidateResult) -> None:
        if self.path is None:
            return
        if self.file is None:
            self._open(self.path)
        verified = {True: "yes", False: "no", None: ""}[r.verified]
        self.writer.writerow(
            [
                self.targets.kernel,
                " ".join(map(str, self.targets.operations)),
                *r.candidate.key(),
                "" if r.median_ms is None else f"{r.median_ms:.6f}",
                "" if r.stddev_ms is None else f"{r.stddev_ms:.6f}",
                verified,
                r.error,
                "yes" if r.baseline else "",
                self.capture,
            ]
        )
        self.file.flush()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


# ------------------------------------------------------------------------------------------
# The worker process


@dataclass(frozen=True)
class WorkerConfig:
    capture: str
    operations: tuple[int, ...]
    plan: dict[str, Any]  # PlanOptions.to_dict(): what the worker plans with (PlanOptions.from_dict)
    device: int = 0
    warmup: int = 2
    repetitions: int = 10
    rtol: float | None = None
    atol: float | None = None
    tolerance: bool = False
    nodes: tuple[tuple[int, int], ...] = ()  # (graph, node): kernel nodes tuned with the launches
    limits: dict[str, int] = field(default_factory=dict)  # the reader's caps that differ from the defaults


class Worker:
    """A ``python -m replayfmt.measure.tune_worker`` process evaluating candidates, one JSON line each."""

    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.process: subprocess.Popen | None = None
        self.restarts = 0

    def _start(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "replayfmt.measure.tune_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            bufsize=1,
        )
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(asdict(self.config)) + "\n")
        reply = self._read(120.0)
        if reply is None or "ready" not in reply:
            self.stop()
            why = f"the worker did not start: {reply.get('error') if reply else 'no reply'}"
            raise (DeviceUnavailableError if reply and reply.get("unavailable") else ReplayError)(why)

    def _read(self, timeout: float) -> dict[str, Any] | None:
        assert self.process is not None and self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        if not ready:
            return None
        line = self.process.stdout.readline()
        return json.loads(line) if line else None

    def evaluate(self, candidate: Candidate, timeout: float) -> CandidateResult:
        if self.process is None or self.process.poll() is not None:
            self._start()
        assert self.process is not None and self.process.stdin is not None
        try:
            self.process.stdin.write(json.dumps(candidate_request(candidate)) + "\n")
        except BrokenPipeError:
            self.stop()
            return CandidateResult(candidate, error="the worker died")
        reply = self._read(timeout)
        if reply is None:
            self.stop()
            died = self.process is not None and self.process.poll() is not None
            return CandidateResult(candidate, error="the worker crashed" if died else f"timed out after {timeout:g} s")
        if reply.get("fatal"):
            self.stop()  # the CUDA context is unusable: the next candidate gets a fresh worker
        return CandidateResult(
            candidate, reply.get("median_ms"), reply.get("stddev_ms"), reply.get("verified"), reply.get("error", "")
        )

    def stop(self) -> None:
        if self.process is not None:
            if self.process.poll() is None:
                self.process.kill()
            self.process.wait()
            self.process = None
            self.restarts += 1

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            assert self.process.stdin is not None
            try:
                self.process.stdin.close()
                self.process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
        self.process = None


def order(points: list[Candidate], strategy: str, budget: int | None, seed: int = 0) -> list[Candidate]:
    if strategy == "random":
        points = random.Random(seed).sample(points, len(points))
    elif strategy != "grid":
        raise ReplayUsageError(f"--strategy {strategy!r}: expected grid or random")
    return points[:budget] if budget is not None else points


def search(
    worker: Worker,
    points: list[Candidate],
    *,
    done: dict[tuple[str, str, str, str], CandidateResult],
    log: CsvLog,
    timeout: float,
    progress: Callable[[int, int], None] | None = None,
) -> Iterator[CandidateResult]:
    """Evaluate the captured shape first (the baseline), then every point not already done."""
    baseline = Candidate()
    todo = [p for p in [baseline, *points] if p.key() not in done]
    for k, candidate in enumerate(todo):
        result = worker.evaluate(candidate, timeout)
        result.baseline = candidate == baseline
        log.write(result)
        if progress is not None:
            progress(k + 1, len(todo))
        yield result


def candidate_request(candidate: Candidate) -> dict[str, Any]:
    """What a worker is told of a candidate (one JSON line for the worker process): the shape
    change every target gets (the same ShapeOverride run-replay --launch applies), and the cap."""
    return {"reshape": candidate.reshape.to_dict(), "max_registers": candidate.max_registers}


def fan_out_search(
    fanout: FanOut,
    config: WorkerConfig,
    points: list[Candidate],
    *,
    done: dict[tuple[str, str, str, str], CandidateResult],
    log: CsvLog,
    timeout: float,
    progress: Callable[[int, int], None] | None = None,
    evaluate: Callable[[dict[str, Any], dict[str, Any]], Any] | None = None,
) -> Iterator[CandidateResult]:
    """:func:`search` over a fan-out's workers (one per GPU, each with its own prepared replay),
    results in the order they complete. A candidate whose worker died, timed out or was
    poisoned by a sticky CUDA error is recorded with that error; its worker is replaced.
    ``evaluate(config, request)`` runs in the workers (default: the tune worker's, on a GPU)."""
    from replayfmt.measure.fanout import Task
    from replayfmt.measure.tune_worker import evaluate_candidate

    baseline = Candidate()
    todo = [p for p in [baseline, *points] if p.key() not in done]
    settings = asdict(config)
    tasks = [Task(c, evaluate or evaluate_candidate, (settings, candidate_request(c))) for c in todo]
    for k, outcome in enumerate(fanout.run(tasks, timeout=timeout)):
        candidate = outcome.key
        reply = outcome.value or {}
        if reply.get("unavailable"):
            raise DeviceUnavailableError(f"worker {outcome.worker}: {reply.get('error')}")
        error = outcome.error or reply.get("error", "")
        result = CandidateResult(
            candidate, reply.get("median_ms"), reply.get("stddev_ms"), reply.get("verified"), error
        )
        result.baseline = candidate == baseline
        log.write(result)
        if progress is not None:
            progress(k + 1, len(todo))
        yield result


def override_flags(targets: Targets, c: Candidate) -> str:
    """The winning shape as run-replay flags, one --launch per tuned launch ("" when only graph
    nodes were tuned: see :func:`graph_node_shapes`)."""
    grid, block = c.grid or targets.grid, c.block or targets.block
    smem = targets.smem if c.smem is None else c.smem
    shape = f"grid={_dims(grid)},block={_dims(block)},smem={smem}"
    flags = " ".join(f"--launch={op}:{shape}" for op in targets.operations if op not in targets.graph_launches)
    if flags and c.max_registers is not None:
        flags += f"  (and re-JIT executable {targets.executable} with at most {c.max_registers} registers)"
    return flags


def graph_node_shapes(targets: Targets, c: Candidate) -> str:
    """The winning shape of the tuned kernel nodes of CUDA graphs ("" when none were tuned)."""
    if not targets.nodes:
        return ""
    grid, block = c.grid or targets.grid, c.block or targets.block
    smem = targets.smem if c.smem is None else c.smem
    where = ", ".join(f"graph {g} node {n}" for g, n in targets.nodes)
    return f"{where}: grid={_dims(grid)},block={_dims(block)},smem={smem} (run-replay has no flag for graph nodes yet)"
