"""capture-replay (also ``python -m replayfmt.capture``): run a program and record its GPU work
into a .kreplay file, with no change to the program: a Python script in this process, any other
program (an ELF binary, a shell script) as a child through CUDA's injection entry point."""

from __future__ import annotations

import gc
import os
import runpy
import sys
from pathlib import Path

import click

from replayfmt.capture import CaptureMode, Recorder, RecordOptions, Report, SelfCheck
from replayfmt.capture.injection import Target, TargetKind, classify, describe_failure, record_program
from replayfmt.capture.profilers import conflict_line
from replayfmt.capture.self_check import Outcome, replay_check
from replayfmt.cuda.address_space import restart_without_aslr
from replayfmt.format import model as m
from replayfmt_tools.common import (
    EXIT_PROBLEM,
    ToolExit,
    agents_md_option,
    check_new_file,
    invoked_name,
    reports_errors,
)
from replayfmt_tools.options import FiniteFloatRange

MODULE_NAME = "python -m replayfmt.capture"  # how README starts the recorder; messages use the name typed


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
    type=FiniteFloatRange(min=0),
    default=16.0,
    show_default=True,
    help="Refuse (never attempt) a larger snapshot of an allocation no framework describes.",
)
@click.option(
    "--keep-partial",
    is_flag=True,
    help="Keep OUTPUT (marked partial when it stopped on an error) when the capture cannot be replayed, and "
    "exit with the program's own status (default: remove it, exit 1).",
)
@click.option(
    "--no-self-check",
    is_flag=True,
    help="Do not replay and verify the capture in a child process at the end (the plan's checks only).",
)
@click.option(
    "--self-check-timeout",
    type=FiniteFloatRange(min=1),
    default=300.0,
    show_default=True,
    metavar="SECONDS",
    help="The self-check's replay gets this long; past it the verdict says it was not replayed.",
)
@click.option(
    "--self-check-max-gib",
    type=FiniteFloatRange(min=0),
    default=16.0,
    show_default=True,
    help="A larger capture file is not replayed by the self-check (the verdict says so).",
)
@click.option("--quiet", is_flag=True, help="Do not print the report at the end.")
@agents_md_option("capture-replay")
@click.argument("script", metavar="PROGRAM")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@reports_errors("capture-replay", aliases=(MODULE_NAME,))
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
    no_self_check: bool,
    self_check_timeout: float,
    self_check_max_gib: float,
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

    At the end the capture is checked as run-replay's plan checks it, then replayed and verified
    in a child process (run-replay --verify; bounded by --self-check-timeout and
    --self-check-max-gib, off with --no-self-check): `replayable: yes (replayed and verified: N
    ranges)`, or what failed. A capture that cannot be replayed, or that stopped on an error (the
    recorder's, or the program's while it was recorded: the file is marked partial), is removed
    and the exit status is 1 (--keep-partial keeps the file and exits 0); a replay whose
    verification finds a difference is reported and kept. The report also says what replay needs
    from this host.
    """
    # before CUDA, CUPTI or the program start: a path that cannot take the capture is one line now
    check_new_file(Path(output), "-o", overwrite_flag="--overwrite", overwrite=overwrite)
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
        limits = None if no_self_check else SelfCheck(self_check_timeout, int(self_check_max_gib * (1 << 30)))
        return _record_native(
            target,
            args,
            output,
            options,
            overwrite=overwrite,
            keep_partial=keep_partial,
            quiet=quiet,
            self_check=limits,
            name=invoked_name("capture-replay", (MODULE_NAME,)),
        )
    recorder = Recorder(output, options, overwrite=overwrite, command_line=(script, *args))
    if options.mode == CaptureMode.REGION and not scopes:
        recorder.start()
    code = 0
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    namespace: dict[str, object] = {}  # the script's globals live until the final checkpoint (live buffers)
    failure, error, conflict = "", None, None
    try:
        namespace = runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = int(exc.code) if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        failure = f"it exited with status {code}" if code else ""
        if not isinstance(exc.code, int | None):  # sys.exit("why"): Python prints why
            click.echo(str(exc.code), err=True)
            failure += f" ({exc.code})"
    except BaseException as exc:  # the program's own error: the capture is partial; raised again below
        failure, error = f"it raised {type(exc).__name__}: {exc}", exc
        conflict = conflict_line(exc) if isinstance(exc, Exception) else None  # a CUPTI conflict is said first
    report = recorder.close(program_failed=failure)
    namespace.clear()
    if not no_self_check and report.verdict is not None and report.verdict.replayable and not report.partial:
        _release_cached_memory()
        recorder.self_check(SelfCheck(self_check_timeout, int(self_check_max_gib * (1 << 30))))
    if not quiet:
        for line in report.lines():
            click.echo(line, err=True)
    name = invoked_name("capture-replay", (MODULE_NAME,))
    if conflict:
        click.echo(f"{name}: {conflict}", err=True)
    try:
        code = _outcome(report, output, code, keep_partial=keep_partial, name=name)
    except ToolExit as exc:
        if error is None:
            raise
        click.echo(f"{name}: {exc.message}", err=True)  # then the program's own error
    if error is not None:
        raise error
    return code


def _outcome(report: Report, output: str, code: int, *, keep_partial: bool, name: str) -> int:
    """Keep or remove OUTPUT after the verdict; the exit status."""
    verdict = report.verdict
    if verdict is not None and verdict.replay is not None and verdict.replay.outcome == Outcome.MISMATCH:
        _warn_mismatch(output, name)
    if verdict is None:
        return code
    reason = f"it is partial: {report.partial}" if report.partial else verdict.reason
    return _verdict_exit(code, verdict.replayable and not report.partial, reason, output, keep_partial, name)


def _warn_mismatch(output: str, name: str) -> None:
    """It replays: the file is worth keeping; what differs is for the user to judge (tolerances)."""
    click.echo(
        f"{name}: warning: replaying {output} found a difference (run-replay --verify {output}; "
        "--tolerance compares floating-point buffers within their dtype's tolerance)",
        err=True,
    )


def _record_native(
    target: Target,
    args: tuple[str, ...],
    output: str,
    options: RecordOptions,
    *,
    overwrite: bool,
    keep_partial: bool,
    quiet: bool,
    self_check: SelfCheck | None,
    name: str,
) -> int:
    """A program that is not Python: a child process hosting the recorder (docs/INJECTION.md); its
    capture is then replayed and verified from here, as a Python program's is."""
    run = record_program(target, args, output, options, overwrite=overwrite)
    replayable, reason = run.replayable, run.reason
    if replayable and run.exit_code:  # the program failed while it was recorded: as a Python program's, partial
        replayable, reason = False, f"it is partial: the program exited with status {run.exit_code}"
    check = None
    if replayable and self_check is not None:
        check = replay_check(output, fixed_addresses=options.fixed_addresses, timeout_s=self_check.timeout_s)
        if check.outcome == Outcome.FAILED:
            replayable, reason = False, check.describe()
    if not quiet:
        for line in run.report_lines:  # the child's own verdict line gives way to the parent's replay
            if check is None or not line.strip().startswith("replayable:"):
                click.echo(line, err=True)
        if check is not None:
            click.echo(f"  replayable: {'yes' if replayable else 'no'} ({check.describe()})", err=True)
    for other in run.others:
        click.echo(f"{name}: not recorded: process {other}", err=True)
    # with no verdict the first error is the one line the tool exits with: printed once
    for error in run.errors[1:] if replayable is None else run.errors:
        click.echo(f"{name}: {error}", err=True)
    if replayable is None:  # the recorder never closed its file: what it left is no capture
        if not keep_partial:
            Path(output).unlink(missing_ok=True)
        raise ToolExit(EXIT_PROBLEM, f"error: {describe_failure(run, target.path)}")
    if check is not None and check.outcome == Outcome.MISMATCH:
        _warn_mismatch(output, name)
    return _verdict_exit(run.exit_code, replayable, reason, output, keep_partial, name)


def _verdict_exit(code: int, replayable: bool, reason: str, output: str, keep_partial: bool, name: str) -> int:
    """The program's status, or 1 (and OUTPUT removed unless --keep-partial) when the capture
    cannot be replayed."""
    if replayable:
        return code
    if keep_partial:
        click.echo(f"{name}: kept {output} although it cannot be replayed (--keep-partial): {reason}", err=True)
        return code
    Path(output).unlink(missing_ok=True)
    raise ToolExit(EXIT_PROBLEM, f"error: {output} cannot be replayed ({reason}); removed it (--keep-partial keeps it)")


def _release_cached_memory() -> None:
    """Let the self-check's replay have the device memory the program's framework only caches
    (PyTorch's allocator keeps freed blocks); what the program still holds it keeps."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            torch.cuda.empty_cache()
        except Exception:  # a torch without CUDA, or a broken context: the self-check then says so
            pass


if __name__ == "__main__":
    main()
