"""run-replay: rebuild and execute a .kreplay capture on a CUDA device."""

from __future__ import annotations

import json
from pathlib import Path

import click

from replayfmt.cuda.address_space import restart_without_aslr
from replayfmt.errors import ReplayUsageError, VerificationError
from replayfmt.format.layout import Limits
from replayfmt.replay.verify_types import DEFAULT_REPLAYS
from replayfmt.verbs import (
    EvidencePolicy,
    RanksOptions,
    RanksResult,
    VerifyOptions,
    VerifyResult,
    verify as run_verify,
    verify_ranks,
)
from replayfmt_tools.common import (
    EXIT_OK,
    EXIT_PROBLEM,
    ToolExit,
    agents_md_option,
    check_output_directory,
    reports_errors,
)
from replayfmt_tools.options import (
    limit_option,
    parse_devices,
    parse_planted,
    plan_options,
    replay_options,
    tolerance,
    tolerance_options,
)

EPILOG = """\b
Failure contract: replay is strict. An unsupported operation, a missing or changed file, an
executable whose ABI differs, a GPU that none of an executable's cubins or PTX can run on (the
executables are named), a launch shape over a function's limits or a CUDA error stops the
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
  run-replay --jit-from-ptx --verify cap.kreplay    # the path a GPU newer than the cubins takes
  run-replay --file-remap /old/models=/data/models --verify cap.kreplay
  run-replay --launch 42:grid=128,1,1,block=256 --repetitions 10 cap.kreplay
  run-replay --verify job.rank0.kreplay job.rank1.kreplay   # the ranks together, NCCL among them
  run-replay --verify --collective-reduction 57=max job.rank*.kreplay   # must fail: a wrong reduction
  run-replay --verify job.rank1.kreplay     # one rank alone: what it received put in place
"""


@click.command(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("captures", metavar="CAPTURE...", nargs=-1, required=True, type=click.Path(path_type=Path))
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
    "the region writes them. auto (default): when kernels were substituted, reshaped or skipped, when nothing "
    "else was compared with evidence, or when a range that held none of the program's data at the region's start "
    "(a dropped result) is compared; always; never (such ranges then prove nothing).",
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
    "--jit-from-ptx",
    is_flag=True,
    help="Load every executable from its PTX (the driver JIT-compiles it, as on a GPU no cubin is for), never a "
    "cubin; refused, naming them, when executables hold no PTX (dump-replay shows each one's targets).",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Parse, resolve files, load substitutions, check ABIs, read every payload the replay uses and check its "
    "hashes, plan; no GPU.",
)
@click.option(
    "--collective-reduction",
    "planted",
    multiple=True,
    metavar="OP=REDUCTION",
    help="With every rank's capture, or one capture holding several ranks (one process on several devices): issue "
    "collective OP of the first capture (and its counterpart in each other rank) with another reduction (sum, prod, "
    "max, min, avg): a planted wrong collective, which --verify must catch.",
)
@limit_option
@agents_md_option("run-replay")
@reports_errors("run-replay")
def main(
    captures: tuple[Path, ...],
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
    jit_from_ptx: bool,
    dry_run: bool,
    planted: tuple[str, ...],
    limits: Limits,
) -> int:
    """Rebuild a capture on a CUDA device and run it: buffers reallocated and pointers relocated,
    streams and events rebuilt so captured concurrency is kept, optionally verified against the
    capture's checkpoints. Given every rank's capture of a job (job.rank0.kreplay job.rank1.kreplay
    ...), the ranks replay together, one process and one GPU each, their collectives among them; a capture
    that holds several ranks (one process on several devices) replays them in one process, a GPU each."""
    if not verify:
        given = [flag for flag, on in (("--nondeterminism-runs", nondeterminism_runs), ("--evidence", evidence)) if on]
        if given:
            raise ReplayUsageError(f"{' and '.join(given)} only mean something with --verify; add --verify")
    if save_output is not None:
        check_output_directory(save_output, "--save-output")  # before any work, not after the replay
    options = VerifyOptions(
        plan=plan_options(
            substitutions=substitutions,
            remaps=remaps,
            launches=launches,
            fixed_addresses=fixed_addresses,
            continue_on_error=continue_on_error,
            jit_from_ptx=jit_from_ptx,
        ),
        verify=verify,
        devices=parse_devices(devices)[:1] if len(captures) > 1 else parse_devices(devices),
        tolerance=tolerance(use_tolerance=use_tolerance, rtol=rtol, atol=atol),
        replays=nondeterminism_runs or DEFAULT_REPLAYS,
        evidence=EvidencePolicy(evidence or "auto"),
        repetitions=repetitions,
        save_output=save_output,
        nvtx=nvtx,
        check_payloads=not no_payload_checks,
        dry_run=dry_run,
        limits=limits,
    )
    if fixed_addresses and not dry_run:
        restart_without_aslr()  # recorded addresses are reachable only so (see address_space)
    as_json = output_format == "json"
    if len(captures) > 1 or planted:  # the ranks of one job, together
        ranks = RanksOptions(options, parse_devices(devices) if devices else (), parse_planted(planted))
        return _print_ranks(verify_ranks(captures, ranks, progress=_rank_line), as_json=as_json)
    # with --format=json stdout holds only the JSON object
    result = run_verify(captures[0], options, progress=lambda line: click.echo(line, err=as_json))
    return _print_result(result, dry_run=dry_run, as_json=as_json)


