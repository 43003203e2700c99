"""The verify verb: replay a capture and judge what it computed (``run-replay --verify``, and the
recorder's self-check in a child process, both call :func:`verify`).

The sequence: open and plan (no GPU); refuse a plan with problems; start the Replayer (CUDA
starting on the first device while the capture is read and planned); attach a
:class:`~replayfmt.replay.verification.Verification`; run; where the verification asks, replay the
capture as recorded (no substitution, no reshaped launch) to learn which bytes its kernels write;
then the verdict. A verification that cannot start (an unreadable file, no device, an executable
that does not load) raises the ReplayError that says so; :meth:`VerifyResult.from_error` turns it
into a result where a caller needs one (the self-check's child).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable

from replayfmt.execute import open_replay
from replayfmt.format import model as m
from replayfmt.reader import Capture
from replayfmt.replay.collectives import cuda_gpu_count, local_peers
from replayfmt.replay.launches import programmatic_note
from replayfmt.replay.options import ReplayOptions, dry_run_devices
from replayfmt.replay.verification import Verification
from replayfmt.replay.verify_types import Outcome, VerifyOptions, VerifyResult

Progress = Callable[[str], None]  # receives each line of what the replay is doing, as it happens


def _quiet(_line: str) -> None:
    return None


def replay_options(options: VerifyOptions) -> ReplayOptions:
    """The Replayer's options for a verification (the verdict sooner: the device starts while the
    first run's steps are built)."""
    return ReplayOptions(
        devices=options.devices,
        verify=options.verify,
        tolerance=options.tolerance,
        save_output=options.save_output,
        continue_on_error=options.plan.continue_on_error,
        nvtx=options.nvtx,
        check_payloads=options.check_payloads,
        build_while_running=True,
        peers=options.peers,
    )


def with_local_peers(
    capture: Capture, devices: int, replay: ReplayOptions, collectives: int
) -> tuple[ReplayOptions, str]:
    """A capture that holds several ranks of a communicator (a process that drove several devices):
    its collectives issued among those ranks in this process where each has a GPU of its own and
    NCCL loads, else each one's received bytes put in place; and the line that says which.
    ``collectives``: the plan's count of them (none: the operations are not read again)."""
    if replay.peers is not None or devices < 2 or not collectives:
        return replay, ""
    peers, note = local_peers(capture, devices, replay.devices, gpu_count=cuda_gpu_count)
    return (replay if peers is None else dataclasses.replace(replay, peers=peers)), note


