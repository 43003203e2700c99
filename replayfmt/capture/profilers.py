"""The program's own CUPTI clients: profilers started inside the recorded program.

CUPTI takes one subscriber per process, and the recorder holds it from the program's start. A
profiler the program starts itself then fails its own way: Triton's profiler (proton) dies with
``Failed to execute cuptiSubscribe with error 39`` (CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED);
PyTorch's (Kineto) takes over CUPTI's activity buffers, which the recorder's own device times use.
So the recorder lets the program run with its profiler's device side off, and says so in one line
of its report:

* proton: ``start`` returns no session (as it does when proton runs the program from its command
  line), and ``activate``, ``deactivate`` and ``finalize`` of the sessions it never started do
  nothing; the program's own timing and scopes still run, its profile is not written;
* torch.profiler: ``profile`` runs without ``ProfilerActivity.CUDA`` (CPU events are still
  collected).

A failure the guards did not prevent (another profiler, an Nsight hook) is traced to CUPTI by
:func:`conflict_line` from the program's exception.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

CONFLICT = "CUPTI takes one subscriber per process and the recorder holds it"
_CUPTI_WORDS = ("cupti", "error 39", "multiple_subscribers")


def install_proton(notes: list[str]) -> Callable[[], None] | None:
    """Turn Triton's profiler (``triton.profiler``, proton) off inside a recorded program; returns
    the function that puts it back. ``notes`` gets one line the first time the program starts it."""
    package = sys.modules.get("triton.profiler")
    module = sys.modules.get("triton.profiler.profile")
    if package is None or module is None or not callable(getattr(module, "start", None)):
        return None
    said = False

    def start(name: str | None = None, *args: Any, **kwargs: Any) -> None:
        nonlocal said
        if not said:
            said = True
            notes.append(
                f"the program's proton.start({name!r}) was turned off: {CONFLICT} (the program ran; its "
                "proton profile is not written: record without proton, or profile without the recorder)"
            )
        return None  # no session, as proton.start answers when proton's command line runs the program

    def no_session(*args: Any, **kwargs: Any) -> None:
        return None  # activate, deactivate, finalize: no session of the program's was started

    replaced = {"start": start, "activate": no_session, "deactivate": no_session, "finalize": no_session}
    originals: list[tuple[Any, str, Any]] = []
    for owner in (module, package):
        for attribute, replacement in replaced.items():
            original = getattr(owner, attribute, None)
            if callable(original):
                originals.append((owner, attribute, original))
                setattr(owner, attribute, functools.wraps(original)(replacement))

    def restore() -> None:
        for owner, attribute, original in originals:
            setattr(owner, attribute, original)

    return restore


def install_torch_profiler(notes: list[str]) -> Callable[[], None] | None:
    """Run ``torch.profiler.profile`` without its CUDA activities (Kineto's CUPTI client) inside a
    recorded program; returns the function that puts it back."""
    profiler = sys.modules.get("torch.profiler")
    profile = getattr(profiler, "profile", None)
    activity = getattr(profiler, "ProfilerActivity", None)
    if profile is None or activity is None or not hasattr(activity, "CUDA"):
        return None
    original = profile.__init__

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, activities: Any = None, **kwargs: Any) -> None:
        wanted = list(activities) if activities is not None else [activity.CPU, activity.CUDA]
        kept = [a for a in wanted if a != activity.CUDA]
        if len(kept) != len(wanted):
            line = (
                f"the program's torch.profiler ran without ProfilerActivity.CUDA: {CONFLICT} (its CPU events "
                "are kept; profile the GPU without the recorder)"
            )
            if line not in notes:
                notes.append(line)
        original(self, *args, activities=kept or [activity.CPU], **kwargs)

    profile.__init__ = __init__

    def restore() -> None:
        if profile.__init__ is __init__:
            profile.__init__ = original

    return restore


def conflict_line(exc: BaseException) -> str | None:
    """One line saying that the program's failure ``exc`` came from its own CUPTI client, and what
    to turn off; None when nothing in it names CUPTI."""
    text = f"{type(exc).__name__}: {exc}"
    if not any(word in text.lower() for word in _CUPTI_WORDS):
        return None
    first = text.strip().splitlines()[0][:200]
    return (
        f"the program failed in its own CUPTI client ({first}): {CONFLICT}; turn off the program's profiler "
        "(proton.start, torch.profiler's CUDA activities, an Nsight or CUPTI hook) while recording"
    )
