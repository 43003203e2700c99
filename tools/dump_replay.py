"""dump-replay: text, JSONL and summary views of a .kreplay capture."""

from __future__ import annotations

import contextlib
import json
import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import click

import replayfmt
from replayfmt.dump import Dumper, DumpFilter, PayloadMode, render_summary_text, summarize
from replayfmt.dump.export import prepare_directory
from replayfmt.dump.one_pass import OnePass
from replayfmt.dump.summary import Summary
from replayfmt.errors import ReplayFormatError, ReplayUsageError
from replayfmt.format.layout import Limits
from replayfmt.reader import Capture
from replayfmt.replay.replayable import plan_verdict
from replayfmt_tools.common import EXIT_OK, EXIT_PROBLEM, EXIT_USAGE, ToolExit, agents_md_option, reports_errors
from replayfmt_tools.options import limit_option

_FLUSH_EVERY = 2048

EPILOG = """\b
Examples:
  dump-replay cap.kreplay
  dump-replay --format=jsonl --kind=launch,copy cap.kreplay
  dump-replay --jq 'select(.kind=="launch") | .function' cap.kreplay
  dump-replay --format=json cap.kreplay | jq .replayable

The summary's "replayable" is the verdict run-replay --dry-run gives (the same plan, default
options; every payload the replay reads is read and checked against its hashes, unless
--no-payload-checks): why not, in the same words; warnings (a dropped TIMINGS chunk) do not
change it.

Exit status: 0 ok; 1 the file is damaged or truncated (everything readable is printed first);
2 usage or unreadable file.
"""


def _parse_payloads(value: str) -> tuple[PayloadMode, Path | None]:
    mode, _, directory = value.partition(":")
    try:
        parsed = PayloadMode(mode)
    except ValueError:
        raise click.BadParameter("expected none, hex, base64 or files:DIR", param_hint="--payloads") from None
    if parsed == PayloadMode.FILES and not directory:
        raise click.BadParameter("files needs a directory: files:DIR", param_hint="--payloads")
    if parsed != PayloadMode.FILES and directory:
        raise click.BadParameter(f"{mode} takes no directory", param_hint="--payloads")
    return parsed, Path(directory) if directory else None


def _write_lines(lines: Iterable[str]) -> None:
    out = sys.stdout
    pending: list[str] = []
    try:
        for line in lines:
            pending.append(line)
            if len(pending) >= _FLUSH_EVERY:
                out.write("\n".join(pending) + "\n")
                pending.clear()
    finally:  # a damaged file stops the lines: what came before it is still printed
        if pending:
            out.write("\n".join(pending) + "\n")


def _jq_lines(program_text: str, rows: Iterator[str]) -> Iterator[str]:
    import jq

    try:
        program = jq.compile(program_text)
    except ValueError as exc:
        raise ReplayUsageError(f"--jq: {_jq_message(exc)}") from None
    for row in rows:
        try:
            text = program.input_text(row).text()
        except ValueError as exc:
            raise ReplayUsageError(f"--jq: {_jq_message(exc)}") from None
        if text:
            yield text


def _jq_message(exc: ValueError) -> str:
    """jq's message with its program and caret lines (where the error is), without its own
    ``jq: error:`` prefix and ``jq: N compile error`` trailer."""
    lines = [line for line in str(exc).splitlines() if not re.fullmatch(r"jq: \d+ compile errors?", line)]
    if lines:
        lines[0] = lines[0].removeprefix("jq: error: ")
    return "\n".join(lines) or "jq failed"


_WHAT = {"json": "the summary alone", "jsonl": "one row per record"}


def _given(param: str) -> bool:
    """Whether the user typed the flag (not its default)."""
    source = click.get_current_context().get_parameter_source(param)
    return source not in (None, click.core.ParameterSource.DEFAULT)


def _check_usage(
    cap: replayfmt.Capture,
    fmt: str,
    payloads: str,
    object_id: int | None,
    jq_program: str | None,
    summary_only: bool,
) -> None:
    """Flags that would otherwise do nothing, silently."""
    if payloads != "none" and fmt != "jsonl" and not (jq_program and fmt == "text"):
        raise ReplayUsageError(f"--payloads={payloads} applies to JSONL rows: add --format=jsonl (or use --jq)")
    if jq_program and fmt == "text" and _given("fmt"):
        raise ReplayUsageError(
            "--jq runs on JSONL rows (--format=jsonl, its default) or on the JSON summary (--format=json)"
        )
    if summary_only and fmt != "text":
        raise ReplayUsageError(f"--summary shortens the text format; --format={fmt} prints {_WHAT[fmt]}")
    if object_id is not None and not 1 <= object_id <= cap.object_count:
        have = f"objects 1 to {cap.object_count}" if cap.object_count else "no objects"
        raise ReplayUsageError(f"--object {object_id}: the capture has {have}")


