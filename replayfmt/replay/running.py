"""Issuing steps, strictly: a failed call stops the replay with an error naming the operation,
its kernel and the driver's error; a sticky error (found at once, or at a synchronisation) also
names the launches issued since the last synchronisation that succeeded, the likely culprits."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from replayfmt.cuda.driver import error_text, is_sticky
from replayfmt.errors import DeviceError
from replayfmt.replay.devices import Devices
from replayfmt.replay.issue import IssueLibrary, IssuePlan, IssuePlanner, IssueRun
from replayfmt.replay.plan import Plan
from replayfmt.replay.steps import Step, StepKind

_RECENT = 8  # launches remembered since the last good synchronisation
_PLANS_KEPT = 8  # issue plans kept (of the sequences issued last)
_STRETCH = 4096  # steps cut into runs at a time on a sequence's first issue (the device starts at once)


class StepRunner:
    """Issues steps and names their failures.

    The loop does nothing per step but the call and the test of its result (a replay issues
    hundreds of thousands): the launches issued since the last good synchronisation, which a
    sticky error names, are found only when one happens, by looking back over the steps issued
    since then (the sequences given to :meth:`execute` since the last :meth:`synchronize`)."""

    def __init__(self, devices: Devices, plan: Plan, kernel_names: dict[int, str], *, continue_on_error: bool) -> None:
        self.devices = devices
        self.plan = plan
        self.kernel_names = kernel_names
        self.continue_on_error = continue_on_error
        self._issued: list[tuple[Sequence[Step], int]] = []  # (steps, how many ran) since the last good sync
        self.compiled = IssueLibrary.for_driver(devices.cu)  # the C issue loop, or None: all from Python
        self._plans: OrderedDict[int, IssuePlan] = OrderedDict()  # id(steps) -> its runs, the last few

    def execute(self, steps: Sequence[Step], grow: Callable[[], bool] | None = None) -> list[str]:
        """Issue steps; raise on the first failure (or collect them with continue_on_error; a
        sticky error always raises: nothing after it can run). Runs of launches, event records,
        waits, copies and memsets go through the C issue loop where it was built.

        ``grow``: steps still being built; called whenever every step of ``steps`` (a list it
        appends to) is issued, it builds more and answers whether there may be more still."""
        errors: list[str] = []
        self._issued.append((steps, len(steps)))
        compiled = self.compiled
        plan = self._plans.get(id(steps)) if compiled is not None and grow is None else None
        if compiled is not None and plan is not None and plan.matches(steps):
            self._plans.move_to_end(id(steps))
            self._issue_runs(compiled, steps, plan.runs, errors)
            return errors
        # first issued (or edited since, or still being built): cut and issue a stretch at a
        # time (the device starts at once), then keep the plan
        planner = IssuePlanner(self.devices.cu) if compiled is not None else None
        runs: list[IssueRun] = []
        start, more = 0, grow is not None
        while True:
            while start < len(steps):
                stop = min(len(steps), start + _STRETCH)
                self._issued[-1] = (steps, stop)  # a sticky error names the launches up to here
                if planner is None or compiled is None:
                    self._from_python(steps, start, stop, errors)
                else:
                    stretch = planner.runs(steps, start, stop)
                    self._issue_runs(compiled, steps, stretch, errors)
                    runs += stretch
                start = stop
            if not more:
                break
            more = grow()  # (what it built last is issued before the loop ends)
        if compiled is not None:
            self._plans[id(steps)] = IssuePlan(runs, tuple(steps))
            self._plans.move_to_end(id(steps))
            while len(self._plans) > _PLANS_KEPT:
                self._plans.popitem(last=False)
        return errors

    def _issue_runs(
        self, compiled: IssueLibrary, steps: Sequence[Step], runs: Sequence[IssueRun], errors: list[str]
    ) -> None:
        for start, stop, calls in runs:
            if calls is None:
                self._from_python(steps, start, stop, errors)
                continue
            done = 0
            while done < len(calls):  # past a failure only with continue_on_error
                issued, result = compiled.issue(calls[done:])
                done += issued
                if done < len(calls):
                    self._failed(steps, start + done, result, errors)
                    done += 1

    def _from_python(self, steps: Sequence[Step], start: int, stop: int, errors: list[str]) -> None:
        success = self.devices.cu.CUresult.CUDA_SUCCESS
        for position in range(start, stop):
            step = steps[position]
            out = step[1](*step[2])
            if out is not None and out[0] != success:
                self._failed(steps, position, out[0], errors)

    def _failed(self, steps: Sequence[Step], position: int, err: Any, errors: list[str]) -> None:
        """Step ``position`` failed with ``err``: raise, or (continue_on_error, not sticky) note it."""
        self._issued[-1] = (steps, position)
        error = self._step_error(steps[position], err)
        if not self.continue_on_error or error.sticky:
            raise error
        self._issued[-1] = (steps, len(steps))
        errors.append(str(error))

    def synchronize(self) -> None:
        """Wait for all work on every device; a failure names the launches issued since the last
        good synchronisation."""
        out = self.devices.synchronize_all()
        if out[0] != self.devices.cu.CUresult.CUDA_SUCCESS:
            raise DeviceError(
                f"synchronising at the end of the replay: {error_text(self.devices.cu, out[0])}; launches since "
                f"the last successful synchronisation: {self._suspects()} (the CUDA context is now unusable)",
                sticky=True,  # an error surfacing at a synchronisation comes from asynchronous work
            )
        self._issued.clear()

    def _suspects(self) -> str:
        """The last launches issued since the last good synchronisation (a captured one, or
        :meth:`synchronize`), oldest first."""
        found: list[tuple[int, str]] = []
        launches = (StepKind.LAUNCH, StepKind.LAUNCH_EX, StepKind.GRAPH_LAUNCH)
        for steps, count in reversed(self._issued):
            for k in range(count - 1, -1, -1):
                step = steps[k]
                if step.kind is StepKind.SYNCHRONIZE or len(found) == _RECENT:
                    return self._describe(found)
                if step.kind in launches:
                    found.append((step.operation, self.kernel_names.get(step.operation, "?")))
        return self._describe(found)

    @staticmethod
    def _describe(found: list[tuple[int, str]]) -> str:
        return ", ".join(f"operation {i} ({n})" for i, n in reversed(found)) or "none recorded"

    def _step_error(self, step: Step, err: Any) -> DeviceError:
        index = step.operation
        if isinstance(err, int) and err == -1:  # cannot happen: the loop is used only with every entry point
            err = "no driver entry point for this call in the C issue loop"
        elif isinstance(err, int) and err >= 0:  # from the C issue loop: a CUresult's value
            try:
                err = self.devices.cu.CUresult(err)
            except (ValueError, TypeError):
                pass  # a result this cuda-python does not name: shown as its number
        name = getattr(step.fn, "__name__", str(step.fn)).lstrip("_")
        what = self.plan.capture.operation(index).kind.label
        if index in self.kernel_names:
            what += f" of {self.kernel_names[index]}"
        message = f"operation {index} ({what}): {name} failed: {error_text(self.devices.cu, err)}"
        sticky = is_sticky(err)
        if sticky:
            message += (
                f"; launches since the last successful synchronisation: {self._suspects()} "
                "(the CUDA context is now unusable)"
            )
        return DeviceError(message, sticky=sticky)
