"""tune-replay: search launch shapes on a replayed kernel, every candidate verified, failures isolated."""

from __future__ import annotations

from pathlib import Path

import click

from replayfmt.cuda.address_space import restart_without_aslr
from replayfmt.errors import ReplayUsageError
from replayfmt.execute import open_replay
from replayfmt.format import model as m
from replayfmt.format.names import demangle
from replayfmt.measure.fanout import open_fanout
from replayfmt.measure.tune import (
    CsvLog,
    SearchSpace,
    Worker,
    WorkerConfig,
    capture_identity,
    check_writable,
    compile_kernel_pattern,
    fan_out_search,
    find_targets,
    graph_node_shapes,
    order,
    override_flags,
    parse_dims_list,
    parse_int_list,
    prune,
    read_csv,
    search,
)
from replayfmt.measure.tune_plot import check_plot_path, plot
from replayfmt_tools.common import EXIT_OK, EXIT_PROBLEM, ToolExit, agents_md_option, reports_errors
from replayfmt_tools.options import (
    FiniteFloatRange,
    cluster_options,
    parse_devices,
    plan_options,
    source_options,
    tolerance,
    tolerance_options,
)

EPILOG = """\b
Every candidate runs in a worker process from the capture's starting state, is verified against
the capture's checkpoints (a shape that computes a wrong answer is rejected, not just timed), then
timed with CUDA events. A candidate that faults or hangs is recorded and the worker replaced; the
search goes on. Results stream into --csv, so a search resumes where it stopped. With several
--device flags (or --scheduler, or --engine dask/local) the candidates are spread over one worker
per GPU: on Dask distributed when installed (pip install 'replayfmt[cluster]'), else on local
processes; a worker that breaks its CUDA context is replaced and the sweep goes on.

\b
Examples:
  tune-replay --launch=42 --block "64;128;256;512;1024" --grid "132;264;528" cap.kreplay
  tune-replay --kernel='^gemm' --block 128 --block 256 --smem "0;65536" --csv=tune.csv --plot=tune.png cap.kreplay
  tune-replay --launch=42 --block "32;64;128;256;512" --grid "1;2;4;8;16;32;64;128" \\
      --strategy=random --budget=20 cap.kreplay
  tune-replay --kernel='^gemm' --block "64;128;256" --device cuda:0 --device cuda:1 cap.kreplay
  tune-replay --kernel='^gemm' --block "64;128;256" --scheduler tcp://head:8786 cap.kreplay
"""


