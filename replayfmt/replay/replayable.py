"""The one verdict on a capture: dump-replay's ``replayable``, ``run-replay --dry-run`` and the
replay itself all come to it through the plan (``build_plan``), so that no tool calls a capture
replayable that another refuses, and all say why in the same words. The recorder's close-time
check of its own file is here too (:func:`check_closed`): the replay side owns the verdict, the
recorder asks for it."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from replayfmt.errors import ReplayError
from replayfmt.format import model as m
from replayfmt.reader import Capture, open_capture
from replayfmt.replay.plan import PlanOptions, build_plan
from replayfmt.replay.plan_checks import plan_warnings


@dataclass
class PlanVerdict:
    """The one verdict on a capture with default options (what ``run-replay --dry-run`` decides):
    ``problems`` (empty: replayable) and ``warnings`` (replayable all the same: an OPTIONAL chunk
    dropped)."""

    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def replayable(self) -> bool:
        return not self.problems


def plan_verdict(capture: Capture, *, verify_payloads: bool = True) -> PlanVerdict:
    """Plan ``capture`` with the dry run's default options, collecting every problem (as
    ``--continue-on-error`` does): a capture that needs a flag (``--fixed-addresses``,
    ``--file-remap``) is not replayable as it stands, and the problem names the flag. Every
    payload the replay reads is read and checked against its hashes, as the replay will
    (``verify_payloads=False``: only that its frames are where the index says)."""
    try:
        plan = build_plan(capture, PlanOptions(continue_on_error=True, verify_payloads=verify_payloads))
    except ReplayError as exc:
        return PlanVerdict([str(exc)], plan_warnings(capture))
    return PlanVerdict(list(plan.problems), list(plan.warnings))


@dataclass(frozen=True)
class ClosedCapture:
    """The plan's verdict on a capture a recorder has just closed (default options, strict):
    ``problem`` ("" when replayable) and what its replay needs."""

    problem: str = ""
    fixed_addresses: bool = False  # replayable with --fixed-addresses (the capture requires it)
    host_files: tuple[str, ...] = ()  # paths replay reads from the host
    device_bytes: int = 0  # device memory its buffers take on replay
    device_work: int = 0  # operations that run on a device (launches, graph launches, copies, memsets)


def host_files(objects: Iterable[m.ObjectDef]) -> tuple[str, ...]:
    """The paths a capture's file references make replay read (policy reference)."""
    paths = {o.path for o in objects if isinstance(o, m.FileReference) and o.policy == m.FilePolicy.REFERENCE}
    return tuple(sorted(paths))


def check_closed(path: str | os.PathLike[str], *, fixed_addresses: bool = False) -> ClosedCapture:
    """Plan the capture at ``path`` as run-replay would (no GPU needed), with --fixed-addresses
    where asked or where a buffer requires it; the first problem is the verdict."""
    try:
        with open_capture(path) as cap:
            objects = list(cap.object_table().others.values())  # (events are neither buffers nor files)
            fixed = fixed_addresses or any(isinstance(o, m.Buffer) and o.requires_fixed_address for o in objects)
            files = host_files(objects)
            plan = build_plan(cap, PlanOptions(fixed_addresses=fixed))
    except ReplayError as exc:
        return ClosedCapture(str(exc))
    if plan.problems:  # (the whole capture's, such as no device work left)
        return ClosedCapture(plan.problems[0])
    work = sum(n for label, n in plan.operation_counts.items() if label in {k.label for k in m.DEVICE_WORK})
    return ClosedCapture(fixed_addresses=fixed, host_files=files, device_bytes=plan.buffer_bytes, device_work=work)
