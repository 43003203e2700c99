"""Getting recorded device addresses back in a new process (``--fixed-addresses``).

The driver grants a hinted virtual-address reservation only inside the range it sets aside for
device memory when CUDA starts, and it places that range below whatever the process has
mapped by then: a capture taken in a PyTorch process (gigabytes of libraries) and a replay in a
small process get ranges gigabytes apart. Two things make them meet:

* both run with address-space randomisation off (:func:`restart_without_aslr`), so the layout
  depends only on what each process maps;
* before CUDA starts, the replay asks a forked copy of itself (same mappings) where a
  reservation of the recorded range would land, and maps inaccessible padding to push the
  driver's range down by the difference, until the copy is granted the range exactly
  (:func:`steer_device_arena`).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import sys
import warnings
from collections.abc import Iterable

from replayfmt.cuda.driver import check, driver

_ADDR_NO_RANDOMIZE = 0x0040000
_RESTARTED = "REPLAYFMT_NO_ASLR"
_PROT_NONE, _MAP_PRIVATE, _MAP_ANONYMOUS, _MAP_NORESERVE = 0, 0x02, 0x20, 0x4000
_MAX_PADDING = 1 << 44
_PROBE_SECONDS = 60


def restart_without_aslr() -> None:
    """Re-run this command (same interpreter, same arguments) once with address-space
    randomisation off; returns without doing anything when it is off already or cannot be."""
    if os.environ.get(_RESTARTED) or not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    current = libc.personality(0xFFFFFFFF)
    if current < 0 or current & _ADDR_NO_RANDOMIZE:
        return
    if libc.personality(current | _ADDR_NO_RANDOMIZE) < 0:
        return
    os.environ[_RESTARTED] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, sys.orig_argv)


def page_runs(ranges: Iterable[tuple[int, int]], page: int) -> list[tuple[int, int]]:
    """The pages that (address, size) ranges touch, merged into [start, end) runs in address order."""
    runs: list[list[int]] = []
    for start, end in sorted((a // page * page, -(-(a + max(n, 1)) // page) * page) for a, n in ranges):
        if runs and start <= runs[-1][1]:
            runs[-1][1] = max(runs[-1][1], end)
        else:
            runs.append([start, end])
    return [(start, end) for start, end in runs]


def _probe(low: int, size: int, device: int) -> int | str:
    """In a forked copy of this process: where the driver reserves ``size`` bytes hinted at ``low``.
    (A process in which CUDA has started cannot use it in a fork: the copy then reports an error.)"""
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the child only calls the driver and exits
        pid = os.fork()
    if pid == 0:
        os.close(read_end)
        answer: int | str
        try:
            cu = driver()  # this copy starts CUDA: the parent has not
            ctx = check(cu.cuDevicePrimaryCtxRetain(check(cu.cuDeviceGet(device), "cuDeviceGet")), "context")
            check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
            answer = int(check(cu.cuMemAddressReserve(size, 0, low, 0), "cuMemAddressReserve"))
        except Exception as exc:  # reported to the parent, never raised in the child
            answer = f"the probe failed: {exc}"
        with contextlib.suppress(OSError):
            os.write(write_end, json.dumps(answer).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        ready, _, _ = select.select([pipe], [], [], _PROBE_SECONDS)
        data = pipe.read() if ready else b""
    if not ready:
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    if not ready:
        return f"the probe process did not answer in {_PROBE_SECONDS} s"
    try:
        answer = json.loads(data)
    except ValueError:
        return "the probe process died"
    return answer if isinstance(answer, int | str) else "the probe answered nonsense"


def steer_device_arena(low: int, size: int, device: int, *, attempts: int = 8) -> str | None:
    """Before CUDA starts here: arrange that a reservation of [low, low + size) will be granted.

    Returns None once a forked copy of this process is granted exactly ``low``, else why it
    could not be arranged (the caller's own reservation then fails with that reason). The
    padding stays mapped for the life of the process (it is address space, not memory).
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    for _ in range(attempts):
        offered = _probe(low, size, device)
        if isinstance(offered, str):
            return offered
        if offered == low:
            return None
        shift = offered - low
        if shift < 0:
            return f"the driver's device range lies {-shift:#x} bytes below the recorded addresses here"
        if shift > _MAX_PADDING:
            return f"the driver's device range lies {shift:#x} bytes above the recorded addresses here"
        padding = libc.mmap(None, shift, _PROT_NONE, _MAP_PRIVATE | _MAP_ANONYMOUS | _MAP_NORESERVE, -1, 0)
        if padding in (None, ctypes.c_void_p(-1).value):
            return f"could not map {shift:#x} bytes of padding (errno {ctypes.get_errno()})"
    return f"the driver's range did not settle in {attempts} attempts"
