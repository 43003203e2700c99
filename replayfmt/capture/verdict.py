"""The recorder's verdict on its own file: the checks run-replay's plan makes (with default
options; the replay side makes them, :func:`replayfmt.replay.replayable.check_closed`), run once
the capture is closed, so that no capture that cannot replay leaves the
recorder looking like a success; then, where asked, a replay of it (:mod:`self_check`): only a
replay earns ``replayable: yes (replayed and verified: N ranges)``. Also what the capture needs
from the host it was made on."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from replayfmt.capture.self_check import Outcome, ReplayCheck
from replayfmt.replay.replayable import check_closed


@dataclass
class CaptureVerdict:
    """``replayable``; otherwise ``reason`` is the first problem run-replay would refuse on."""

    replayable: bool
    reason: str = ""
    fixed_addresses: bool = False  # replayable with --fixed-addresses (the capture requires it)
    host_files: list[str] = field(default_factory=list)  # paths replay reads from the host
    device_bytes: int = 0  # device memory its buffers take on replay
    device_work: int = 0  # operations that run on a device
    replay: ReplayCheck | None = None  # the self-check's replay (None: not asked for)

    @property
    def replay_failed(self) -> bool:
        return self.replay is not None and self.replay.outcome == Outcome.FAILED

    def line(self) -> str:
        """``replayable: yes (replayed and verified: N ranges)``, ``replayable: yes (plan only: ...)``
        when no replay earned more, or ``replayable: no: <reason>``."""
        if not self.replayable:
            return f"replayable: no: {self.reason}"
        fixed = " with --fixed-addresses" if self.fixed_addresses else ""
        if self.replay is None:
            return f"replayable: yes (plan only{fixed}: not replayed)"
        if self.replay.outcome == Outcome.FAILED:
            return f"replayable: no: {self.replay.describe()}"
        if self.replay.outcome == Outcome.SKIPPED:
            return f"replayable: yes (plan only{fixed}: {self.replay.describe()})"
        return f"replayable: yes ({self.replay.describe()}{fixed})"

    def host_line(self) -> str:
        """What replay needs from the host: the referenced files, or nothing."""
        if not self.host_files:
            return "needs nothing from the host"
        return f"needs {len(self.host_files)} file(s) from the host: " + ", ".join(self.host_files)


def check_capture(path: str | Path, *, fixed_addresses: bool = False) -> CaptureVerdict:
    """The replay side's verdict on the closed capture at ``path`` (run-replay's plan; no GPU)."""
    closed = check_closed(path, fixed_addresses=fixed_addresses)
    if closed.problem:
        return CaptureVerdict(False, closed.problem)
    return CaptureVerdict(
        True,
        fixed_addresses=closed.fixed_addresses,
        host_files=list(closed.host_files),
        device_bytes=closed.device_bytes,
        device_work=closed.device_work,
    )


def without_child_work(verdict: CaptureVerdict, children: list[str]) -> CaptureVerdict:
    """The verdict on a capture whose program's GPU work ran in child processes this recorder did
    not record: a capture with no device work of its own is not replayable, whatever its plan
    says (it would replay nothing and call that a success)."""
    if not children or not verdict.replayable or verdict.device_work:
        return verdict
    reason = (
        f"it holds none of the program's GPU work: {len(children)} child process(es) used CUDA and were not "
        f"recorded (process {children[0]}); record inside each (torchrun ... -m replayfmt.capture -o X)"
    )
    return CaptureVerdict(False, reason)
