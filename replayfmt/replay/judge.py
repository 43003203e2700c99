"""The one verdict on a capture: dump-replay's ``replayable``, ``run-replay --dry-run`` and the
replay itself all come to it through the plan (``build_plan``), so that no tool calls a capture
replayable that another refuses, and all say why in the same words."""

from __future__ import annotations

from dataclasses import dataclass, field

from replayfmt.errors import ReplayError
from replayfmt.format import model as m
from replayfmt.reader import Capture
from replayfmt.replay.plan import PlanOptions, build_plan
from replayfmt.replay.plan_checks import plan_warnings


@dataclass
class Judgement:
    """The one verdict on a capture with default options (what ``run-replay --dry-run`` decides):
    ``problems`` (empty: replayable), ``warnings`` (replayable all the same: an OPTIONAL chunk
    dropped), and whether it needs ``--fixed-addresses``."""

    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    fixed_addresses: bool = False

    @property
    def replayable(self) -> bool:
        return not self.problems


def judge(capture: Capture) -> Judgement:
    """Plan ``capture`` with default options, collecting every problem (as ``--continue-on-error``
    does); a capture whose buffers need fixed addresses is judged as replayed with them."""
    fixed = False
    try:
        fixed = any(isinstance(o, m.Buffer) and o.requires_fixed_address for o in capture.objects())
        plan = build_plan(capture, PlanOptions(fixed_addresses=fixed, continue_on_error=True))
    except ReplayError as exc:
        return Judgement([str(exc)], plan_warnings(capture), fixed)
    return Judgement(list(plan.problems), list(plan.warnings), fixed)
