"""What a replay is asked to do (:class:`ReplayOptions`) and what one run of it answers (:class:`RunResult`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from replayfmt.errors import VerificationError
from replayfmt.replay.collectives import Peers
from replayfmt.replay.compare import BufferReport, Tolerance


@dataclass
class ReplayOptions:
    devices: tuple[int, ...] = (0,)  # captured device k runs on cuda:devices[k]
    verify: bool = False  # prepare verification, and verify every run unless a run says otherwise
    tolerance: Tolerance = field(default_factory=Tolerance)
    save_output: Path | None = None
    continue_on_error: bool = False
    uploads_from_host: bool = False  # keep uploads as host-to-device copies (timing fidelity)
    nvtx: bool = False  # NVTX ranges around scopes and launches, for nsys and ncu
    check_payloads: bool = True  # check every payload frame against its hash (off: faster, corruption unseen)
    # the first run builds the steps as it issues them, the device working meanwhile (a large
    # capture's verdict comes sooner; that run's device time may then include waits for the host)
    build_while_running: bool = False
    # the other ranks' replays, to issue the capture's collectives among (None: replayed alone,
    # each collective's received bytes put in place)
    peers: Peers | None = None


def dry_run_devices(devices: tuple[int, ...], captured: int) -> tuple[list[str], str]:
    """What a dry run can tell of ``--device`` without opening a device: (problems, a note).
    More devices than the capture has, or an ordinal past the GPUs this machine shows
    (``CUDA_VISIBLE_DEVICES``, else the NVIDIA driver's /proc entries), is a problem; where the
    machine shows no driver the note says the ordinals were not checked."""
    problems = []
    if len(devices) > max(1, captured):
        problems.append(f"--device is given {len(devices)} times, but the capture has {captured} device(s)")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    gpus = Path("/proc/driver/nvidia/gpus")
    if visible is not None:
        count = 0
        for part in visible.split(","):
            if not part.strip() or part.strip().startswith("-"):
                break  # CUDA stops at the first invalid entry
            count += 1
        where = f"CUDA_VISIBLE_DEVICES={visible!r} shows {count} GPU(s)"
    elif gpus.is_dir():
        count = sum(1 for _ in gpus.iterdir())
        where = f"this machine has {count} GPU(s)"
    else:
        shown = ", ".join(f"cuda:{d}" for d in devices)
        return problems, f"{shown} not checked: no NVIDIA driver here (a dry run opens no device)"
    problems += [f"--device cuda:{d}: {where}" for d in devices if d >= count]
    return problems, ""


@dataclass
class RunResult:
    device_ms: list[float] = field(default_factory=list)  # one per repetition, its starting state left out
    state_ms: list[float] = field(default_factory=list)  # one per repetition: setting its starting state
    reports: list[BufferReport] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    built_while_running: bool = False  # the first repetition built its steps as it ran (build_while_running)

    @property
    def verified(self) -> bool:
        """Something was compared (N > 0 ranges) and nothing differed: never true of nothing."""
        return bool(self.reports) and all(r.passed for r in self.reports)

    @property
    def mismatches(self) -> list[BufferReport]:
        """The reports of buffer ranges that differ from the capture."""
        return [r for r in self.reports if not r.passed]

    def require_verified(self) -> None:
        """Raise VerificationError naming the first buffer range that differs from the capture, or
        saying that nothing was compared."""
        if not self.reports:
            raise VerificationError(
                "verification compared nothing: the capture holds no checkpoints or expected downloads "
                "(or the replay was not made with ReplayOptions(verify=True))"
            )
        failed = self.mismatches
        if failed:
            raise VerificationError(
                f"verification failed for {len(failed)} buffer range(s); first: {failed[0].line().strip()}"
            )
