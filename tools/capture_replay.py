"""capture-replay (also ``python -m replayfmt.capture``): run a program and record its GPU work
into a .kreplay file, with no change to the program: a Python script in this process, any other
program (an ELF binary, a shell script) as a child through CUDA's injection entry point."""

from __future__ import annotations

from pathlib import Path

import click

from replayfmt.capture import CaptureMode, RecordOptions, SelfCheck
from replayfmt.capture.ranks import rank_output, this_rank
from replayfmt.cuda.address_space import restart_without_aslr
from replayfmt.format import model as m
from replayfmt.verbs import RunAndRecordOptions, run_and_record
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
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False),
    help="The .kreplay file to write; under a launcher (torchrun, mpirun, srun) each rank writes its own beside it "
    "(job.kreplay -> job.rank0.kreplay, job.rank1.kreplay, ...).",
)
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
    in a child process (what run-replay --verify runs, with its options: one verdict; bounded by
    --self-check-timeout and --self-check-max-gib, off with --no-self-check): `replayable: yes
    (replayed and verified: N ranges)`, or what failed. A capture that cannot be replayed, or
    that stopped on an error (the recorder's, or the program's while it was recorded: the file
    is marked partial), is removed and the exit status is 1 (--keep-partial keeps the file and
    exits 0); a replay whose verification finds a difference is reported and kept. The report
    also says what replay needs from this host.
    """
    output = str(rank_output(Path(output), this_rank()))  # one capture per rank under a launcher
    # before CUDA, CUPTI or the program start: a path that cannot take the capture is one line now
    check_new_file(Path(output), "-o", overwrite_flag="--overwrite", overwrite=overwrite)
    if fixed_addresses:
        restart_without_aslr()  # the driver's address range then lands where a replay finds it
    options = RunAndRecordOptions(
        recording=RecordOptions(
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
        ),
        overwrite=overwrite,
        keep_partial=keep_partial,
        self_check=None if no_self_check else SelfCheck(self_check_timeout, int(self_check_max_gib * (1 << 30))),
        report=not quiet,
    )
    name = invoked_name("capture-replay", (MODULE_NAME,))
    result = run_and_record(script, args, output, options, say=lambda line: click.echo(line, err=True), name=name)
    if result.program_error is not None:
        if result.error:
            click.echo(f"{name}: {result.error}", err=True)  # then the program's own error
        raise result.program_error
    if result.error:
        raise ToolExit(EXIT_PROBLEM, result.error)
    return result.exit_code


if __name__ == "__main__":
    main()