@click.command(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("capture", type=click.Path(dir_okay=True, path_type=Path))
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "jsonl", "json"]),
    default="text",
    show_default=True,
    help="text: summary then one line per record; jsonl: one JSON object per row; json: the summary alone.",
)
@click.option("--summary", "summary_only", is_flag=True, help="Text format: print the summary only.")
@click.option("--ops", metavar="START:END", help="Only operations with START <= index < END.")
@click.option("--kind", "kinds", metavar="KIND[,KIND...]", help="Only rows of these kinds (launch, copy, buffer, ...).")
@click.option("--object", "object_id", type=int, metavar="ID", help="Only the object ID and operations that use it.")
@click.option("--grep", metavar="REGEX", help="Only rows whose names (kernels, labels, scopes, paths) match.")
@click.option(
    "--jq",
    "jq_program",
    metavar="FILTER",
    help="Run a jq program in-process on every JSONL row (or, with --format=json, on the summary).",
)
@click.option(
    "--payloads",
    "payloads",
    default="none",
    show_default=True,
    metavar="none|hex|base64|files:DIR",
    help="Inline payload bytes in JSONL rows (up to 64 MiB each), or write each payload once to "
    "DIR/<hash>.bin (existing files are verified, never replaced).",
)
@click.option(
    "--no-payload-checks",
    is_flag=True,
    help="Do not read the payloads for the replayable verdict (faster on large captures; a damaged payload then "
    "goes unseen, and the summary says so).",
)
@limit_option
@agents_md_option("dump-replay")
@reports_errors("dump-replay", output_is_the_work=True)
def main(
    capture: Path,
    fmt: str,
    summary_only: bool,
    ops: str | None,
    kinds: str | None,
    object_id: int | None,
    grep: str | None,
    jq_program: str | None,
    payloads: str,
    limits: Limits,
    no_payload_checks: bool,
) -> int:
    """Show what a .kreplay capture holds: kernels, launch shapes, files, payloads, and whether it
    can be replayed. Streams in constant memory; jq-friendly."""
    payload_mode, payload_dir = _parse_payloads(payloads)
    dump_filter = DumpFilter.parse(ops=ops, kinds=kinds, object_id=object_id, grep=grep)
    try:
        cap = replayfmt.open(capture, limits=limits)
    except ReplayFormatError as exc:
        raise ToolExit(EXIT_USAGE, f"error: {exc}") from None
    with cap:
        _check_usage(cap, fmt, payloads, object_id, jq_program, summary_only)
        if payload_dir is not None and prepare_directory(payload_dir):
            click.echo(f"dump-replay: created the directory {payload_dir} for payload files", err=True)
        dumper = Dumper(cap, filter=dump_filter, payloads=payload_mode, payload_dir=payload_dir)
        checks = not no_payload_checks
        summary = _dump(cap, dumper, fmt=fmt, jq_program=jq_program, summary_only=summary_only, check_payloads=checks)
        sys.stdout.flush()
        if summary.damaged:
            raise ToolExit(EXIT_PROBLEM, f"error: {summary.damaged}")
        if cap.recovered:
            raise ToolExit(
                EXIT_PROBLEM,
                f"error: {capture}: the file was not closed properly and was recovered; "
                f"{cap.discarded_bytes} bytes at its end were unreadable and discarded ({cap.recovery_reason})",
            )
    return EXIT_OK


def _dump(
    cap: Capture, dumper: Dumper, *, fmt: str, jq_program: str | None, summary_only: bool, check_payloads: bool
) -> Summary:
    """The plan's verdict (the one run-replay --dry-run gives), the summary, then the rows: the
    rows are taken as the verdict's plan decodes each batch, so every batch is decoded once."""
    text = fmt == "text" and not jq_program
    taken = OnePass(cap, dumper, Dumper.text_lines if text else Dumper.jsonl_rows)
    with taken if fmt != "json" and not summary_only else contextlib.nullcontext(None) as rows:
        verdict = plan_verdict(cap, verify_payloads=check_payloads)
        if not check_payloads:
            verdict.warnings.append("payload contents not read (--no-payload-checks): a damaged payload goes unseen")
        summary = summarize(cap, problems=verdict.problems, warnings=verdict.warnings, sketches=rows and rows.sketches)
        _write_views(dumper, summary, rows, fmt=fmt, jq_program=jq_program, summary_only=summary_only)
    return summary


def _write_views(
    dumper: Dumper, summary: Summary, rows: OnePass | None, *, fmt: str, jq_program: str | None, summary_only: bool
) -> None:
    """The summary, then (unless ``summary_only``) every record, as text or JSON lines, through jq if asked."""
    if fmt == "json" and jq_program:
        _write_lines(_jq_lines(jq_program, iter([json.dumps(summary.as_row())])))
    elif fmt == "json":
        click.echo(json.dumps(summary.as_row(), indent=2))
    else:
        try:
            if fmt == "text" and not jq_program:
                _write_lines(render_summary_text(summary))
                if not summary_only and rows is not None:
                    sys.stdout.write("\n")
                    _write_lines(rows.lines())
            else:
                encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode

                def jsonl() -> Iterator[str]:
                    yield encode(dumper.file_row())
                    yield encode(summary.as_row())
                    yield from rows.lines() if rows is not None else dumper.jsonl_rows()

                _write_lines(_jq_lines(jq_program, jsonl()) if jq_program else jsonl())
        except ReplayFormatError as exc:
            sys.stdout.flush()
            raise ToolExit(EXIT_PROBLEM, f"error: {exc}") from None


if __name__ == "__main__":
    main()
