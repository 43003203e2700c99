"""The one verdict on a capture: dump-replay's ``replayable``, ``run-replay --dry-run`` and the
replay itself all come to it through the plan (``build_plan``), so that no tool calls a capture
replayable that another refuses, and all say why in the same words."""

from __future__ import annotations

from dataclasses import dataclass, field

from replayfmt.errors import ReplayError
from replayfmt.reader import Capture
from replayfmt.replay.plan import PlanOptions, build_plan
from replayfmt.replay.plan_checks import plan_warnings


@dataclass
class Judgement:
    """The one verdict on a capture with default options (what ``run-replay --dry-run`` decides):
    ``problems`` (empty: replayable) and ``warnings`` (replayable all the same: an OPTIONAL chunk
    dropped)."""

    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def replayable(self) -> bool:
        return not self.problems


def judge(capture: Capture, *, verify_payloads: bool = True) -> Judgement:
    """Plan ``capture`` with the dry run's default options, collecting every problem (as
    ``--continue-on-error`` does): a capture that needs a flag (``--fixed-addresses``,
    ``--file-remap``) is not replayable as it stands, and the problem names the flag. Every
    payload the replay reads is read and checked against its hashes, as the replay will
    (``verify_payloads=False``: only that its frames are where the index says)."""
    try:
        plan = build_plan(capture, PlanOptions(continue_on_error=True, verify_payloads=verify_payloads))
    except ReplayError as exc:
        return Judgement([str(exc)], plan_warnings(capture))
    return Judgement(list(plan.problems), list(plan.warnings))
