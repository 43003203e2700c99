"""Replaying a capture.

``plan`` decides everything that needs no GPU (``build_plan``). The :class:`Replayer` (``replayer``)
composes the phases that rebuild the plan on devices, one module each: ``devices`` (contexts,
device fit, peer access), ``buffers`` (allocations, fixed addresses, pinned memory), ``modules``
(loads, ABI checks, register-cap re-JIT), ``streams`` (streams, events, the timing stream),
``staging`` (uploads staged once through pinned lanes, frames checked on the device), ``launches``
(parameter blocks packed and relocated), ``steps`` (the capture as typed steps), ``running``
(issuing steps, naming failures) and ``verify`` (checkpoints, expected downloads, saving), with
``compare`` for the buffer comparisons. :mod:`replayfmt.execute` is the front door that composes
them: the open -> plan -> Replayer sequence every tool uses.
"""

from replayfmt.replay.options import ReplayOptions, RunResult
from replayfmt.replay.plan import Plan, PlanOptions, build_plan
from replayfmt.replay.replayer import Replayer
from replayfmt.replay.steps import Step, StepKind

__all__ = [
    "Plan",
    "PlanOptions",
    "ReplayOptions",
    "Replayer",
    "RunResult",
    "Step",
    "StepKind",
    "build_plan",
]
