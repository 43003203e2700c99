"""The recorder's verdict on its own file: the checks run-replay's plan makes (with default
options), run once the capture is closed, so that no capture that cannot replay leaves the
recorder looking like a success; then, where asked, a replay of it (:mod:`self_check`): only a
replay earns ``replayable: yes (replayed and verified: N ranges)``. Also what the capture needs
from the host it was made on."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from replayfmt.capture.self_check import Outcome, ReplayCheck
from replayfmt.errors import ReplayError
from replayfmt.format import model as m
from replayfmt.reader import open_capture
from replayfmt.replay.plan import PlanOptions, build_plan


@dataclass
class CaptureVerdict:
    """``replayable``; otherwise ``reason`` is the first problem run-replay would refuse on."""

    replayable: bool
    reason: str = ""
    fixed_addresses: bool = False  # replayable with --fixed-addresses (the capture requires it)
    host_files: list[str] = field(default_factory=list)  # paths replay reads from the host
    device_bytes: int = 0  # device memory its buffers take on replay
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


def host_files(objects: list[m.ObjectDef]) -> list[str]:
    """The paths a capture's file references make replay read (policy reference)."""
    paths = {o.path for o in objects if isinstance(o, m.FileReference) and o.policy == m.FilePolicy.REFERENCE}
    return sorted(paths)


def check_capture(path: str | Path, *, fixed_addresses: bool = False) -> CaptureVerdict:
    """Run run-replay's plan on the capture at ``path`` (no GPU needed)."""
    try:
        with open_capture(path) as cap:
            objects = list(cap.object_table().others.values())  # (events are neither buffers nor files)
            fixed = fixed_addresses or any(isinstance(o, m.Buffer) and o.requires_fixed_address for o in objects)
            files = host_files(objects)
            plan = build_plan(cap, PlanOptions(fixed_addresses=fixed))
    except ReplayError as exc:
        return CaptureVerdict(False, str(exc))
    if plan.problems:  # (the whole capture's, such as no device work left)
        return CaptureVerdict(False, plan.problems[0])
    return CaptureVerdict(True, fixed_addresses=fixed, host_files=files, device_bytes=plan.buffer_bytes)
