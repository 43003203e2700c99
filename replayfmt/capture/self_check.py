"""The recorder's self-check: the capture it just closed, replayed and verified in a child process.

A plan that accepts a capture does not prove it replays: a pointer stored in device memory that
was not relocated, a kernel that reads memory the capture never saw, fail only on the device. So
the recorder runs what a user would run, ``run-replay --verify FILE``, in a child process (the
recorder's own process has CUPTI subscribed and the program's context and memory), and reports
what it earned: the ranges verified, or what failed.

Bounded: the child gets ``timeout_s`` seconds; a capture larger than ``max_file_bytes``, or whose
buffers need more device memory than is free while the program still holds its own, is not
replayed, and the check says why (run-replay --verify it yourself then).
"""

from __future__ import annotations

import enum
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

_TAIL = 400  # characters of a failure kept in the verdict
_ENVIRONMENT = 2  # run-replay's exit status for usage, format and environment errors (no GPU, no driver)
_OPERATION_FAILED = re.compile(r"operation \d+|operation\(s\) failed|Traceback")


class Outcome(enum.Enum):
    VERIFIED = "verified"  # replayed, and N > 0 ranges compared equal
    NOTHING_TO_VERIFY = "nothing to verify"  # replayed; the capture holds nothing to compare
    MISMATCH = "mismatch"  # replayed; verification found a difference
    FAILED = "failed"  # the replay failed (a CUDA error, a refusal)
    SKIPPED = "skipped"  # not replayed: too large, too slow, or no device memory to spare


@dataclass(frozen=True)
class ReplayCheck:
    """What the child replay earned."""

    outcome: Outcome
    ranges: int = 0  # ranges verified (VERIFIED)
    detail: str = ""  # why it failed or was skipped
    seconds: float = 0.0

    def describe(self) -> str:
        """The parenthesised part of the recorder's ``replayable`` line."""
        if self.outcome == Outcome.VERIFIED:
            return f"replayed and verified: {self.ranges} ranges"
        if self.outcome == Outcome.NOTHING_TO_VERIFY and self.detail.startswith("nothing was proven"):
            # the capture holds checkpoints, of bytes the region never changed: say that, not "none"
            return f"replayed; nothing verified: {self.detail}"
        if self.outcome == Outcome.NOTHING_TO_VERIFY:
            return "replayed; nothing verified: the capture holds no checkpoints or expected downloads"
        if self.outcome == Outcome.MISMATCH:
            return f"replayed, but verification failed: {self.detail}"
        if self.outcome == Outcome.FAILED:
            return f"the replay failed: {self.detail}"
        return f"not replayed: {self.detail}"


def replay_command(path: str | Path, *, fixed_addresses: bool) -> list[str]:
    """The child: run-replay --verify, through the interpreter running the recorder."""
    command = [sys.executable, "-m", "replayfmt_tools.run_replay", "--verify"]
    if fixed_addresses:
        command.append("--fixed-addresses")
    return [*command, str(path)]


def skip_reason(path: str | Path, *, device_bytes: int, free_bytes: int | None, max_file_bytes: int) -> str:
    """Why the capture at ``path`` is not replayed now ("" when it is)."""
    size = os.path.getsize(path)
    if size > max_file_bytes:
        return (
            f"the file holds {size / 2**30:.1f} GiB, over the self-check's {max_file_bytes / 2**30:.1f} GiB "
            "(--self-check-max-gib); run-replay --verify it"
        )
    if free_bytes is not None and device_bytes > free_bytes:
        return (
            f"its buffers need {device_bytes / 2**30:.2f} GiB of device memory and {free_bytes / 2**30:.2f} GiB are "
            "free while the program holds its own; run-replay --verify it"
        )
    return ""


def replay_check(path: str | Path, *, fixed_addresses: bool, timeout_s: float) -> ReplayCheck:
    """Replay and verify ``path`` in a child process, within ``timeout_s`` seconds."""
    started = time.monotonic()
    try:
        done = subprocess.run(
            replay_command(path, fixed_addresses=fixed_addresses),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired:
        why = f"the replay ran past the self-check's {timeout_s:g} s (--self-check-timeout); run-replay --verify it"
        return ReplayCheck(Outcome.SKIPPED, detail=why, seconds=time.monotonic() - started)
    except OSError as exc:
        return ReplayCheck(Outcome.SKIPPED, detail=f"cannot start run-replay: {exc}")
    return judge(done.returncode, done.stdout, done.stderr, time.monotonic() - started)


def judge(returncode: int, stdout: str, stderr: str, seconds: float = 0.0) -> ReplayCheck:
    """What run-replay --verify's exit status and output say."""
    verified = [line for line in stdout.splitlines() if line.startswith("verified: ")]
    if returncode == 0 and verified:
        ranges = int(verified[-1].split()[1])
        return ReplayCheck(Outcome.VERIFIED, ranges, seconds=seconds)
    failed = [line for line in stderr.splitlines() if "error:" in line and _OPERATION_FAILED.search(line)]
    if failed:  # an operation failed: whatever verification then says, the replay did not run through
        detail = failed[0].split("error:", 1)[1].strip()
        return ReplayCheck(Outcome.FAILED, detail=detail[:_TAIL], seconds=seconds)
    # run-replay --verify's verdict line on failure (docs/VERIFY.md): "verification: <problem>"
    problem = next(
        (
            line.split("error: verification:", 1)[1].strip()
            for line in stderr.splitlines()
            if "error: verification:" in line
        ),
        "",
    )
    if problem.startswith(("nothing was compared", "nothing was proven")):
        return ReplayCheck(Outcome.NOTHING_TO_VERIFY, detail=problem[:_TAIL], seconds=seconds)
    if problem:  # it replayed; what it computed differs (judged per element against several replays)
        return ReplayCheck(Outcome.MISMATCH, detail=problem[:_TAIL], seconds=seconds)
    nothing = "the capture holds no checkpoints or expected downloads" in stdout
    # run-replay says so (and exits 1 where nothing compared is a failure of --verify): not a failed replay
    if nothing and ": MISMATCH " not in stdout and not _OPERATION_FAILED.search(stderr):
        return ReplayCheck(Outcome.NOTHING_TO_VERIFY, seconds=seconds)
    errors = [line for line in stderr.splitlines() if "error:" in line]
    detail = (errors[-1].split("error:", 1)[1].strip() if errors else stderr.strip()[-_TAIL:]) or (
        f"run-replay exited with status {returncode}"
    )
    mismatch = [line.strip() for line in stdout.splitlines() if ": MISMATCH " in line]
    if mismatch or "verification failed" in stderr:
        return ReplayCheck(Outcome.MISMATCH, detail=(mismatch[0] if mismatch else detail)[:_TAIL], seconds=seconds)
    if returncode == 0:  # replayed, no verified line: nothing compared
        return ReplayCheck(Outcome.NOTHING_TO_VERIFY, seconds=seconds)
    if returncode == _ENVIRONMENT:  # no device for another process, a driver refusal: says nothing of the capture
        return ReplayCheck(Outcome.SKIPPED, detail=f"run-replay could not run here: {detail[:_TAIL]}", seconds=seconds)
    return ReplayCheck(Outcome.FAILED, detail=detail[:_TAIL], seconds=seconds)
