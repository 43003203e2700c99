"""capture-replay (also ``python -m replayfmt.capture``): run a program and record its GPU work
into a .kreplay file, with no change to the program: a Python script in this process, any other
program (an ELF binary, a shell script) as a child through CUDA's injection entry point."""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

import click

from replayfmt.capture import CaptureMode, Recorder, RecordOptions
from replayfmt.capture.injection import Target, TargetKind, classify, describe_failure, record_program
from replayfmt.cuda.address_space import restart_without_aslr
from replayfmt.format import model as m
from replayfmt_tools.common import EXIT_PROBLEM, ToolExit, agents_md_option, reports_errors


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="The .kreplay file to write.")
@click.option("--overwrite", is_flag=True, help="Replace OUTPUT if it exists (never done silently).")
@click.option(
    "--mode",
    type=click.Choice(["region", "kernel"]),
    default="region",
    show_default=True,
    help="region: all work (or work inside --scope); kernel: selected launches as instances.",
)
@click.option("--kernels", metavar="REGEX", help="Kernel mode: kernels whose symbol name matches.")
@click.option("--skip-first", type=click.IntRange(min=0), default=0, help="Kernel mode: launches to skip per kernel.")
@click.option(
    "--max-per-kernel",
    type=click.IntRange(min=0),
    default=1,
    show_default=True,
    help="Kernel mode: instances kept per kernel (0: all).",
)
@click.option(
    "--scope",
    "scopes",
    multiple=True,
    metavar="NAME",
    help="Region mode: record only inside replayfmt.capture.scope(NAME) blocks, or inside a native "
    "program's NVTX ranges named NAME (repeatable).",
)
@click.option(
    "--fixed-addresses",
    is_flag=True,
    help="Mark buffers for replay at their recorded addresses (re-runs with ASLR off).",
)
@click.option(
    "--file-policy",
    type=click.Choice([p.label for p in m.FilePolicy]),
    default="reference",
    show_default=True,
    help="For copies from file mappings (weights); module images are always stored.",
)
@click.option(
    "--file-validation",
    type=click.Choice(["identity", "digest"]),
    default="identity",
    show_default=True,
    help="How replay checks referenced files: identity (the same file) or digest (same bytes).",
)
@click.option("--label-tensors", is_flag=True, help="Type buffers from every PyTorch op's tensors (slower).")
@click.option(
    "--whole-allocations",
    is_flag=True,
    help="Snapshot whole allocations, not only the live JAX/PyTorch buffers in large ones.",
)
@click.option(
    "--max-snapshot-gib",
    type=click.FloatRange(min=0),
    default=16.0,
    show_default=True,
    help="Refuse (never attempt) a larger snapshot of an allocation no framework describes.",
)
@click.option(
    "--keep-partial",
    is_flag=True,
    help="Keep OUTPUT and exit 0 when the capture cannot be replayed (default: remove it, exit 1).",
)
@click.option("--quiet", is_flag=True, help="Do not print the report at the end.")
@agents_md_option("capture-replay")
@click.argument("script", metavar="PROGRAM")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@reports_errors("capture-replay")
def main(
    output: str,
    overwrite: bool,
    mode: str,
    kernels: str | None,
    skip_first: int,
    max_per_kernel: int,
    scopes: tuple[str, ...],
    fixed_addresses: bool,
    file_policy: str,
    file_validation: str,
    label_tensors: bool,
    whole_allocations: bool,
    max_snapshot_gib: float,
    keep_partial: bool,
    quiet: bool,
    script: str,
    args: tuple[str, ...],
) -> int:
    """Run PROGRAM with ARGS and record its GPU work into OUTPUT.

    A Python script (by its #! line or its source) runs in this process. Any other program (an
    ELF binary, a shell script) runs as a child process that CUDA's injection entry point
    (CUDA_INJECTION64_PATH) makes host the same recorder, with the same options: --scope then
    names NVTX ranges the program pushes. See docs/INJECTION.md.

    Region mode records everything from the start (or inside --scope blocks) and checkpoints what
    it wrote at the end; kernel mode keeps --kernels launches with before and after snapshots.
    Replay the result with run-replay, benchmark-replay or tune-replay.

    At the end the capture is checked as run-replay's plan checks it: `replayable: yes`, or the
    first reason why not, in which case OUTPUT is removed and the exit status is 1 (--keep-partial
    keeps the file and exits 0). The report also says what replay needs from this host.
    """
    if fixed_addresses:
        restart_without_aslr()  # the driver's address range then lands where a replay finds it
    options = RecordOptions(
        mode=CaptureMode(mode),
        kernels=kernels,
        skip_first=skip_first,
        max_per_kernel=max_per_kernel or None,
        region_scopes=scopes,
        fixed_addresses=fixed_addresses,
        label_tensors=label_tensors,
        file_policy=m.FilePolicy[file_policy.upper().replace("-", "_")],
        file_validation=m.FileValidation[file_validation.upper()],
        live_buffers=not whole_allocations,
        max_snapshot=int(max_snapshot_gib * (1 << 30)),
    )
    target = classify(script)
    if target.kind == TargetKind.NATIVE:
        return _record_native(
            target, args, output, options, overwrite=overwrite, keep_partial=keep_partial, quiet=quiet
        )
    recorder = Recorder(output, options, overwrite=overwrite, command_line=(script, *args))
    if options.mode == CaptureMode.REGION and not scopes:
        recorder.start()
    code = 0
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    namespace: dict[str, object] = {}  # the script's globals live until the final checkpoint (live buffers)
    try:
        namespace = runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        report = recorder.close()
        namespace.clear()
        if not quiet:
            for line in report.lines():
                click.echo(line, err=True)
    verdict = report.verdict
    if verdict is None:
        return code
    return _verdict_exit(code, verdict.replayable, verdict.reason, output, keep_partial)


def _record_native(
    target: Target,
    args: tuple[str, ...],
    output: str,
    options: RecordOptions,
    *,
    overwrite: bool,
    keep_partial: bool,
    quiet: bool,
) -> int:
    """A program that is not Python: a child process hosting the recorder (docs/INJECTION.md)."""
    run = record_program(target, args, output, options, overwrite=overwrite)
    if not quiet:
        for line in run.report_lines:
            click.echo(line, err=True)
    for other in run.others:
        click.echo(f"capture-replay: not recorded: process {other}", err=True)
    if run.replayable is None:
        raise ToolExit(EXIT_PROBLEM, f"error: {describe_failure(run, target.path)}")
    for error in run.errors:
        click.echo(f"capture-replay: {error}", err=True)
    return _verdict_exit(run.exit_code, run.replayable, run.reason, output, keep_partial)


def _verdict_exit(code: int, replayable: bool, reason: str, output: str, keep_partial: bool) -> int:
    """The program's status, or 1 (and OUTPUT removed) when the capture cannot be replayed."""
    if code or replayable:
        return code
    if keep_partial:
        click.echo(f"capture-replay: kept {output} although it cannot be replayed (--keep-partial)", err=True)
        return code
    Path(output).unlink(missing_ok=True)
    raise ToolExit(EXIT_PROBLEM, f"error: {output} cannot be replayed ({reason}); removed it (--keep-partial keeps it)")


if __name__ == "__main__":
    main()
