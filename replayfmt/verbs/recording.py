"""The record verb: run a program, record its GPU work, judge the file and keep or remove it
(``capture-replay`` calls :func:`run_and_record`).

A Python script runs in this process under a :class:`~replayfmt.capture.Recorder`; any other
program (an ELF binary, a shell script) runs as a child whose CUDA injection entry point hosts the
same recorder (docs/INJECTION.md). Either way the closed file gets the replay side's verdict and,
unless asked not to, the self-check (the verify verb in a child process). The policy: a capture
that cannot be replayed, or that stopped on an error (the recorder's, or the program's while it
was recorded: the file is partial), is removed and the status is 1 unless ``keep_partial``; a
replay whose verification finds a difference is kept, with a warning.
"""

from __future__ import annotations

import gc
import os
import runpy
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from replayfmt.capture.injection import Target, TargetKind, classify, describe_failure, record_program
from replayfmt.capture.options import CaptureMode, RecordOptions
from replayfmt.capture.profilers import conflict_line
from replayfmt.capture.recorder import Recorder, SelfCheck
from replayfmt.capture.report import Report
from replayfmt.capture.self_check import Outcome, replay_check

Say = Callable[[str], None]  # a line for the user, as it is known


@dataclass(frozen=True)
class RunAndRecordOptions:
    """What :func:`run_and_record` is asked; the defaults are ``capture-replay -o OUTPUT PROGRAM``'s."""

    recording: RecordOptions = field(default_factory=RecordOptions)  # what is recorded, and how
    overwrite: bool = False  # replace OUTPUT if it exists
    keep_partial: bool = False  # keep a file that cannot be replayed, and give the program's own status
    self_check: SelfCheck | None = field(default_factory=SelfCheck)  # None: the plan's checks only
    report: bool = True  # say the recorder's report at the end


@dataclass(frozen=True)
class RecordResult:
    """What recording a program came to. ``exit_code``: the program's status, or 1 when the file
    cannot be replayed (and was removed unless kept); ``error``: then why, in one line."""

    output: str
    exit_code: int
    kept: bool  # OUTPUT is on disk
    replayable: bool | None  # the verdict (None: the recorder never closed its file)
    error: str = ""
    # the Python program's own exception, raised again by the caller once the verdict is said
    program_error: BaseException | None = field(default=None, compare=False)


class _Notes:
    """Lines for the user: the report's as they are, the tool's own prefixed by ``name``."""

    def __init__(self, say: Say, name: str) -> None:
        self.say, self.name = say, name

    def note(self, line: str) -> None:
        self.say(f"{self.name}: {line}")


def run_and_record(
    program: str,
    args: tuple[str, ...],
    output: str | os.PathLike[str],
    options: RunAndRecordOptions | None = None,
    *,
    say: Say | None = None,
    name: str = "capture-replay",
) -> RecordResult:
    """Run ``program`` with ``args``, record its GPU work into ``output``, judge and self-check the
    file, then keep or remove it. ``say`` receives the report's lines and the notes (each of those
    begins with ``name``). ``--fixed-addresses`` needs address randomisation off before CUDA
    starts: the caller restarts the process so (``cuda.address_space.restart_without_aslr``)."""
    options = options or RunAndRecordOptions()
    notes = _Notes(say or (lambda _line: None), name)
    output = os.fspath(output)
    target = classify(program)
    if target.kind == TargetKind.NATIVE:
        return _record_native(target, args, output, options, notes)
    return _record_python(program, args, output, options, notes)


def _record_python(
    script: str, args: tuple[str, ...], output: str, options: RunAndRecordOptions, notes: _Notes
) -> RecordResult:
    recording = options.recording
    recorder = Recorder(output, recording, overwrite=options.overwrite, command_line=(script, *args))
    if recording.mode == CaptureMode.REGION and not recording.region_scopes:
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
            notes.say(str(exc.code))
            failure += f" ({exc.code})"
    except BaseException as exc:  # the program's own error: the capture is partial; the caller raises it
        failure, error = f"it raised {type(exc).__name__}: {exc}", exc
        conflict = conflict_line(exc) if isinstance(exc, Exception) else None  # a CUPTI conflict is said first
    report = recorder.close(program_failed=failure)
    namespace.clear()
    verdict = report.verdict
    if options.self_check is not None and verdict is not None and verdict.replayable and not report.partial:
        _release_cached_memory()
        recorder.self_check(options.self_check)
    if options.report:
        for line in report.lines():
            notes.say(line)
    if conflict:
        notes.note(conflict)
    result = _outcome(report, output, code, options.keep_partial, notes)
    if error is not None:
        return RecordResult(output, result.exit_code, result.kept, result.replayable, result.error, error)
    return result