def _rank_line(rank: int, line: str) -> None:
    click.echo(f"[rank {rank}] {line}", err=True)


def _print_ranks(result: RanksResult, *, as_json: bool) -> int:
    """Each rank's verdict, then the job's; the exit status (the worst rank's)."""
    for r in result.ranks:
        rank = r.capture.rank
        for line in r.result.report_lines:
            click.echo(f"[rank {rank}] {line}", err=True)
        summary = f" ({r.result.summary})" if r.result.summary else ""
        on = f"{r.capture.devices} GPUs from cuda:{r.device}" if r.capture.held else f"cuda:{r.device}"
        click.echo(f"{r.capture.label} on {on}: {r.result.outcome.value}{summary}", err=as_json)
        if r.result.detail:
            click.echo(f"  {r.result.detail}", err=as_json)
    if as_json:
        click.echo(json.dumps({"outcome": result.outcome.value, "ranks": [r.result.to_dict() for r in result.ranks]}))
    click.echo(f"ranks: {result.outcome.value} ({len(result.ranks)} ranks, {result.collectives} collectives)")
    return result.exit_code


def _print_result(result: VerifyResult, *, dry_run: bool, as_json: bool) -> int:
    """What run-replay says after the replay: the verification's detail, errors, the JSON object,
    the verdict line; the exit status (a failure raises, naming it)."""
    for problem in result.problems:
        click.echo(f"run-replay: error: {problem}", err=True)
    if dry_run:
        if as_json:
            dry = {"capture": result.capture, "dry_run": True, "problems": list(result.problems)}
            click.echo(json.dumps(dry, indent=2))
        return result.exit_code
    if result.problems:
        raise ToolExit(EXIT_PROBLEM, f"{len(result.problems)} problem(s); nothing was executed")
    for line in result.report_lines:
        click.echo(line, err=as_json)
    for error in result.errors:
        click.echo(f"run-replay: error: {error}", err=True)
    if as_json:
        out = result.to_dict()
        keys = (
            "capture",
            "outcome",
            "detail",
            "device_ms",
            "state_ms",
            "built_while_running",
            "verification",
            "released",
            "errors",
        )
        click.echo(json.dumps({key: out[key] for key in keys}, indent=2))
    if result.report is not None:
        click.echo(result.summary, err=as_json)
        problem = result.report["problem"]
        if problem is not None:
            raise VerificationError(f"verification: {problem}")
    if result.errors:
        raise ToolExit(EXIT_PROBLEM, f"{len(result.errors)} operation(s) failed")
    return EXIT_OK


if __name__ == "__main__":
    main()