def verify(
    path: str | os.PathLike[str], options: VerifyOptions | None = None, *, progress: Progress | None = None
) -> VerifyResult:
    """Replay the capture at ``path`` as ``options`` ask and judge it (``options.verify``).

    ``progress`` receives the plan's description, warnings, devices and uploads as they are known,
    then each repetition's time and the verification's detail: the lines ``run-replay`` prints.
    Raises ReplayError (and kin) when the replay cannot start; the outcome says the rest."""
    options = options or VerifyOptions()
    say = progress or _quiet
    capture = os.fspath(path)
    replay = replay_options(options)
    plan_options = options.plan
    if options.dry_run and options.check_payloads:  # read every payload the replay reads, check its hashes
        plan_options = dataclasses.replace(plan_options, verify_payloads=True)
    warm = () if options.dry_run else replay.devices[:1]
    verification: Verification | None = None
    started = time.perf_counter()
    with open_replay(path, plan_options, warm_devices=warm, limits=options.limits) as session:
        plan = session.plan
        operations = session.capture.operation_count
        for line in plan.describe():
            say(line)
        _say_recovered(session.capture, say)
        for warning in plan.warnings:
            say(f"warning       {warning}")
        problems = tuple(plan.problems)
        if options.dry_run:  # what can be told of --device without opening one
            device_problems, note = dry_run_devices(options.devices, len(plan.devices))
            problems += tuple(device_problems)
            if note and options.devices != (0,):
                say(f"devices       {note}")
            if not options.check_payloads:
                say("payloads      contents not read (--no-payload-checks): a damaged payload goes unseen")
        if options.dry_run or problems:
            if options.dry_run:
                say(f"dry run: plan {'has problems' if problems else 'OK'}; nothing was executed")
            outcome = Outcome.FAILED if problems else Outcome.PLANNED
            detail = problems[0] if problems else ""
            setup_s = time.perf_counter() - started
            return VerifyResult(
                capture, outcome, detail=detail, problems=problems, operations=operations, setup_s=setup_s
            )
        collectives = plan.operation_counts.get(m.OperationKind.COLLECTIVE.label, 0)
        replay, note = with_local_peers(session.capture, len(plan.devices), replay, collectives)
        if note:
            say(f"collectives   {note}")
        replayer = session.start(replay)
        setup_s = time.perf_counter() - started
        for k, gpu in enumerate(replayer.gpus):
            major, minor = gpu.compute_capability
            note = programmatic_note(plan, gpu.arch)
            say(
                f"device        #{k + 1} on cuda:{gpu.ordinal} {gpu.name} sm_{major}{minor}"
                + (f" ({note})" if note else "")
            )
        if replayer.staging.bytes:
            say(f"uploads       {replayer.staging.line()}")
        if options.verify:
            verification = Verification(
                plan, replays=options.replays, evidence=options.evidence, tolerance=options.tolerance
            )
            verification.attach(replayer)
        result = replayer.run(options.repetitions)
        errors = list(result.errors)
        timed_ms: list[float] = []
        if options.timed_runs and not errors:  # every rank makes these runs alike: among the peers
            timed = replayer.run(options.timed_runs, verify=False)
            errors += timed.errors
            timed_ms = timed.device_ms
        if verification is not None:
            verification.note_runs(result)
            replayer.collectives.live = False  # its own replays, as many as its ranges need: alone
            errors += verification.finish(replayer)
    if verification is not None and verification.wants_reference and not errors:
        # which bytes the captured kernels write: a poisoned replay of the capture as recorded
        reference_plan = dataclasses.replace(plan_options, substitutions=(), launch_overrides=())
        with open_replay(path, reference_plan, limits=options.limits) as reference:
            replayer = reference.start(dataclasses.replace(replay, save_output=None, peers=None))  # alone
            verification.apply_reference(verification.reference_written(replayer))
    for i, (ms, state_ms) in enumerate(zip(result.device_ms, result.state_ms, strict=True)):
        state = f" (starting state set apart: {state_ms:.3f} ms)" if plan.state else ""
        if i == 0 and result.built_while_running:
            state += " (steps built as it ran: may include waits for the host)"
        say(f"repetition {i + 1}: {ms:.3f} ms device time{state}")
    report = verification.report() if verification is not None else None
    if errors:  # an operation failed: whatever verification then says, the replay did not run through
        outcome, detail = Outcome.FAILED, errors[0]
    elif report is None:
        outcome, detail = Outcome.REPLAYED, ""
    elif (problem := report.problem()) is None:
        outcome, detail = Outcome.VERIFIED, ""
    elif report.failed:
        outcome, detail = Outcome.MISMATCH, problem
    else:  # nothing compared, or nothing proven
        outcome, detail = Outcome.NOTHING_TO_VERIFY, problem
    return VerifyResult(
        capture,
        outcome,
        detail=detail,
        errors=tuple(errors),
        device_ms=tuple(result.device_ms),
        state_ms=tuple(result.state_ms),
        built_while_running=result.built_while_running,
        timed_ms=tuple(timed_ms),
        operations=operations,
        setup_s=setup_s,
        compared=report.compared if report is not None else 0,
        summary=report.summary() if report is not None else "",
        report_lines=tuple(report.lines()) if report is not None else (),
        report=report.as_dict() if report is not None else None,
        released=dict(plan.host_waits),
    )


def _say_recovered(cap: Capture, say: Progress) -> None:
    """Say that a file was recovered (a prefix of the capture replays; the plan says when that
    prefix holds no device work)."""
    if not cap.recovered:
        return
    kept = f"; only the {cap.operation_count} recovered operations replay" if cap.operation_count else ""
    say(
        f"recovered     yes: the file was not closed properly; {cap.discarded_bytes} bytes at its end were "
        f"discarded ({cap.recovery_reason}){kept}"
    )
