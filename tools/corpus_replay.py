"""corpus-replay: replay (or plan) every capture of a directory on one worker per GPU; one table and CSV."""

from __future__ import annotations

from pathlib import Path

import click

from replayfmt.format.layout import Limits
from replayfmt.measure.corpus import CorpusRow
from replayfmt.verbs import CorpusOptions, CorpusResult, corpus
from replayfmt_tools.common import EXIT_OK, EXIT_PROBLEM, EXIT_USAGE, ToolExit, agents_md_option, reports_errors
from replayfmt_tools.options import FiniteFloatRange, cluster_options, limit_option, parse_devices

EPILOG = """\b
Each capture is one task on a worker pinned to one GPU (--device, several times; or the workers
of the Dask cluster at --scheduler): opened, planned, set up, replayed once verifying every
checkpoint, then timed (--repetitions runs, the median device time). On Dask distributed when it
is installed (pip install 'replayfmt[cluster]'), else on local processes. A capture that breaks
its CUDA context, crashes or hangs its worker (--timeout) loses that worker, which is replaced;
the row says so and the run goes on. --dry-run plans every capture without a GPU (every payload
the replay reads is read and checked against its hashes: a damaged capture fails, named), each
file alone.

\b
Rows that need several GPUs run after the others, one at a time, on the first --device GPUs:
a job's ranks (NAME.rank0.kreplay, NAME.rank1.kreplay, ... as torchrun's ranks write them, the
group complete: as many as their recorded world size) make one row, NAME.rank*.kreplay, replayed
together with their collectives through NCCL, a process and a GPU per rank (its device time is
the slowest rank's, its ranges every rank's); a capture of a process that drove D devices runs
on a worker pinned to D GPUs. With fewer --device than a row needs, or with --scheduler (they
run on local processes only), the row is unavailable and says why. An incomplete group's files
replay alone, each call's received bytes put in place.

\b
--compare-to takes a directory of the same captures (run too, its rows made alike) or the --csv of
an earlier run (read, like --csv's directory, before any capture runs: a file that is not such a
CSV is refused); a regression is a verdict worse than the baseline's, a capture missing, or a
device time over --threshold times the baseline's.

\b
Exit status: 0 every capture verified (or replayed, or planned) and no regression; 1 a capture
failed, mismatched or regressed; 2 usage error (no captures, bad --compare-to), or no row could
run here (no GPU, or fewer --device than each needs).

\b
Examples:
  corpus-replay --dry-run captures/
  corpus-replay --device cuda:0 --device cuda:1 --csv today.csv captures/
  corpus-replay --compare-to yesterday.csv --threshold 1.05 captures/
  corpus-replay --scheduler tcp://head:8786 --compare-to baseline_captures/ captures/
"""

NOWHERE_TO_RUN = (
    "nothing could run here: every row is unavailable (no GPU, or fewer --device than it needs; "
    "--dry-run plans without one)"
)


@click.command(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("directory", type=click.Path(path_type=Path))
@click.option(
    "--dry-run",
    is_flag=True,
    help="Plan every capture (every check that needs no GPU), each file alone (ranks too); run nothing.",
)
@click.option(
    "--repetitions",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Timed runs of each capture after the verified one (the median is reported).",
)
@click.option(
    "--device",
    "device_list",
    multiple=True,
    metavar="cuda:N",
    help="A GPU to run on, one worker each (default cuda:0); give it several times.",
)
@cluster_options
@click.option(
    "--timeout",
    type=FiniteFloatRange(min=0.1),
    default=600.0,
    show_default=True,
    metavar="SECONDS",
    help="Give up on a capture (and replace its worker), or a job (stopping its ranks), after this long.",
)
@click.option(
    "--csv", "csv_path", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE", help="Write the rows here."
)
@click.option(
    "--compare-to",
    "baseline",
    type=click.Path(path_type=Path),
    metavar="DIR|CSV",
    help="The baseline: a directory of the same captures (run as well) or an earlier run's --csv.",
)
@click.option(
    "--threshold",
    type=FiniteFloatRange(min=1.0),
    default=1.05,
    show_default=True,
    help="With --compare-to: a device time over this many times the baseline's is a regression.",
)
@limit_option
@agents_md_option("corpus-replay")
@reports_errors("corpus-replay")
def main(
    directory: Path,
    dry_run: bool,
    repetitions: int,
    device_list: tuple[str, ...],
    scheduler: str | None,
    engine: str | None,
    timeout: float,
    csv_path: Path | None,
    baseline: Path | None,
    threshold: float,
    limits: Limits,
) -> int:
    """Replay every capture of DIRECTORY (or plan it, with --dry-run) on one worker per GPU and
    print one table: verdict, operations, device time, host time; optionally compared with a baseline."""
    options = CorpusOptions(
        dry_run=dry_run,
        repetitions=repetitions,
        devices=parse_devices(device_list),
        scheduler=scheduler,
        engine=engine,
        timeout_s=timeout,
        csv=csv_path,
        baseline=baseline,
        threshold=threshold,
        limits=limits,
    )
    result = corpus(directory, options, progress=click.echo)
    _print_rows(list(result.rows))
    if csv_path is not None:
        click.echo(f"csv: {csv_path}")
    if result.replaced:
        click.echo(
            f"(a worker was replaced {result.replaced} time(s): a capture broke its CUDA context, crashed or hung)"
        )
    if result.comparisons is not None:
        _print_comparisons(result)
    regressions = f"; {len(result.regressions)} regression(s)" if result.comparisons is not None else ""
    click.echo("\n" + ", ".join(f"{n} {v}" for v, n in result.counts.items()) + regressions)
    if result.nowhere_to_run:
        raise ToolExit(EXIT_USAGE, NOWHERE_TO_RUN)
    return EXIT_PROBLEM if result.failed or result.regressions else EXIT_OK


def _print_comparisons(result: CorpusResult) -> None:
    click.echo(f"\n{'capture':<32} {'baseline ms':>12} {'now ms':>10} {'ratio':>7}  regression")
    for c in result.comparisons or ():
        base = "" if c.baseline is None or c.baseline.device_ms is None else f"{c.baseline.device_ms:.4f}"
        now = "" if c.row is None or c.row.device_ms is None else f"{c.row.device_ms:.4f}"
        ratio = "" if c.ratio is None else f"{c.ratio:.3f}"
        click.echo(f"{c.capture:<32} {base:>12} {now:>10} {ratio:>7}  {c.regression}")


def _print_rows(rows: list[CorpusRow]) -> None:
    click.echo(
        f"\n{'capture':<32} {'verdict':<11} {'operations':>10} {'ranges':>6} {'device ms':>10} {'host s':>7}  worker"
    )
    for r in rows:
        device = "" if r.device_ms is None else f"{r.device_ms:.4f}"
        host = "" if r.host_s is None else f"{r.host_s:.2f}"
        click.echo(
            f"{r.capture:<32} {r.verdict:<11} {r.operations:>10} {r.ranges:>6} {device:>10} {host:>7}  {r.worker}"
        )
        if r.error:
            click.echo(f"    {r.error}")


if __name__ == "__main__":
    main()
