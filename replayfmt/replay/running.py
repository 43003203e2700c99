"""Issuing steps, strictly: a failed call stops the replay with an error naming the operation,
its kernel and the driver's error; a sticky error (found at once, or at a synchronisation) also
names the launches issued since the last synchronisation that succeeded, the likely culprits."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from replayfmt.cuda.driver import error_text, is_sticky
from replayfmt.errors import DeviceError
from replayfmt.replay.devices import Devices
from replayfmt.replay.plan import Plan
from replayfmt.replay.steps import Step, StepKind

_RECENT = 8  # launches remembered since the last good synchronisation


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

    def execute(self, steps: Sequence[Step]) -> list[str]:
        """Issue steps; raise on the first failure (or collect them with continue_on_error; a
        sticky error always raises: nothing after it can run)."""
        success = self.devices.cu.CUresult.CUDA_SUCCESS
        errors = []
        self._issued.append((steps, len(steps)))
        for step in steps:
            out = step[1](*step[2])
            if out is not None and out[0] != success:
                position = next(k for k in range(len(steps)) if steps[k] is step)
                self._issued[-1] = (steps, position)
                error = self._step_error(step, out[0])
                if not self.continue_on_error or error.sticky:
                    raise error
                self._issued[-1] = (steps, len(steps))
                errors.append(str(error))
        return errors

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
