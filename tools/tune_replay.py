"""tune-replay: search launch shapes on a replayed kernel, every candidate verified, failures isolated."""

from __future__ import annotations

from pathlib import Path

import click

from replayfmt.cuda.address_space import restart_without_aslr
from replayfmt.format.layout import Limits
from replayfmt.measure.tune import SearchSpace, parse_dims_list, parse_int_list
from replayfmt.verbs import TuneOptions, TuneResult, tune
from replayfmt_tools.common import EXIT_OK, EXIT_PROBLEM, ToolExit, agents_md_option, reports_errors
from replayfmt_tools.options import (
    FiniteFloatRange,
    cluster_options,
    limit_option,
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
@limit_option
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
    limits: Limits,
) -> int:
    """Search grid, block and shared-memory sizes for a replayed kernel; print the best ones and
    the winning shape as ready run-replay flags."""
    space = SearchSpace(
        parse_dims_list(grids, "--grid"),
        parse_dims_list(blocks, "--block"),
        parse_int_list(smems, "--smem"),
        parse_int_list(registers, "--max-registers"),
    )
    options = TuneOptions(
        space=space,
        launch=launch_op,
        kernel=kernel,
        plan=plan_options(substitutions=substitutions, remaps=remaps, fixed_addresses=fixed_addresses),
        strategy=strategy,
        budget=budget,
        warmup=warmup,
        repetitions=repetitions,
        timeout_s=timeout,
        tolerance=tolerance(use_tolerance=use_tolerance, rtol=rtol, atol=atol),
        csv=csv_path,
        plot=plot_path,
        devices=parse_devices(device_list),
        scheduler=scheduler,
        engine=engine,
        limits=limits,
    )
    if fixed_addresses:
        restart_without_aslr()  # recorded addresses are reachable only so (see address_space)
    result = tune(capture, options, progress=click.echo)
    _print_table(result, top)
    if plot_path is not None:
        click.echo(f"plot: {plot_path}")
    if not result.good:
        raise ToolExit(EXIT_PROBLEM, "no candidate ran and verified")
    _print_best(result)
    return EXIT_OK


def _print_table(result: TuneResult, top: int) -> None:
    """The fastest candidates, then the failed ones."""
    targets = result.targets
    click.echo(
        "\nclock: CUDA events around each launch of the targets (about 2-3 us above CUPTI's kernel time "
        "for small kernels; benchmark-replay --per-kernel reads CUPTI)"
    )
    click.echo(
        f"\n{'rank':>4}  {'grid':<14}{'block':<14}{'smem':>8}{'regs':>6}  {'median ms':>10}  {'stddev':>8}  verified"
    )
    for rank, r in enumerate(result.good[:top], 1):
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
    failed = result.failed
    if failed:
        click.echo(f"\n{len(failed)} candidate(s) failed:")
        for r in failed[:top]:
            click.echo(f"  {r.candidate.describe()}: {r.error or 'wrong result'}")
    if result.restarts:
        click.echo(f"(a worker was replaced {result.restarts} time(s) after faults or timeouts)")


def _print_best(result: TuneResult) -> None:
    """The winner against the captured shape, as run-replay flags."""
    best, baseline = result.good[0], result.baseline
    if baseline is not None and baseline.ok and baseline.median_ms:
        click.echo(
            f"\nbest: {best.median_ms:.4f} ms vs captured {baseline.median_ms:.4f} ms "
            f"({baseline.median_ms / best.median_ms:.2f}x)"
        )
    if result.best_flags:
        click.echo(f"run-replay {result.best_flags} --verify {result.capture}")
    if result.best_graph_shapes:
        click.echo(f"best for {result.best_graph_shapes}")


if __name__ == "__main__":
    main()
