"""The tune verb: search launch shapes for a replayed kernel, every candidate verified, failures
isolated (``tune-replay`` calls :func:`tune`).

The sequence: check the outputs can be written (before any work: a search must not fail at its
first result); open and plan the capture; find the launches to tune (one launch, or every launch
of one kernel, CUDA graph kernel nodes included); prune the points the function or the device
cannot run; order and cut them (strategy, budget); read what a CSV of an earlier search already
holds; evaluate the rest on one worker process (or one per GPU through the fan-out), the captured
shape among them; draw the plot. The table is the caller's to print.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from replayfmt.errors import ReplayUsageError
from replayfmt.execute import open_replay
from replayfmt.format import model as m
from replayfmt.format.layout import DEFAULT_LIMITS, Limits
from replayfmt.format.names import demangle
from replayfmt.measure.fanout import open_fanout
from replayfmt.measure.tune import (
    CandidateResult,
    CsvLog,
    SearchSpace,
    Targets,
    Worker,
    WorkerConfig,
    capture_identity,
    check_output_writable,
    compile_kernel_pattern,
    fan_out_search,
    find_targets,
    graph_node_shapes,
    order,
    override_flags,
    prune,
    read_csv,
    search,
)
from replayfmt.measure.tune_plot import check_plot_path, plot
from replayfmt.replay.compare import Tolerance
from replayfmt.replay.plan_options import PlanOptions

Progress = Callable[[str], None]


@dataclass(frozen=True)
class TuneOptions:
    """What :func:`tune` is asked; the defaults are ``tune-replay``'s. Exactly one of ``launch``
    (an operation index) and ``kernel`` (a regular expression) names what is tuned."""

    space: SearchSpace
    launch: int | None = None
    kernel: str | None = None
    plan: PlanOptions = field(default_factory=PlanOptions)  # substitutions, remaps, fixed addresses
    strategy: str = "grid"  # grid: in order; random: shuffled (seeded)
    budget: int | None = None  # evaluate at most this many candidates (after pruning)
    warmup: int = 2  # untimed runs per candidate
    repetitions: int = 10  # timed runs per candidate (the median is reported)
    timeout_s: float = 10.0  # per candidate; past it the worker is replaced
    tolerance: Tolerance = field(default_factory=Tolerance)  # how each candidate's checkpoints compare
    csv: Path | None = None  # every result appended here; a search resumed from it skips what it holds
    plot: Path | None = None  # draw the results (a new file)
    devices: tuple[int, ...] = (0,)  # several: one worker per GPU
    scheduler: str | None = None  # a Dask cluster's address (fan out there)
    engine: str | None = None  # the fan-out's engine: auto, dask, local
    limits: Limits = DEFAULT_LIMITS  # the reader's caps (--limit NAME=VALUE), the workers' too

    def __post_init__(self) -> None:
        space = self.space
        if not (space.grids or space.blocks or space.smems or space.max_registers):
            raise ReplayUsageError("give a search space: --grid, --block, --smem and/or --max-registers")
        if not self.devices:
            raise ReplayUsageError("give at least one device to tune on")

    @property
    def fanning(self) -> bool:
        """Whether the candidates go to a fan-out of workers (several GPUs, or a cluster)."""
        return len(self.devices) > 1 or self.scheduler is not None or self.engine is not None


@dataclass(frozen=True)
class TuneResult:
    """Every candidate's result (the captured shape's marked ``baseline``), in the order they came."""

    capture: str
    targets: Targets
    results: tuple[CandidateResult, ...]
    restarts: int = 0  # workers replaced after faults or timeouts

    @property
    def good(self) -> list[CandidateResult]:
        """The candidates that ran (and verified where the capture can say), fastest first."""
        return sorted((r for r in self.results if r.ok), key=lambda r: r.median_ms or 0.0)

    @property
    def failed(self) -> list[CandidateResult]:
        return [r for r in self.results if not r.ok]

    @property
    def baseline(self) -> CandidateResult | None:
        return next((r for r in self.results if r.baseline), None)

    @property
    def best_flags(self) -> str:
        """The winning shape as run-replay --launch flags ("" when none ran, or only graph nodes were tuned)."""
        good = self.good
        return override_flags(self.targets, good[0].candidate) if good else ""

    @property
    def best_graph_shapes(self) -> str:
        """The winning shape of the tuned CUDA graph kernel nodes ("" when none)."""
        good = self.good
        return graph_node_shapes(self.targets, good[0].candidate) if good and self.targets.nodes else ""


def _check_outputs(options: TuneOptions) -> None:
    if options.plot is not None:
        if options.plot.exists():
            raise ReplayUsageError(f"--plot: {options.plot} already exists; choose another file")
        check_output_writable(options.plot, "--plot")
        check_plot_path(options.plot)
    if options.csv is not None:
        check_output_writable(options.csv, "--csv")
    if options.kernel is not None:
        compile_kernel_pattern(options.kernel)


def tune(path: str | os.PathLike[str], options: TuneOptions, *, progress: Progress | None = None) -> TuneResult:
    """Search ``options.space`` for the launches ``options`` name in the capture at ``path``.
    ``progress`` receives what is tuned, the space, the pruned points and the workers. Raises
    ReplayUsageError when nothing can be evaluated (every point pruned, no target)."""
    say = progress or (lambda _line: None)
    _check_outputs(options)
    capture = os.fspath(path)
    space = options.space
    with open_replay(path, options.plan, limits=options.limits) as session:
        plan = session.plan
        targets = find_targets(plan, launch=options.launch, kernel=options.kernel)
        identity = capture_identity(session.capture)
        image_format = plan.images[targets.executable].format
        if space.max_registers and targets.nodes:
            raise ReplayUsageError("--max-registers: re-JITted functions do not reach CUDA graph kernel nodes yet")
        if space.max_registers and image_format != m.ExecutableFormat.PTX:
            held = image_format.name.lower()
            raise ReplayUsageError(
                f"--max-registers: executable {targets.executable} is held as {held}; only PTX can be re-JITted"
            )
    valid, pruned = prune(plan, targets, space.points())
    if not valid:  # before any worker starts: there is nothing for one to do
        shown = "; ".join(f"{candidate.describe()}: {reason}" for candidate, reason in pruned[:3])
        more = f" (and {len(pruned) - 3} more)" if len(pruned) > 3 else ""
        raise ReplayUsageError(
            f"every point of the search space is pruned ({len(pruned)}), none to evaluate: {shown}{more}; "
            "give --grid, --block or --smem values within the limits"
        )
    points = order(valid, options.strategy, options.budget)
    done = read_csv(options.csv, targets, identity) if options.csv is not None else {}
    nodes = f"; {', '.join(f'graph {g} node {n}' for g, n in targets.nodes)} in graph launches" if targets.nodes else ""
    say(
        f"tuning {demangle(targets.kernel)} (operations {', '.join(map(str, targets.operations))}), captured "
        f"grid={targets.grid} block={targets.block} smem={targets.smem}{nodes}"
    )
    resumed = f", {sum(1 for p in points if p.key() in done)} already in {options.csv}" if done else ""
    say(f"space: {len(valid) + len(pruned)} points, {len(pruned)} pruned, {len(points)} to evaluate{resumed}")
    for candidate, reason in pruned[:20]:
        say(f"  pruned {candidate.describe()}: {reason}")
    config = worker_config(capture, targets, options)
    log = CsvLog(options.csv, targets, identity)
    results = list(done.values())
    if options.fanning:  # one worker per GPU (or per worker of the cluster at --scheduler), each pinned to its GPU
        with open_fanout(list(options.devices), engine=options.engine or "auto", scheduler=options.scheduler) as fan:
            say(f"workers: {fan.describe()}")
            try:
                results += fan_out_search(fan, config, points, done=done, log=log, timeout=options.timeout_s)
            finally:
                log.close()
            restarts = fan.replaced
    else:
        worker = Worker(config)
        try:
            results += search(worker, points, done=done, log=log, timeout=options.timeout_s)
        finally:
            worker.close()
            log.close()
        restarts = worker.restarts
    if options.plot is not None:
        plot(results, targets, options.plot)
    return TuneResult(capture, targets, tuple(results), restarts)


def worker_config(capture: str, targets: Targets, options: TuneOptions) -> WorkerConfig:
    """What each worker prepares: the capture, planned as ``options.plan`` says, on its device."""
    plan = options.plan
    return WorkerConfig(
        capture=capture,
        operations=targets.operations,
        nodes=targets.nodes,
        plan=plan.to_dict(),
        device=0 if options.fanning else options.devices[0],  # a fanned-out worker sees only its GPU, as 0
        warmup=options.warmup,
        repetitions=options.repetitions,
        rtol=options.tolerance.rtol,
        atol=options.tolerance.atol,
        tolerance=options.tolerance.enabled,
        limits=options.limits.changes(),
    )
