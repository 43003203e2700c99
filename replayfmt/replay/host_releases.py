"""The launches a replay skips because they wait for a host write it never makes (XLA's autotuner
DelayKernel; format/host_waits.py says what each is and why skipping it changes no result): those
the recorder marked LAUNCH_FLAG_HOST_RELEASED, and in captures recorded before that mark, launches
of a known waiting kernel whose semaphore pointer points into pinned host memory."""

from __future__ import annotations

from collections.abc import Mapping

from replayfmt.format import model as m
from replayfmt.format.host_waits import HostWait, host_wait
from replayfmt.reader import Capture


def host_released(
    capture: Capture,
    objects: Mapping[int, m.ObjectDef],
    buffers: Mapping[int, m.Buffer],
    launched: Mapping[tuple[int, int], int],
) -> dict[int, str]:
    """Operation index -> what it is, for every launch the replay skips. ``launched`` (the plan's
    launch counts by (executable, function)) names the functions to look at: the operations are
    read only when one of them is a known waiting kernel (never, in a capture without XLA)."""
    waits: dict[tuple[int, int], HostWait] = {}
    for eid, fn in launched:
        exe = objects.get(eid)
        if isinstance(exe, m.Executable) and 0 <= fn < len(exe.functions):
            wait = host_wait(exe.functions[fn].name)
            if wait is not None:
                waits[(eid, fn)] = wait
    if not waits:
        return {}
    released: dict[int, str] = {}
    for op in capture.iter_operations():
        if op.kind != m.OperationKind.LAUNCH:
            continue
        wait = waits.get((op.executable, op.function))
        if wait is not None and (op.flags & m.LAUNCH_FLAG_HOST_RELEASED or _on_pinned(op, wait, buffers)):
            released[op.index] = wait.what
    return released


def _on_pinned(op: m.Launch, wait: HostWait, buffers: Mapping[int, m.Buffer]) -> bool:
    """Whether the launch's semaphore pointer is relocated into pinned host memory."""
    site = next((r for r in op.relocations if r.site_buffer == 0 and r.site_offset == wait.semaphore_offset), None)
    target = buffers.get(site.target_buffer) if site is not None else None
    return target is not None and target.memory == m.MemoryKind.HOST_PINNED
