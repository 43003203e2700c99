"""The benchmark verb: time replayed work, by scope, from the same starting state every time
(``benchmark-replay`` calls :func:`benchmark`).

The sequence: open and plan; find the region (a bad scope fails before any device work); set the
replay up with uploads kept as host-to-device copies (timing fidelity); then the
:class:`~replayfmt.measure.benchmark.Benchmark` runs its warm-up and timed iterations, each from
restored buffers. Formatting the result is the caller's.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from replayfmt.execute import open_replay
from replayfmt.format import model as m
from replayfmt.format.layout import DEFAULT_LIMITS, Limits
from replayfmt.measure.benchmark import Benchmark, BenchmarkOptions, BenchmarkResult, find_region
from replayfmt.replay.collectives import Peers
from replayfmt.replay.options import ReplayOptions
from replayfmt.replay.plan_options import PlanOptions
from replayfmt.verbs.verifying import with_local_peers

# (iterations done, iterations in all or None when timed to a minimum time, seconds elapsed)
Progress = Callable[[int, int | None, float], None]


@dataclass(frozen=True)
class BenchmarkReplayOptions:
    """What :func:`benchmark` is asked; the defaults are ``benchmark-replay FILE``'s."""

    measure: BenchmarkOptions = field(default_factory=BenchmarkOptions)  # scope, iterations, clock, mode
    plan: PlanOptions = field(default_factory=PlanOptions)  # substitutions, remaps, launch overrides
    devices: tuple[int, ...] = (0,)  # captured device k runs on cuda:devices[k]
    nvtx: bool = False  # NVTX ranges around scopes and launches
    limits: Limits = DEFAULT_LIMITS  # the reader's caps (--limit NAME=VALUE)
    peers: Peers | None = None  # the other ranks' replays, to issue collectives among (verbs/ranks.py)


def benchmark(
    path: str | os.PathLike[str], options: BenchmarkReplayOptions | None = None, *, progress: Progress | None = None
) -> BenchmarkResult:
    """Time the region ``options.measure.scope`` names (the whole capture without one) in the
    capture at ``path``; ``progress`` is told each iteration."""
    options = options or BenchmarkReplayOptions()
    replay = ReplayOptions(devices=options.devices, uploads_from_host=True, nvtx=options.nvtx, peers=options.peers)
    with open_replay(path, options.plan, limits=options.limits) as session:
        region = find_region(session.capture, options.measure.scope)  # before any device work
        plan = session.plan
        collectives = plan.operation_counts.get(m.OperationKind.COLLECTIVE.label, 0)
        replay, note = with_local_peers(session.capture, len(plan.devices), replay, collectives)
        result = Benchmark(session.start(replay), region, options.measure).run(progress)
        return dataclasses.replace(result, collectives=note) if note else result
