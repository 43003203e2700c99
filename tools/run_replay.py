"""run-replay: rebuild and execute a .kreplay capture on a CUDA device."""

from __future__ import annotations

from pathlib import Path

import click

from replayfmt.cuda.address_space import restart_without_aslr
from replayfmt.errors import VerificationError
from replayfmt.execute import open_replay
from replayfmt.reader import Capture
from replayfmt.replay.nondeterminism import NondeterminismTracker
from replayfmt.replay.options import ReplayOptions
from replayfmt_tools.common import EXIT_OK, EXIT_PROBLEM, ToolExit, agents_md_option, reports_errors
from replayfmt_tools.options import parse_devices, plan_options, replay_options, tolerance, tolerance_options

EPILOG = """\b
Failure contract: replay is strict. An unsupported operation, a missing or changed file, an
executable whose ABI differs, a launch shape over a function's limits or a CUDA error stops the
replay with one line naming the operation index, object id, kernel and CUDA error; nothing is
skipped silently. --continue-on-error reports every failure it can and still exits non-zero.

\b
Exit status: 0 replayed (and verified, with --verify); 1 the capture cannot be reproduced here,
or verification found a mismatch; 2 usage error, unreadable capture, or no GPU/driver.

\b
Examples:
  run-replay --verify cap.kreplay
  run-replay --dry-run --executable-substitution 5=new.cubin cap.kreplay
  run-replay --file-remap /old/models=/data/models --verify cap.kreplay
  run-replay --launch 42:grid=128,1,1,block=256 --repetitions 10 cap.kreplay
"""


