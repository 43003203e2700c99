"""Buffer contents the capture does not hold, produced on a GPU: replay every operation before the
extracted range (the prefix), read the ranges the range reads, replay the range, read the ranges
it writes. Used only where :mod:`replayfmt.edit.shadow` finds bytes the capture cannot give."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from replayfmt.edit.shadow import iter_ranges
from replayfmt.execute import open_replay
from replayfmt.replay.options import ReplayOptions
from replayfmt.replay.plan_options import PlanOptions
from replayfmt.replay.steps import StepKind

Ranges = dict[int, list[tuple[int, int]]]


@dataclass
class Snapshots:
    """Bytes of buffer ranges, keyed ``(buffer, start, end)`` (source buffer ids)."""

    device: str = ""
    before: dict[tuple[int, int, int], bytes] = field(default_factory=dict)
    after: dict[tuple[int, int, int], bytes] = field(default_factory=dict)


def replay_snapshots(
    path: str | os.PathLike[str],
    first: int,
    last: int,
    reads: Ranges,
    writes: Ranges,
    plan_options: PlanOptions | None = None,
) -> Snapshots:
    """Replay the capture at ``path`` up to operation ``first`` (exclusive), read ``reads``,
    replay ``first..last``, read ``writes``. The starting state of the region holding ``first``
    is set before reading, as a replay would set it before the range. Needs a GPU."""
    out = Snapshots()
    with open_replay(path, plan_options or PlanOptions()) as session:
        replayer = session.start(ReplayOptions())
        out.device = replayer.device_name
        steps = replayer.steps

        def before_range(step_operation: int, kind: StepKind) -> bool:
            # a region's hoisted state carries its first operation's index: the range's region
            # state belongs before the range even when the range begins the region
            return step_operation < first or (kind == StepKind.STATE and step_operation == first)

        prefix = [s for s in steps if before_range(s.operation, s.kind)]
        body = [s for s in steps if not before_range(s.operation, s.kind) and s.operation <= last]
        replayer.execute_steps(prefix)
        replayer.synchronize()
        for buffer, lo, hi in iter_ranges(reads):
            out.before[(buffer, lo, hi)] = replayer.read_back(buffer, lo, hi - lo)
        replayer.execute_steps(body)
        replayer.synchronize()
        for buffer, lo, hi in iter_ranges(writes):
            out.after[(buffer, lo, hi)] = replayer.read_back(buffer, lo, hi - lo)
    return out
