"""The recorder's self-check: the capture it just closed, replayed and verified in a child process.

A plan that accepts a capture does not prove it replays: a pointer stored in device memory that
was not relocated, a kernel that reads memory the capture never saw, fail only on the device. So
the recorder runs what ``run-replay --verify FILE`` runs, :func:`replayfmt.verbs.verify` with the
same options, in a child process (``python -m replayfmt.verbs``: the recorder's own process has
CUPTI subscribed and the program's context and memory, and a fault kills a CUDA context), and
reads back the child's :class:`~replayfmt.replay.verify_types.VerifyResult` (one JSON object in a
file): the same verdict ``run-replay --verify`` gives on the same file, by construction.

Bounded: the child gets ``timeout_s`` seconds; a capture larger than ``max_file_bytes``, or whose
buffers need more device memory than is free while the program still holds its own, is not
replayed, and the check says why (run-replay --verify it yourself then).
"""

from __future__ import annotations

import enum
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from replayfmt.errors import ReplayError
from replayfmt.replay.plan_options import PlanOptions
from replayfmt.replay.verify_types import Outcome as Verified, VerifyOptions, VerifyResult

_TAIL = 400  # characters of a failure kept in the verdict


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
            return (
                f"replayed; nothing verified: {self.detail or 'the capture holds no checkpoints or expected downloads'}"
            )
        if self.outcome == Outcome.MISMATCH:
            return f"replayed, but verification failed: {self.detail}"
        if self.outcome == Outcome.FAILED:
            return f"the replay failed: {self.detail}"
        return f"not replayed: {self.detail}"


def verify_options(*, fixed_addresses: bool) -> VerifyOptions:
    """The self-check's options: ``run-replay --verify``'s defaults (with ``--fixed-addresses``
    where the capture needs it)."""
    return VerifyOptions(plan=PlanOptions(fixed_addresses=fixed_addresses))


def replay_command(path: str | Path, options: Path, result: Path) -> list[str]:
    """The child: the verify verb, through the interpreter running the recorder."""
    return [sys.executable, "-m", "replayfmt.verbs", "verify", str(options), str(path), str(result)]


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
    with tempfile.TemporaryDirectory(prefix="replayfmt-self-check-") as folder:
        options, result = Path(folder) / "options.pickle", Path(folder) / "result.json"
        options.write_bytes(pickle.dumps(verify_options(fixed_addresses=fixed_addresses)))
        try:
            done = subprocess.run(
                replay_command(path, options, result),
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
            return ReplayCheck(Outcome.SKIPPED, detail=f"cannot start the replay: {exc}")
        seconds = time.monotonic() - started
        if not result.exists():  # the child died before it could say (a crash, a signal)
            tail = done.stderr.strip()[-_TAIL:] or f"the replay's process exited with status {done.returncode}"
            return ReplayCheck(Outcome.FAILED, detail=tail, seconds=seconds)
        try:
            verdict = VerifyResult.from_dict(json.loads(result.read_text()))
        except (ValueError, ReplayError) as exc:
            return ReplayCheck(Outcome.FAILED, detail=f"the replay's result is unreadable: {exc}"[:_TAIL])
    return check_of(verdict, seconds)


def check_of(result: VerifyResult, seconds: float = 0.0) -> ReplayCheck:
    """What the verify verb's result earns the recorder: its outcome, one to one (could not run
    here: skipped, since it says nothing of the capture)."""
    detail = result.detail[:_TAIL]
    if result.outcome is Verified.VERIFIED:
        return ReplayCheck(Outcome.VERIFIED, result.compared, seconds=seconds)
    if result.outcome is Verified.UNAVAILABLE:  # no device for another process, a driver refusal
        return ReplayCheck(Outcome.SKIPPED, detail=f"could not replay here: {detail}", seconds=seconds)
    if result.outcome in (Verified.MISMATCH, Verified.FAILED):
        return ReplayCheck(Outcome(result.outcome.value), detail=detail, seconds=seconds)
    return ReplayCheck(Outcome.NOTHING_TO_VERIFY, detail=detail, seconds=seconds)
