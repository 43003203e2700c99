"""diff-replay: compare two captures of one program (before and after a compiler, library or driver
change): kernels that appeared, vanished or changed, and how the original times moved."""

from __future__ import annotations

import json
from pathlib import Path

import click

from replayfmt.edit.diff_view import DEFAULT_FAIL_ON, json_rows, parse_fail_on, render_text
from replayfmt.format.layout import Limits
from replayfmt.verbs import DiffOptions, diff
from replayfmt_tools.common import EXIT_OK, EXIT_PROBLEM, agents_md_option, reports_errors
from replayfmt_tools.options import limit_option

EPILOG = """\b
Matching: each capture's launches in order form a sequence of (demangled) kernel names; the two
sequences are aligned like diff --patience aligns lines (bounded time), so an inserted or
removed launch shifts nothing after it. Inside a changed stretch, the k-th launch of a name on
each side is paired; the rest are inserted or removed. Paired launches are compared by shape
(grid, block, cluster, dynamic shared memory), parameters and their executable image's hash.
Parameters are read by what the kernel declares: pointers (in structs too) as the buffer and
offset they point to (a declared pointer into host memory on both sides has nothing to compare),
values of fundamental types by value, PyTorch's TensorInfo up to its dims. Other bytes of a
struct passed by value (padding, unused entries, empty classes, a functor's fields) may be left
unwritten by the host and differ between two runs of one program: a launch differing only there
is counted apart as struct-bytes. Times are the original program's (the recorder's CUPTI
records). Every payload of both captures is checked against its hashes: a damaged or recovered
(truncated) capture is named and fails the diff whatever --fail-on says.

\b
--fail-on CHECK[,CHECK...] (repeatable): time=P% (a kernel's total time moved more than P%;
time=+P%: only slower), scope-time=P%, total-time=P%, shape, parameters, executable,
new-kernels, missing-kernels, launches, any (all of these structural checks), struct-bytes
(launches differing only in struct bytes; listed only then). Default: any.

\b
Exit status: 0 the same within the thresholds; 1 different, or an input damaged; 2 usage error
or unreadable capture.

\b
Examples:
  diff-replay before.kreplay after.kreplay
  diff-replay --fail-on time=+5% --fail-on new-kernels before.kreplay after.kreplay
  diff-replay --format=jsonl a.kreplay b.kreplay | jq 'select(.kind=="kernel" and .ratio > 1.05)'
"""


@click.command(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("before", type=click.Path(path_type=Path))
@click.argument("after", type=click.Path(path_type=Path))
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "jsonl"]),
    default="text",
    show_default=True,
    help="A table, or JSON rows for jq.",
)
@click.option("--fail-on", "fail_on", multiple=True, metavar="CHECKS", help="What counts as different (see below).")
@click.option("--all-launches", is_flag=True, help="List every launch pair, not only the changed ones.")
@limit_option
@agents_md_option("diff-replay")
@reports_errors("diff-replay")
def main(before: Path, after: Path, fmt: str, fail_on: tuple[str, ...], all_launches: bool, limits: Limits) -> int:
    """Compare two captures: kernels added, removed or changed, and original times side by side."""
    thresholds = tuple(t for text in fail_on for t in parse_fail_on(text)) or DEFAULT_FAIL_ON
    result = diff(before, after, DiffOptions(fail_on=thresholds, limits=limits))
    failed = list(result.failed)
    if fmt == "jsonl":
        for row in json_rows(result.diff, failed, list(thresholds), all_launches=all_launches):
            click.echo(json.dumps(row))
    else:
        struct_bytes = any(t.check == "struct-bytes" for t in thresholds)
        for line in render_text(result.diff, failed, all_launches=all_launches, struct_bytes=struct_bytes):
            click.echo(line)
    return EXIT_PROBLEM if failed else EXIT_OK


if __name__ == "__main__":
    main()
