"""run-replay: rebuild and execute a .kreplay capture on a CUDA device."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import click

from replayfmt.cuda.address_space import restart_without_aslr
from replayfmt.errors import ReplayUsageError, VerificationError
from replayfmt.execute import open_replay
from replayfmt.reader import Capture
from replayfmt.replay.options import ReplayOptions, dry_run_devices
from replayfmt.replay.verification import DEFAULT_REPLAYS, EvidencePolicy, Verification
from replayfmt_tools.common import (
    EXIT_OK,
    EXIT_PROBLEM,
    ToolExit,
    agents_md_option,
    check_output_directory,
    reports_errors,
)
from replayfmt_tools.options import parse_devices, plan_options, replay_options, tolerance, tolerance_options

EPILOG = """\b
Failure contract: replay is strict. An unsupported operation, a missing or changed file, an
executable whose ABI differs, a launch shape over a function's limits or a CUDA error stops the
replay with one line naming the operation index, object id, kernel and CUDA error; nothing is
skipped silently. --continue-on-error reports every failure it can and still exits non-zero.

\b
Verification (--verify, docs/VERIFY.md): each compared range is exact, within run-to-run
variation (judged per element against several replays, by dtype), or wrong; a range that starts as
it should end is replayed poisoned and reported as proven, unchanged by the region, or could not
be proven. "verified" needs at least one range compared with evidence and none wrong.

\b
Exit status: 0 replayed (and verified, with --verify); 1 the capture cannot be reproduced here,
verification found a wrong range, or nothing was compared or proven; 2 usage error, unreadable
capture, or no GPU/driver.

\b
Examples:
  run-replay --verify cap.kreplay
  run-replay --verify --format=json cap.kreplay | jq '.verification.ranges[] | select(.passed|not)'
  run-replay --verify --launch 9:skip cap.kreplay      # must fail: a kernel left out
  run-replay --dry-run --executable-substitution 5=new.cubin cap.kreplay
  run-replay --file-remap /old/models=/data/models --verify cap.kreplay
  run-replay --launch 42:grid=128,1,1,block=256 --repetitions 10 cap.kreplay