@click.command(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("capture", type=click.Path(path_type=Path))
@replay_options
@click.option("--verify", is_flag=True, help="Compare every checkpoint (and expected download) with the replay.")
@tolerance_options
@click.option(
    "--save-output",
    type=click.Path(file_okay=False, path_type=Path),
    metavar="DIR",
    help="Write the replayed checkpoint buffers to DIR (.npy when the dtype is known).",
)
@click.option(
    "--repetitions",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Run the capture N times (inputs restored each time); print each one's device time.",
)
@click.option(
    "--nondeterminism-runs",
    type=click.IntRange(min=0),
    default=0,
    metavar="N",
    help="With --verify: replay N times (at least 2) and report bytes that differ between replays as "
    "nondeterministic, judging only the others. Default 0: replay once more only when a mismatch is found; "
    "1: never.",
)
@click.option("--continue-on-error", is_flag=True, help="Report every failure, then exit non-zero.")
@click.option(
    "--no-payload-checks",
    is_flag=True,
    help="Do not check payload frames against their hashes (faster uploads; a corrupted file then goes unseen).",
)
@click.option("--dry-run", is_flag=True, help="Parse, resolve files, load substitutions, check ABIs, plan; no GPU.")
@agents_md_option("run-replay")
@reports_errors("run-replay")
def main(
    capture: Path,
    devices: tuple[str, ...],
    substitutions: tuple[str, ...],
    remaps: tuple[str, ...],
    launches: tuple[str, ...],
    fixed_addresses: bool,
    nvtx: bool,
    verify: bool,
    use_tolerance: bool,
    rtol: float | None,
    atol: float | None,
    save_output: Path | None,
    repetitions: int,
    nondeterminism_runs: int,
    continue_on_error: bool,
    no_payload_checks: bool,
    dry_run: bool,
) -> int:
    """Rebuild a capture on a CUDA device and run it: buffers reallocated and pointers relocated,
    streams and events rebuilt so captured concurrency is kept, optionally verified against the
    capture's checkpoints."""
    if fixed_addresses and not dry_run:
        restart_without_aslr()  # recorded addresses are reachable only so (see address_space)
    options = plan_options(
        substitutions=substitutions,
        remaps=remaps,
        launches=launches,
        fixed_addresses=fixed_addresses,
        continue_on_error=continue_on_error,
    )
    replay = ReplayOptions(
        devices=parse_devices(devices),
        verify=verify,
        tolerance=tolerance(use_tolerance=use_tolerance, rtol=rtol, atol=atol),
        save_output=save_output,
        continue_on_error=continue_on_error,
        nvtx=nvtx,
        check_payloads=not no_payload_checks,
    )
    with open_replay(capture, options) as session:
        plan = session.plan
        for line in plan.describe():
            click.echo(line)
        _say_recovered(session.capture)
        for warning in plan.warnings:
            click.echo(f"warning       {warning}")
        problems = plan.problems
        for problem in problems:
            click.echo(f"run-replay: error: {problem}", err=True)
        if dry_run:
            click.echo(f"dry run: plan {'has problems' if problems else 'OK'}; nothing was executed")
            return EXIT_PROBLEM if problems else EXIT_OK
        if problems:
            raise ToolExit(EXIT_PROBLEM, f"{len(problems)} problem(s); nothing was executed")
        replayer = session.start(replay)
        for k, gpu in enumerate(replayer.gpus):
            major, minor = gpu.compute_capability
            click.echo(f"device        #{k + 1} on cuda:{gpu.ordinal} {gpu.name} sm_{major}{minor}")
        if replayer.staging.bytes:
            click.echo(f"uploads       {replayer.staging.line()}")
        tracker, more = None, None
        if verify and nondeterminism_runs >= 2:  # every replay's bytes are kept to compare them
            tracker = replayer.observer = NondeterminismTracker(replay.tolerance)
        result = replayer.run(repetitions)
        if verify and nondeterminism_runs == 0 and result.mismatches:
            tracker = replayer.observer = NondeterminismTracker(replay.tolerance)  # a mismatch: two replays more
            more = replayer.run(2)
        elif tracker is not None and nondeterminism_runs > repetitions:
            more = replayer.run(nondeterminism_runs - repetitions)
    for i, (ms, state_ms) in enumerate(zip(result.device_ms, result.state_ms, strict=True)):
        state = f" (starting state set apart: {state_ms:.3f} ms)" if plan.state else ""
        click.echo(f"repetition {i + 1}: {ms:.3f} ms device time{state}")
    errors = result.errors + (more.errors if more is not None else [])
    verdicts = tracker.verdicts() if tracker is not None and tracker.replays > 1 else None
    for report in result.reports:
        click.echo(report.line())
    if tracker is not None and verdicts is not None:  # judged again, bytes that differ between replays set apart
        click.echo(f"nondeterminism: {tracker.replays} replays compared with each other and with the capture")
        for verdict in verdicts:
            click.echo(verdict.line())
    for error in errors:
        click.echo(f"run-replay: error: {error}", err=True)
    if verify and not result.reports:
        click.echo("verify: the capture holds no checkpoints or expected downloads to compare")
    if verdicts is None:
        result.require_verified()
    else:
        failed = [v for v in verdicts if not v.passed]
        if failed:
            raise VerificationError(
                f"verification failed for {len(failed)} buffer range(s) outside their nondeterministic bytes; "
                f"first: {failed[0].line().strip()}"
            )
    if errors:
        raise ToolExit(EXIT_PROBLEM, f"{len(errors)} operation(s) failed")
    if verify and result.reports:
        apart = " (outside their nondeterministic bytes)" if verdicts is not None and result.mismatches else ""
        click.echo(f"verified: {len(result.reports)} buffer range(s) match{apart}")
    return EXIT_OK


def _say_recovered(cap: Capture) -> None:
    """Say that a file was recovered (a prefix of the capture replays; the plan says when that
    prefix holds no device work)."""
    if not cap.recovered:
        return
    kept = f"; only the {cap.operation_count} recovered operations replay" if cap.operation_count else ""
    click.echo(
        f"recovered     yes: the file was not closed properly; {cap.discarded_bytes} bytes at its end were "
        f"discarded ({cap.recovery_reason}){kept}"
    )


if __name__ == "__main__":
    main()