@click.command(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("capture", type=click.Path(path_type=Path))
@click.option("--launch", "launch_op", type=int, metavar="OP", help="Tune this launch operation.")
@click.option(
    "--kernel", metavar="REGEX", help="Tune every launch of the kernel whose name (raw or demangled) matches, together."
)
@click.option("--grid", "grids", multiple=True, metavar="LIST", help="Grids to try: X or X,Y,Z, ';'-separated.")
@click.option("--block", "blocks", multiple=True, metavar="LIST", help="Blocks to try: X or X,Y,Z, ';'-separated.")
@click.option("--smem", "smems", multiple=True, metavar="LIST", help="Dynamic shared memory sizes (bytes) to try.")
@click.option(
    "--max-registers",
    "registers",
    multiple=True,
    metavar="LIST",
    help="Register caps to try by re-JITting the PTX (the capture must hold the executable as PTX).",
)
@click.option(
    "--strategy",
    type=click.Choice(["grid", "random"]),
    default="grid",
    show_default=True,
    help="grid: every point in order; random: a shuffled order (with --budget, a random sample).",
)
@click.option("--budget", type=click.IntRange(min=1), help="Evaluate at most N candidates (after pruning).")
@click.option(
    "--warmup",
    type=click.IntRange(min=0),
    default=2,
    show_default=True,
    help="Untimed runs of each candidate before timing.",
)
@click.option(
    "--repetitions",
    type=click.IntRange(min=1),
    default=10,
    show_default=True,
    help="Timed runs of each candidate (the median is reported).",
)
@click.option(
    "--timeout",
    type=FiniteFloatRange(min=0.1),
    default=10.0,
    show_default=True,
    metavar="SECONDS",
    help="Give up on a candidate (and replace the worker) after this long.",
)
@tolerance_options
@click.option(
    "--csv",
    "csv_path",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="Append every result here; an existing file is resumed (done candidates are skipped).",
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE.png",
    help="Draw the results: a line chart when one axis is swept, a heatmap over two (e.g. grid x block); "
    "the captured shape marked, failures shown.",
)
@click.option("--top", type=click.IntRange(min=1), default=10, show_default=True, help="Rows in the table.")
@click.option(
    "--device",
    "device_list",
    multiple=True,
    metavar="cuda:N",
    help="A device to tune on (default cuda:0); several (--device cuda:0 --device cuda:1) spread the candidates "
    "over one worker per GPU.",
)
@cluster_options
@source_options
@agents_md_option("tune-replay")
@reports_errors("tune-replay")
def main(
    capture: Path,
    launch_op: int | None,
    kernel: str | None,
    grids: tuple[str, ...],
    blocks: tuple[str, ...],
    smems: tuple[str, ...],
    registers: tuple[str, ...],
    strategy: str,
    budget: int | None,
    warmup: int,
    repetitions: int,
    timeout: float,
    use_tolerance: bool,
    rtol: float | None,
    atol: float | None,
    csv_path: Path | None,
    plot_path: Path | None,
    top: int,
    device_list: tuple[str, ...],
    scheduler: str | None,
    engine: str | None,
    substitutions: tuple[str, ...],
    remaps: tuple[str, ...],
    fixed_addresses: bool,
) -> int:
    """Search grid, block and shared-memory sizes for a replayed kernel; print the best ones and
    the winning shape as ready run-replay flags."""
    space = SearchSpace(
        parse_dims_list(grids, "--grid"),
        parse_dims_list(blocks, "--block"),
        parse_int_list(smems, "--smem"),
        parse_int_list(registers, "--max-registers"),
    )
    if not (space.grids or space.blocks or space.smems or space.max_registers):
        raise ReplayUsageError("give a search space: --grid, --block, --smem and/or --max-registers")
    if plot_path is not None and plot_path.exists():
        raise ReplayUsageError(f"--plot: {plot_path} already exists; choose another file")
    if plot_path is not None:
        check_writable(plot_path, "--plot")
        check_plot_path(plot_path)
    if csv_path is not None:
        check_writable(csv_path, "--csv")  # before any work: a search must not fail at its first result
    if kernel is not None:
        compile_kernel_pattern(kernel)
    gpus = list(parse_devices(device_list))
    fanning = len(gpus) > 1 or scheduler is not None or engine is not None
    if fixed_addresses:
        restart_without_aslr()  # recorded addresses are reachable only so (see address_space)
    options = plan_options(substitutions=substitutions, remaps=remaps, fixed_addresses=fixed_addresses)
    comparison = tolerance(use_tolerance=use_tolerance, rtol=rtol, atol=atol)
    with open_replay(capture, options) as session:
        plan = session.plan
        targets = find_targets(plan, launch=launch_op, kernel=kernel)
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
    points = order(valid, strategy, budget)
    done = read_csv(csv_path, targets, identity) if csv_path is not None else {}
    click.echo(
        f"tuning {demangle(targets.kernel)} (operations {', '.join(map(str, targets.operations))}), captured "
        f"grid={targets.grid} block={targets.block} smem={targets.smem}"
        + (f"; {', '.join(f'graph {g} node {n}' for g, n in targets.nodes)} in graph launches" if targets.nodes else "")
    )
    click.echo(
        f"space: {len(valid) + len(pruned)} points, {len(pruned)} pruned, {len(points)} to evaluate"
        + (f", {sum(1 for p in points if p.key() in done)} already in {csv_path}" if done else "")
    )
    for candidate, reason in pruned[:20]:
        click.echo(f"  pruned {candidate.describe()}: {reason}")
    config = WorkerConfig(
        capture=str(capture),
        operations=targets.operations,
        nodes=targets.nodes,
        plan={"substitutions": list(substitutions), "remaps": list(remaps), "fixed_addresses": fixed_addresses},
        device=0 if fanning else gpus[0],  # a fanned-out worker sees only its own GPU, as device 0
        warmup=warmup,
        repetitions=repetitions,
        rtol=comparison.rtol,
        atol=comparison.atol,
        tolerance=comparison.enabled,
    )
    log = CsvLog(csv_path, targets, identity)
    results = list(done.values())
    if fanning:  # one worker per GPU (or per worker of the cluster at --scheduler), each pinned to its GPU
        with open_fanout(gpus, engine=engine or "auto", scheduler=scheduler) as fanout:
            click.echo(f"workers: {fanout.describe()}")
            try:
                results += fan_out_search(fanout, config, points, done=done, log=log, timeout=timeout)
            finally:
                log.close()
            restarts = fanout.replaced
    else:
        worker = Worker(config)
        try:
            for result in search(worker, points, done=done, log=log, timeout=timeout):
                results.append(result)
        finally:
            worker.close()
            log.close()
        restarts = worker.restarts
    good = sorted((r for r in results if r.ok), key=lambda r: r.median_ms or 0.0)
    failed = [r for r in results if not r.ok]
    baseline = next((r for r in results if r.baseline), None)
    click.echo(
        "\nclock: CUDA events around each launch of the targets (about 2-3 us above CUPTI's kernel time "
        "for small kernels; benchmark-replay --per-kernel reads CUPTI)"
    )
    click.echo(
        f"\n{'rank':>4}  {'grid':<14}{'block':<14}{'smem':>8}{'regs':>6}  {'median ms':>10}  {'stddev':>8}  verified"
    )
    for rank, r in enumerate(good[:top], 1):
        c = r.candidate
        grid, block = c.grid or targets.grid, c.block or targets.block
        smem = targets.smem if c.smem is None else c.smem
        mark = "  (captured)" if r.baseline else ""
        verified = {True: "yes", None: "n/a"}[r.verified]
        regs = "" if c.max_registers is None else str(c.max_registers)
        click.echo(
            f"{rank:>4}  {','.join(map(str, grid)):<14}{','.join(map(str, block)):<14}{smem:>8}{regs:>6}  "
            f"{r.median_ms:>10.4f}  {r.stddev_ms or 0:>8.4f}  {verified}{mark}"
        )
    if failed:
        click.echo(f"\n{len(failed)} candidate(s) failed:")
        for r in failed[:top]:
            click.echo(f"  {r.candidate.describe()}: {r.error or 'wrong result'}")
    if restarts:
        click.echo(f"(a worker was replaced {restarts} time(s) after faults or timeouts)")
    if plot_path is not None:
        plot(results, targets, plot_path)
        click.echo(f"plot: {plot_path}")
    if not good:
        raise ToolExit(EXIT_PROBLEM, "no candidate ran and verified")
    best = good[0]
    if baseline is not None and baseline.ok and baseline.median_ms:
        click.echo(
            f"\nbest: {best.median_ms:.4f} ms vs captured {baseline.median_ms:.4f} ms "
            f"({baseline.median_ms / best.median_ms:.2f}x)"
        )
    flags = override_flags(targets, best.candidate)
    if flags:
        click.echo(f"run-replay {flags} --verify {capture}")
    if targets.nodes:
        click.echo(f"best for {graph_node_shapes(targets, best.candidate)}")
    return EXIT_OK


if __name__ == "__main__":
    main()