"""


@click.command(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("capture", type=click.Path(path_type=Path))
@replay_options
@click.option(
    "--verify",
    is_flag=True,
    help="Compare every checkpoint (and expected download) with the replay: by dtype, over several replays where "
    "the program is nondeterministic, with evidence (docs/VERIFY.md).",
)
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
    help="Run the capture N times (inputs restored each time); print each one's device time (the first run builds "
    "its steps as it goes, so its time may include waits for the host: time later runs, or use benchmark-replay).",
)
@click.option(
    "--nondeterminism-runs",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help=f"With --verify: when a range differs from the capture, replay until N replays in all (default "
    f"{DEFAULT_REPLAYS}) and judge each element against the replays' spread (docs/VERIFY.md); 1: judge the "
    "first replay alone. A program whose replays reproduce the capture pays for one replay.",
)
@click.option(
    "--evidence",
    type=click.Choice([p.value for p in EvidencePolicy]),
    default=None,
    help="With --verify: when the ranges that start as they are expected to end are replayed poisoned, to prove "
    "the region writes them. auto (default): when kernels were substituted, reshaped or skipped, or when nothing "
    "else was compared with evidence; always; never (such ranges then prove nothing).",
)
@click.option(
    "--format",
    "output_format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="json: one JSON object on stdout (device times, the verification report, errors) for scripts; the text "
    "lines go to stderr.",
)
@click.option("--continue-on-error", is_flag=True, help="Report every failure, then exit non-zero.")
@click.option(
    "--no-payload-checks",
    is_flag=True,
    help="Do not check payload frames against their hashes (faster uploads, and a --dry-run that reads no "
    "payload; a corrupted file then goes unseen).",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Parse, resolve files, load substitutions, check ABIs, read every payload the replay uses and check its "
    "hashes, plan; no GPU.",
)
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
    nondeterminism_runs: int | None,
    evidence: str | None,
    output_format: str,
    continue_on_error: bool,
    no_payload_checks: bool,
    dry_run: bool,
) -> int:
    """Rebuild a capture on a CUDA device and run it: buffers reallocated and pointers relocated,
    streams and events rebuilt so captured concurrency is kept, optionally verified against the
    capture's checkpoints."""
    if not verify:
        given = [flag for flag, on in (("--nondeterminism-runs", nondeterminism_runs), ("--evidence", evidence)) if on]
        if given:
            raise ReplayUsageError(f"{' and '.join(given)} only mean something with --verify; add --verify")
    if save_output is not None:
        check_output_directory(save_output, "--save-output")  # before any work, not after the replay
    if fixed_addresses and not dry_run:
        restart_without_aslr()  # recorded addresses are reachable only so (see address_space)
    as_json = output_format == "json"

    def say(line: str) -> None:
        click.echo(line, err=as_json)  # with --format=json stdout holds only the JSON object

    options = plan_options(
        substitutions=substitutions,
        remaps=remaps,
        launches=launches,
        fixed_addresses=fixed_addresses,
        continue_on_error=continue_on_error,
        verify_payloads=dry_run and not no_payload_checks,  # a replay checks them as it stages them
    )
    replay = ReplayOptions(
        devices=parse_devices(devices),
        verify=verify,
        tolerance=tolerance(use_tolerance=use_tolerance, rtol=rtol, atol=atol),
        save_output=save_output,
        continue_on_error=continue_on_error,
        nvtx=nvtx,
        check_payloads=not no_payload_checks,
        build_while_running=True,  # the verdict sooner: the device starts while the steps are built
    )
    verification = None
    # CUDA starts on the first device while the capture is read and planned (most captures use one)
    warm = () if dry_run else replay.devices[:1]
    with open_replay(capture, options, warm_devices=warm) as session:
        plan = session.plan
        for line in plan.describe():
            say(line)
        _say_recovered(session.capture, say)
        for warning in plan.warnings:
            say(f"warning       {warning}")
        problems = plan.problems
        for problem in problems:
            click.echo(f"run-replay: error: {problem}", err=True)
        if dry_run:
            device_problems, note = dry_run_devices(replay.devices, len(plan.devices))
            problems = problems + device_problems
            for problem in device_problems:
                click.echo(f"run-replay: error: {problem}", err=True)
            if note and devices:  # the ordinals asked for (the default cuda:0 goes without saying)
                say(f"devices       {note}")
            if no_payload_checks:
                say("payloads      contents not read (--no-payload-checks): a damaged payload goes unseen")
            say(f"dry run: plan {'has problems' if problems else 'OK'}; nothing was executed")
            if as_json:
                click.echo(json.dumps({"capture": str(capture), "dry_run": True, "problems": problems}, indent=2))
            return EXIT_PROBLEM if problems else EXIT_OK
        if problems:
            raise ToolExit(EXIT_PROBLEM, f"{len(problems)} problem(s); nothing was executed")
        replayer = session.start(replay)
        for k, gpu in enumerate(replayer.gpus):
            major, minor = gpu.compute_capability
            say(f"device        #{k + 1} on cuda:{gpu.ordinal} {gpu.name} sm_{major}{minor}")
        if replayer.staging.bytes:
            say(f"uploads       {replayer.staging.line()}")
        if verify:
            verification = Verification(
                plan,
                replays=nondeterminism_runs or DEFAULT_REPLAYS,
                evidence=EvidencePolicy(evidence or "auto"),
                tolerance=replay.tolerance,
            )
            verification.attach(replayer)
        result = replayer.run(repetitions)
        errors = list(result.errors)
        if verification is not None:
            verification.note_runs(result)
            errors += verification.finish(replayer)
    if verification is not None and verification.wants_reference and not errors:
        # which bytes the captured kernels write: a poisoned replay of the capture as recorded
        reference_plan = dataclasses.replace(options, substitutions=(), launch_overrides=())
        with open_replay(capture, reference_plan) as reference:
            replayer = reference.start(dataclasses.replace(replay, save_output=None))
            verification.apply_reference(verification.reference_written(replayer))
    for i, (ms, state_ms) in enumerate(zip(result.device_ms, result.state_ms, strict=True)):
        state = f" (starting state set apart: {state_ms:.3f} ms)" if plan.state else ""
        if i == 0 and result.built_while_running:
            state += " (steps built as it ran: may include waits for the host)"
        say(f"repetition {i + 1}: {ms:.3f} ms device time{state}")
    report = verification.report() if verification is not None else None
    if report is not None:
        for line in report.lines():
            say(line)
    for error in errors:
        click.echo(f"run-replay: error: {error}", err=True)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "capture": str(capture),
                    "device_ms": result.device_ms,
                    "state_ms": result.state_ms,
                    "built_while_running": result.built_while_running,  # device_ms[0] may include host waits
                    "verification": report.as_dict() if report is not None else None,
                    "errors": errors,
                },
                indent=2,
            )
        )
    if report is not None:
        say(report.summary())
        problem = report.problem()
        if problem is not None:
            raise VerificationError(f"verification: {problem}")
    if errors:
        raise ToolExit(EXIT_PROBLEM, f"{len(errors)} operation(s) failed")
    return EXIT_OK


def _say_recovered(cap: Capture, say: Callable[[str], None]) -> None:
    """Say that a file was recovered (a prefix of the capture replays; the plan says when that
    prefix holds no device work)."""
    if not cap.recovered:
        return
    kept = f"; only the {cap.operation_count} recovered operations replay" if cap.operation_count else ""
    say(
        f"recovered     yes: the file was not closed properly; {cap.discarded_bytes} bytes at its end were "
        f"discarded ({cap.recovery_reason}){kept}"
    )


if __name__ == "__main__":
    main()
