"""The recorder's verdict on its own file: the checks run-replay's plan makes (with default
options), run once the capture is closed, so that no capture that cannot replay leaves the
recorder looking like a success. Also what the capture needs from the host it was made on."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from replayfmt.errors import ReplayError
from replayfmt.format import model as m
from replayfmt.reader import open_capture
from replayfmt.replay.plan import PlanOptions, build_plan


@dataclass
class Verdict:
    """``replayable``; otherwise ``reason`` is the first problem run-replay would refuse on."""

    replayable: bool
    reason: str = ""
    fixed_addresses: bool = False  # replayable with --fixed-addresses (the capture requires it)
    host_files: list[str] = field(default_factory=list)  # paths replay reads from the host

    def line(self) -> str:
        """``replayable: yes`` or ``replayable: no: <reason>``."""
        if not self.replayable:
            return f"replayable: no: {self.reason}"
        return "replayable: yes" + (" (with --fixed-addresses)" if self.fixed_addresses else "")

    def host_line(self) -> str:
        """What replay needs from the host: the referenced files, or nothing."""
        if not self.host_files:
            return "needs nothing from the host"
        return f"needs {len(self.host_files)} file(s) from the host: " + ", ".join(self.host_files)


def host_files(objects: list[m.ObjectDef]) -> list[str]:
    """The paths a capture's file references make replay read (policy reference)."""
    paths = {o.path for o in objects if isinstance(o, m.FileReference) and o.policy == m.FilePolicy.REFERENCE}
    return sorted(paths)


def check_capture(path: str | Path, *, fixed_addresses: bool = False) -> Verdict:
    """Run run-replay's plan on the capture at ``path`` (no GPU needed)."""
    try:
        with open_capture(path) as cap:
            objects = list(cap.objects())
            fixed = fixed_addresses or any(isinstance(o, m.Buffer) and o.requires_fixed_address for o in objects)
            files = host_files(objects)
            problems = build_plan(cap, PlanOptions(fixed_addresses=fixed)).problems  # (the whole capture's)
    except ReplayError as exc:
        return Verdict(False, str(exc))
    if problems:
        return Verdict(False, problems[0])
    return Verdict(True, fixed_addresses=fixed, host_files=files)
