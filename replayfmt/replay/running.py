"""Issuing steps, strictly: a failed call stops the replay with an error naming the operation,
its kernel and the driver's error; a sticky error (found at once, or at a synchronisation) also
names the launches issued since the last synchronisation that succeeded, the likely culprits."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

from replayfmt.cuda.driver import error_text, is_sticky
from replayfmt.errors import DeviceError
from replayfmt.replay.devices import Devices
from replayfmt.replay.plan import Plan
from replayfmt.replay.steps import Step, StepKind

_RECENT = 8  # launches remembered since the last good synchronisation


class StepRunner:
    """Issues steps and names their failures."""

    def __init__(self, devices: Devices, plan: Plan, kernel_names: dict[int, str], *, continue_on_error: bool) -> None:
        self.devices = devices
        self.plan = plan
        self.kernel_names = kernel_names
        self.continue_on_error = continue_on_error
        self._recent: deque[tuple[int, str]] = deque(maxlen=_RECENT)

    def execute(self, steps: Sequence[Step]) -> list[str]:
        """Issue steps; raise on the first failure (or collect them with continue_on_error; a
        sticky error always raises: nothing after it can run)."""
        cu = self.devices.cu
        success = cu.CUresult.CUDA_SUCCESS
        names = self.kernel_names
        recent = self._recent
        launch, launch_ex, synchronize = StepKind.LAUNCH, StepKind.LAUNCH_EX, StepKind.SYNCHRONIZE
        graph_launch = StepKind.GRAPH_LAUNCH
        errors = []
        for step in steps:
            out = step.fn(*step.args)
            if out is None:
                continue
            if out[0] != success:
                error = self._step_error(step, out[0])
                if not self.continue_on_error or error.sticky:
                    raise error
                errors.append(str(error))
            elif step.kind is launch or step.kind is launch_ex or step.kind is graph_launch:
                recent.append((step.operation, names.get(step.operation, "?")))
            elif step.kind is synchronize:
                recent.clear()
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
        self._recent.clear()

    def _suspects(self) -> str:
        return ", ".join(f"operation {i} ({n})" for i, n in self._recent) or "none recorded"

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