def _outcome(report: Report, output: str, code: int, keep_partial: bool, notes: _Notes) -> RecordResult:
    """Keep or remove OUTPUT after the verdict."""
    verdict = report.verdict
    if verdict is not None and verdict.replay is not None and verdict.replay.outcome == Outcome.MISMATCH:
        _warn_mismatch(output, notes)
    if verdict is None:
        return RecordResult(output, code, Path(output).exists(), None)
    reason = f"it is partial: {report.partial}" if report.partial else verdict.reason
    return _keep_or_remove(code, verdict.replayable and not report.partial, reason, output, keep_partial, notes)


def _warn_mismatch(output: str, notes: _Notes) -> None:
    """It replays: the file is worth keeping; what differs is for the user to judge (tolerances)."""
    notes.note(
        f"warning: replaying {output} found a difference (run-replay --verify {output}; "
        "--tolerance compares floating-point buffers within their dtype's tolerance)"
    )


def _record_native(
    target: Target, args: tuple[str, ...], output: str, options: RunAndRecordOptions, notes: _Notes
) -> RecordResult:
    """A program that is not Python: a child process hosting the recorder (docs/INJECTION.md); its
    capture is then replayed and verified from here, as a Python program's is."""
    run = record_program(target, args, output, options.recording, overwrite=options.overwrite)
    replayable, reason = run.replayable, run.reason
    if replayable and run.exit_code:  # the program failed while it was recorded: as a Python program's, partial
        replayable, reason = False, f"it is partial: the program exited with status {run.exit_code}"
    check = None
    if replayable and options.self_check is not None:
        fixed = options.recording.fixed_addresses
        check = replay_check(output, fixed_addresses=fixed, timeout_s=options.self_check.timeout_s)
        if check.outcome == Outcome.FAILED:
            replayable, reason = False, check.describe()
    if options.report:
        for line in run.report_lines:  # the child's own verdict line gives way to the parent's replay
            if check is None or not line.strip().startswith("replayable:"):
                notes.say(line)
        if check is not None:
            notes.say(f"  replayable: {'yes' if replayable else 'no'} ({check.describe()})")
    for other in run.others:
        notes.note(f"not recorded: process {other}")
    # with no verdict the first error is the one line the tool exits with: said once
    for error in run.errors[1:] if replayable is None else run.errors:
        notes.note(error)
    if replayable is None:  # the recorder never closed its file: what it left is no capture
        if not options.keep_partial:
            Path(output).unlink(missing_ok=True)
        return RecordResult(
            output, 1, Path(output).exists(), None, error=f"error: {describe_failure(run, target.path)}"
        )
    if check is not None and check.outcome == Outcome.MISMATCH:
        _warn_mismatch(output, notes)
    return _keep_or_remove(run.exit_code, replayable, reason, output, options.keep_partial, notes)


def _keep_or_remove(
    code: int, replayable: bool, reason: str, output: str, keep_partial: bool, notes: _Notes
) -> RecordResult:
    """The program's status, or 1 (and OUTPUT removed unless ``keep_partial``) when the capture
    cannot be replayed."""
    if replayable:
        return RecordResult(output, code, True, True)
    if keep_partial:
        notes.note(f"kept {output} although it cannot be replayed (--keep-partial): {reason}")
        return RecordResult(output, code, True, False)
    Path(output).unlink(missing_ok=True)
    why = f"error: {output} cannot be replayed ({reason}); removed it (--keep-partial keeps it)"
    return RecordResult(output, 1, False, False, error=why)


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
