"""The executor's front door: open a capture into a ready replay, and run it.

Every tool follows the same sequence, and this module is where it lives::

    with open_replay("step.kreplay", PlanOptions()) as session:   # read + plan: no GPU needed
        print(session.plan.describe())                            # inspect, find a scope, dry-run
        replayer = session.start(ReplayOptions(verify=True))      # build device state once
        result = replayer.run(repetitions=3)                      # run the plan's steps

or, in one call, :func:`execute`. The rooms behind it are ``replayfmt.replay`` (the plan, the
:class:`~replayfmt.replay.replayer.Replayer` and its phases) and ``replayfmt.reader`` (the file).
"""

from __future__ import annotations

import os
import time

from replayfmt.errors import ReplayError, ReplayUsageError
from replayfmt.format.layout import DEFAULT_LIMITS, Limits
from replayfmt.reader import Capture, open_capture
from replayfmt.replay.devices import DeviceWarmup
from replayfmt.replay.options import ReplayOptions, RunResult
from replayfmt.replay.plan import PlanOptions, build_plan
from replayfmt.replay.replayer import Replayer

__all__ = ["ReplaySession", "execute", "open_replay"]


class ReplaySession:
    """A capture opened and planned, and the Replayer started on it: what every tool does.

    ``with open_replay(path, plan_options) as session:`` inspect ``session.plan`` (describe it,
    find a scope, stop for a dry run: no GPU is touched yet, unless ``warm_devices`` started CUDA
    early), then ``session.start(options)``. Leaving the block closes the Replayer, then releases
    what the warm-up retained, then closes the capture.
    """

    def __init__(self, capture: Capture, plan_options: PlanOptions, warmup: DeviceWarmup | None = None) -> None:
        self.capture = capture
        self._replayer: Replayer | None = None
        self._warmup = warmup
        try:
            self.plan = build_plan(capture, plan_options)
        except BaseException:
            self.close()
            raise

    @property
    def replayer(self) -> Replayer:
        """The Replayer :meth:`start` made."""
        if self._replayer is None:
            raise ReplayUsageError("this replay session has not started its Replayer")
        return self._replayer

    def start(self, options: ReplayOptions | None = None) -> Replayer:
        """Set the plan up on the devices (once per session); a plan with problems is refused
        unless it was made with ``continue_on_error`` (the verdict run-replay --dry-run gives)."""
        if self._replayer is not None:
            raise ReplayUsageError("this replay session has started its Replayer already")
        if self.plan.problems and not self.plan.options.continue_on_error:
            raise ReplayError(self.plan.problems[0])
        started = time.perf_counter()
        if self._warmup is not None:
            self._warmup.wait()
        waited = time.perf_counter() - started
        self._replayer = Replayer(self.plan, options)
        # setup's phases begin with the wait for the warm-up (CUDA started while the plan was made)
        self._replayer.setup_seconds = {"wait_for_devices": waited, **self._replayer.setup_seconds}
        return self._replayer

    def close(self) -> None:
        if self._replayer is not None:
            self._replayer.close()
        if self._warmup is not None:
            self._warmup.close()
        self.capture.close()

    def __enter__(self) -> ReplaySession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_replay(
    path: str | os.PathLike[str],
    plan_options: PlanOptions | None = None,
    *,
    warm_devices: tuple[int, ...] = (),
    limits: Limits = DEFAULT_LIMITS,
) -> ReplaySession:
    """Open a capture and plan its replay (every check that needs no GPU); see :class:`ReplaySession`.

    ``warm_devices``: the devices the replay will run on, whose CUDA start begins on a thread of
    its own while the capture is read and planned (:class:`~replayfmt.replay.devices.DeviceWarmup`);
    none with ``fixed_addresses``, which must steer the driver before CUDA starts. ``limits``: the
    reader's caps (``--limit``)."""
    options = plan_options or PlanOptions()
    warmup = DeviceWarmup(warm_devices) if warm_devices and not options.fixed_addresses else None
    try:
        capture = open_capture(path, limits=limits)
    except BaseException:
        if warmup is not None:
            warmup.close()
        raise
    return ReplaySession(capture, options, warmup)


def execute(
    path: str | os.PathLike[str],
    plan_options: PlanOptions | None = None,
    options: ReplayOptions | None = None,
    *,
    repetitions: int = 1,
) -> RunResult:
    """Open, plan, set up and run a capture ``repetitions`` times; the whole replay in one call.

    With ``ReplayOptions(verify=True)`` the result's reports hold every compared range; call
    :meth:`RunResult.require_verified` to raise on a mismatch (or on nothing compared).
    """
    with open_replay(path, plan_options) as session:
        replayer = session.start(options)
        return replayer.run(repetitions)
