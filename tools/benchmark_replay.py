"""benchmark-replay: time replayed work, by scope, from the same starting state every time."""

from __future__ import annotations

import csv
import io
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import click

from replayfmt.cuda.address_space import restart_without_aslr
from replayfmt.errors import ReplayUsageError
from replayfmt.format.layout import Limits
from replayfmt.format.names import demangle
from replayfmt.measure import kernel_times as kt
from replayfmt.measure.benchmark import BenchmarkOptions, BenchmarkResult
from replayfmt.verbs import BenchmarkReplayOptions, benchmark
from replayfmt.verbs.ranks import RankBenchmark, benchmark_ranks
from replayfmt_tools.common import EXIT_OK, EXIT_PROBLEM, agents_md_option, check_new_file, reports_errors
from replayfmt_tools.options import FiniteFloatRange, limit_option, parse_devices, plan_options, replay_options

EPILOG = """\b
Setup (allocations, module loads, uploads, the operations before the scope, the captured
starting state) happens once, outside the timed region; starting state is never timed, also when
the region is the whole capture or spans several captured scopes (each one's state is set every
iteration, outside the timing). Before every iteration the buffers the region touches are restored from
pristine device copies (and, with --flush-l2, the L2 cache is flushed), outside the timed region.
Device time comes from CUDA events around the region, joined across every captured stream.
Per-operation times and the region's GPU busy time (the union of its kernels' and copies'
execution intervals) come from CUPTI activity records, the clock Nsight Systems and torch.profiler
show, with nothing inserted between kernels; without CUPTI they come from CUDA events around each
operation (a note says so). A capture recorded with the original program's device times prints
its GPU busy time beside the replay's, with the ratio (not its elapsed time: under the recorder
that includes the recorder's own work). Kernels that wait for a host write into pinned memory
(XLA's autotuner DelayKernel) are not run, and neither side's time holds them: "host waits" says
how many.

\b
Examples:
  benchmark-replay --scope=decode cap.kreplay
  benchmark-replay --scope=decode --mode=graph --per-kernel --format=json --output=base.json cap.kreplay
  benchmark-replay --scope=decode --executable-substitution=5=new.cubin --compare-to=base.json cap.kreplay
  benchmark-replay --trace=iteration.json --per-kernel cap.kreplay
"""


def _text(result: BenchmarkResult) -> list[str]:
    where = f"scope '{result.scope}'" if result.scope else "the whole capture"
    lines = [
        f"{where}: operations {result.operations[0]}-{result.operations[1] - 1}, {result.mode} mode, "
        f"{result.iterations} iterations after {result.warmup} warm-up{', L2 flushed' if result.flush_l2 else ''}",
        f"device        {result.device}",
    ]
    for name, s in (("device ms", result.device_ms), ("host ms", result.host_ms)):
        lines.append(
            f"{name:<13} min {s.min:.4f}  median {s.median:.4f}  mean {s.mean:.4f}  "
            f"stddev {s.stddev:.4f}  p90 {s.p90:.4f}"
        )
    busy = result.busy_ms.median if result.busy_ms else None
    kernel_busy = result.kernel_busy_ms.median if result.kernel_busy_ms else None
    lines += kt.side_by_side_lines(
        elapsed_ms=result.device_ms.median,
        busy_ms=busy,
        kernel_busy_ms=kernel_busy,
        original=result.original,
        clock=result.clock,
        clock_note=result.clock_note,
    )
    if result.released:
        lines.append(
            f"host waits    {result.released}: not run and not timed, on either side (each waits for a host "
            "write no replay makes)"
        )
    if result.collectives:
        lines.append(f"collectives   {result.collectives}")
    rows = [(k.operation, demangle(k.name), k.device_ms.median, k.original_ns) for k in result.kernels]
    return lines + kt.operation_lines(rows, result.clock)


def _csv(result: BenchmarkResult) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(
        ["what", "name", "operation", "min_ms", "median_ms", "mean_ms", "stddev_ms", "p90_ms", "name_demangled"]
    )
    s = result.device_ms
    writer.writerow(["scope", result.scope or "", "", s.min, s.median, s.mean, s.stddev, s.p90, ""])
    if result.busy_ms is not None:
        b = result.busy_ms
        writer.writerow(["busy", result.scope or "", "", b.min, b.median, b.mean, b.stddev, b.p90, ""])
    for k in result.kernels:
        s = k.device_ms
        writer.writerow(["operation", k.name, k.operation, s.min, s.median, s.mean, s.stddev, s.p90, demangle(k.name)])
    return out.getvalue()


