"""extract-replay: cut one launch, a scope or an operation range out of a capture into a standalone
capture that replays, verifies and benchmarks like one recorded in kernel mode."""

from __future__ import annotations

import json
import re
from pathlib import Path

import click

from replayfmt.edit import ExtractOptions, ExtractResult, Selection, extract
from replayfmt.format.layout import Limits
from replayfmt_tools.common import EXIT_OK, agents_md_option, reports_errors
from replayfmt_tools.options import FiniteFloatRange, exactly_one, limit_option

EPILOG = """\b
Exactly one of --operation, --operations, --kernel, --scope says what to cut out. The output
holds one scope (kernel#K for a launch, the scope's name for a scope) with the starting state
of every byte range the work reads, the work, and a checkpoint of what it may write; only the
executables, buffers, graphs, streams and events the work needs; the original program's times
of those operations; and where it came from (dump-replay --format=json shows the metadata's
extract.* properties: source path and digest, operation range, how state was obtained).

\b
Starting state and checkpoint come from the capture's own data where it holds them (states,
uploads, memsets, copies, checkpoints); otherwise the operations before the range are replayed
on a GPU and the bytes read back (the report says "state from gpu-replay"). --no-gpu refuses
instead when starting state is missing, naming the buffer, the byte range and the operation that
wrote it; where only the checkpoint is incomplete it writes what the capture holds and lists the
ranges left unchecked.

\b
Exit status: 0 written; 1 the work cannot be extracted (an unsupported operation, a replay
failure); 2 usage error, unreadable capture, existing output without --force, no GPU.

\b
Examples:
  extract-replay --kernel 'gemm#2' -o gemm.kreplay step.kreplay
  extract-replay --scope 'softmax_kernel#3' -o one.kreplay kernels.kreplay
  extract-replay --operation 118 --no-gpu -o k.kreplay step.kreplay
  extract-replay --operations 100..140 -o part.kreplay step.kreplay
  run-replay --verify gemm.kreplay && benchmark-replay --scope='gemm#2' gemm.kreplay
"""

_RANGE = re.compile(r"^(\d+)\.\.(\d+)$")


def _selection(operation: int | None, operations: str | None, kernel: str | None, scope: str | None) -> Selection:
    exactly_one(
        [
            ("--operation", operation is not None),
            ("--operations", operations is not None),
            ("--kernel", kernel is not None),
            ("--scope", scope is not None),
        ],
        "give exactly one of --operation, --operations, --kernel, --scope",
    )
    if operation is not None:
        return Selection.operation(operation)
    if operations is not None:
        match = _RANGE.match(operations)
        if not match:
            raise click.BadParameter("expected FIRST..LAST (both included), e.g. 100..140", param_hint="--operations")
        first, last = int(match[1]), int(match[2])
        if last < first:
            raise click.BadParameter(f"{operations}: LAST comes before FIRST", param_hint="--operations")
        return Selection.range(first, last)
    if kernel is not None:
        return Selection.kernel(kernel)
    return Selection.scope(scope or "")


def _first(items: list[str]) -> str:
    return items[0] + (f" (and {len(items) - 1} more)" if len(items) > 1 else "")


def _report(result: ExtractResult) -> dict[str, object]:
    return {
        "output": str(result.output),
        "source": result.source,
        "source_operations": [result.first, result.last],
        "scope": result.scope,
        "operations": result.operations,
        "state_source": result.state_source,
        "checkpoint_source": result.checkpoint_source,
        "gpu_device": result.gpu_device or None,
        "state_bytes": result.state_bytes,
        "checkpoint_bytes": result.checkpoint_bytes,
        "timed_operations": result.timed_operations,
        "objects": result.kept,
        "source_bytes": result.source_size,
        "output_bytes": result.output_size,
        "size_ratio": result.output_size / result.source_size if result.source_size else None,
        "why_gpu": result.needs,
        "narrowed": result.narrowed or None,
        "unchecked": result.unchecked,
    }


@click.command(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("capture", type=click.Path(path_type=Path))
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    required=True,
    help="The new capture (never replaced without --force).",
)
@click.option("--operation", type=click.IntRange(min=0), help="Cut out operation N (an index dump-replay shows).")
@click.option(
    "--operations", metavar="FIRST..LAST", help="Cut out operations FIRST to LAST, both included (one region)."
)
@click.option(
    "--kernel", metavar="REGEX[#K]", help="The K-th launch (from 0) whose kernel name, raw or demangled, REGEX finds."
)
@click.option("--scope", metavar="NAME[#K]", help="A scope by name (#K: the K-th of several of that name).")
@click.option("--no-gpu", is_flag=True, help="Never replay on a GPU: refuse when the capture lacks the bytes.")
@click.option("--force", is_flag=True, help="Replace OUTPUT if it exists.")
@click.option(
    "--max-read-gib",
    type=FiniteFloatRange(min=0),
    default=8.0,
    show_default=True,
    help="The most GiB of buffers a GPU replay may read back (the buffers the work uses, whole).",
)
@click.option(
    "--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True, help="How to report."
)
@limit_option
@agents_md_option("extract-replay")
@reports_errors("extract-replay")
def main(
    capture: Path,
    output: Path,
    operation: int | None,
    operations: str | None,
    kernel: str | None,
    scope: str | None,
    no_gpu: bool,
    force: bool,
    max_read_gib: float,
    fmt: str,
    limits: Limits,
) -> int:
    """Cut one launch, a scope or an operation range out of CAPTURE into a standalone capture."""
    selection = _selection(operation, operations, kernel, scope)
    result = extract(
        capture,
        selection,
        output,
        ExtractOptions(
            allow_gpu=not no_gpu, overwrite=force, max_gpu_read=int(max_read_gib * (1 << 30)), limits=limits
        ),
    )
    if fmt == "json":
        click.echo(json.dumps(_report(result)))
        return EXIT_OK
    kept = ", ".join(f"{kind} {n}" for kind, n in sorted(result.kept.items()))
    source = result.state_source + (f" on {result.gpu_device}" if result.gpu_device else "")
    ratio = f" ({100 * result.output_size / result.source_size:.2f}% of the source)" if result.source_size else ""
    click.echo(f"wrote      {result.output}: {result.output_size} bytes{ratio}")
    click.echo(f"from       {result.source} operations {result.first}..{result.last}")
    click.echo(f"scope      {result.scope} ({result.operations} operations)")
    click.echo(f"objects    {kept}")
    click.echo(f"state      {result.state_bytes} bytes from {source}")
    click.echo(f"checkpoint {result.checkpoint_bytes} bytes from {source}")
    click.echo(f"times      {result.timed_operations} operations carry the original program's times")
    if result.narrowed:
        click.echo(f"narrowed   {result.narrowed}")
    if result.unchecked:
        click.echo(f"unchecked  {_first(result.unchecked)}")
    if result.needs:
        click.echo(f"gpu needed {_first(result.needs)}")
    return EXIT_OK


if __name__ == "__main__":
    main()