def load_baseline(path: Path) -> dict[str, Any]:
    """--compare-to's earlier result, read before any work: a missing or malformed file is one line
    up front, not an error after the benchmark ran."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ReplayUsageError(f"--compare-to {path}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise ReplayUsageError(f"--compare-to {path}: not JSON (not UTF-8 text: byte {exc.start})") from None
    try:
        baseline = json.loads(text)
        float(baseline["device_ms"]["median"])
        kernels = baseline.get("kernels", [])
        for kernel in kernels:
            (kernel["operation"], kernel["name"], float(kernel["device_ms"]["median"]))
    except json.JSONDecodeError as exc:
        raise ReplayUsageError(f"--compare-to {path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ReplayUsageError(
            f"--compare-to {path}: not a benchmark-replay --format=json result (no {exc})"
            if isinstance(exc, KeyError)
            else f"--compare-to {path}: not a benchmark-replay --format=json result ({exc})"
        ) from None
    return baseline


def _compare(result: BenchmarkResult, baseline_path: Path, baseline: dict[str, Any] | None = None) -> list[str]:
    if baseline is None:
        baseline = load_baseline(baseline_path)
    base_median = float(baseline["device_ms"]["median"])
    lines = ["compared with " + str(baseline_path) + " (speedup = baseline / now):"]
    now = result.device_ms.median
    lines.append(
        f"  {'scope ' + repr(result.scope) if result.scope else 'whole capture':<48} "
        f"{base_median:.4f} -> {now:.4f} ms  {base_median / now if now else float('inf'):.3f}x"
    )
    by_key = {(k["operation"], k["name"]): k for k in baseline.get("kernels", [])}
    for k in result.kernels:
        old = by_key.get((k.operation, k.name))
        if old:
            before, after = float(old["device_ms"]["median"]), k.device_ms.median
            lines.append(
                f"  op {k.operation:>7} {demangle(k.name):<40} {before:.4f} -> {after:.4f} ms  "
                f"{before / after if after else float('inf'):.3f}x"
            )
    return lines


@click.command(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("captures", metavar="CAPTURE...", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--scope", metavar="NAME", help="Time only the work between the scope markers NAME (first occurrence).")
@click.option("--warmup", type=click.IntRange(min=0), default=3, show_default=True, help="Untimed iterations first.")
@click.option("--repetitions", type=click.IntRange(min=1), help="Timed iterations (default: as many as --min-time).")
@click.option(
    "--min-time",
    type=FiniteFloatRange(min=0),
    default=1.0,
    show_default=True,
    metavar="SECONDS",
    help="Without --repetitions, time iterations for at least this long.",
)
@click.option(
    "--mode",
    type=click.Choice(["eager", "graph"]),
    default="eager",
    show_default=True,
    help="graph: capture the region once as a CUDA graph and replay it (no Python launch overhead).",
)
@click.option("--flush-l2", is_flag=True, help="Flush the L2 cache before every iteration.")
@click.option(
    "--per-kernel",
    is_flag=True,
    help="Also time every launch and copy of the region; a CUDA graph's nodes one by one (those iterations run "
    "each graph launch node by node, timed with CUDA events).",
)
@click.option(
    "--clock",
    type=click.Choice(["auto", "cupti", "events"]),
    default="auto",
    show_default=True,
    help="Per-operation and busy times: CUPTI activity records (auto: when present) or CUDA events.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json", "csv"]),
    default="text",
    show_default=True,
    help="json: the result for --compare-to and scripts; csv: one row for the scope and one per operation.",
)
@click.option(
    "--compare-to",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="BASELINE.json",
    help="Print the speedup against an earlier --format=json result, per scope and operation.",
)
@click.option(
    "--output",
    "output",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="Write the result (in --format) to FILE instead of stdout, only once the run succeeded "
    "(a failed run leaves no file, where a shell's > would leave an empty one).",
)
@click.option(
    "--trace",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE.json",
    help="Write a Chrome/Perfetto trace of the last iteration (a track per stream).",
)
@replay_options
@limit_option
@agents_md_option("benchmark-replay")
@reports_errors("benchmark-replay")
def main(
    captures: tuple[Path, ...],
    scope: str | None,
    warmup: int,
    repetitions: int | None,
    min_time: float,
    mode: str,
    flush_l2: bool,
    per_kernel: bool,
    clock: str,
    fmt: str,
    output: Path | None,
    compare_to: Path | None,
    trace: Path | None,
    devices: tuple[str, ...],
    substitutions: tuple[str, ...],
    remaps: tuple[str, ...],
    launches: tuple[str, ...],
    fixed_addresses: bool,
    nvtx: bool,
    limits: Limits,
) -> int:
    """Time replayed work faithfully: exactly the scope asked for (the whole capture without
    --scope), from the same starting state every time; setup and starting state stay outside the
    timed region. Elapsed time from CUDA events; GPU busy and per-operation times from CUPTI.
    Given every rank's capture of a job, the ranks run together, one process and one GPU each,
    their collectives among them, each timed as it would be alone."""
    if fixed_addresses:
        restart_without_aslr()  # recorded addresses are reachable only so (see address_space)
    options = BenchmarkReplayOptions(
        measure=BenchmarkOptions(
            scope=scope,
            warmup=warmup,
            repetitions=repetitions,
            min_time=min_time,
            mode=mode,
            flush_l2=flush_l2,
            per_kernel=per_kernel or trace is not None,
            trace=trace,
            clock=clock,
        ),
        plan=plan_options(
            substitutions=substitutions, remaps=remaps, launches=launches, fixed_addresses=fixed_addresses
        ),
        devices=parse_devices(devices)[:1],
        nvtx=nvtx,
        limits=limits,
    )
    if len(captures) > 1:
        return _print_ranks(benchmark_ranks(captures, options, devices=parse_devices(devices) if devices else ()))
    baseline = _check_paths(trace=trace, output=output, compare_to=compare_to)
    result = _run_with_progress(captures[0], options)
    if fmt == "json":
        text = json.dumps(result_json(result), indent=2) + "\n"
    elif fmt == "csv":
        text = _csv(result)
    else:
        text = "".join(line + "\n" for line in _text(result))
    if output is None:
        click.echo(text, nl=False)
    else:
        write_atomically(output, text)
        click.echo(f"result: {output}", err=True)
    if compare_to is not None:
        for line in _compare(result, compare_to, baseline):
            click.echo(line, err=fmt != "text" and output is None)
    return EXIT_OK


def _print_ranks(ranks: list[RankBenchmark]) -> int:
    """Each rank's timing, as one capture's is printed, under its rank."""
    failed = 0
    for r in ranks:
        click.echo(f"rank {r.capture.rank} on cuda:{r.device} ({r.capture.path})")
        if r.result is None:
            click.echo(f"  error: {r.error}")
            failed += 1
            continue
        for line in _text(r.result):
            click.echo(f"  {line}")
    return EXIT_PROBLEM if failed else EXIT_OK


def _check_paths(*, trace: Path | None, output: Path | None, compare_to: Path | None) -> Any:
    """Every path before any device work (a run must not end in an error about its own flags);
    the --compare-to baseline, read."""
    if trace is not None:
        check_new_file(trace, "--trace")
    if output is not None:
        check_new_file(output, "--output")
    return load_baseline(compare_to) if compare_to is not None else None


def result_json(result: BenchmarkResult) -> dict[str, Any]:
    """The JSON result; each kernel's raw symbol stays in ``name`` (what --compare-to matches), a
    mangled one gains ``name_demangled``."""
    row = result.to_json()
    for kernel in row.get("kernels", []):
        readable = demangle(kernel["name"])
        if readable != kernel["name"]:
            kernel["name_demangled"] = readable
    return row


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same directory, renamed into place:
    a reader never sees a partial result, and a failure leaves nothing behind."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise ReplayUsageError(f"--output {path}: cannot write ({exc.strerror})") from None


def _run_with_progress(capture: Path, options: BenchmarkReplayOptions) -> BenchmarkResult:
    """A progress bar on stderr, shown only once the run has taken more than a second."""
    if not sys.stderr.isatty():
        return benchmark(capture, options)
    min_time = options.measure.min_time
    from rich.progress import Progress

    state: dict[str, Any] = {}

    def progress(done: int, total: int | None, elapsed: float) -> None:
        if elapsed < 1.0 and "bar" not in state:
            return
        if "bar" not in state:
            state["bar"] = Progress(transient=True, console=None)
            state["bar"].start()
            state["task"] = state["bar"].add_task("benchmarking", total=total or min_time)
        state["bar"].update(state["task"], completed=done if total else min(elapsed, min_time))

    try:
        return benchmark(capture, options, progress=progress)
    finally:
        if "bar" in state:
            state["bar"].stop()


if __name__ == "__main__":
    main()
