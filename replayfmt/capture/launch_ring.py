"""Repeated launches recorded in C, without a call into Python (``launch_ring.c``): the Python half.

The translator *arms* a launch it has just written when its next repeat would need nothing of
the recorder but the record itself (region mode, every buffer it reaches device memory touched
already, no stored pointers to follow). The recorder's C callback then answers each launch of
that function with the same argument bytes by putting its shape, stream, CUPTI correlation ids
and CUPTI's clock into a ring. :meth:`LaunchRing.take` hands the ring to the CUPTI source, which
turns it into one :class:`~replayfmt.capture.events.RepeatedLaunches` event in the program's
order: at the start of its next callback, and with every arming withdrawn in the same step
before any call that could change what a launch means (an allocation, a copy, a module, a graph,
a stream capture) and before a region or scope starts or ends.

CUPTI's callback must be the library's (``replayfmt_recorder_callback``, or the injection
library's trampoline) for the ring to see launches: :func:`recorder_library` finds the library
pip built; without it, every launch goes through Python.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass

import numpy as np

from replayfmt.capture import events as ev
from replayfmt.capture.c_library import built_library
from replayfmt.capture.report import KernelStats
from replayfmt.writer import LaunchTemplate

# launch_ring.c's ring_launch, field for field
RING_DTYPE = np.dtype(
    [
        ("function", "<u8"),
        ("stream", "<u8"),
        ("timestamp", "<u8"),
        ("grid", "<u4", 3),
        ("block", "<u4", 3),
        ("cluster", "<u4", 3),
        ("shared_memory", "<u4"),
        ("flags", "<u4"),
        ("correlation", "<u4"),
        ("outer", "<u4"),
        ("armed", "<u4"),
    ]
)
# launch_ring.c's flags of a launch, each the format's bit of the same meaning (LAUNCH_FLAG_*)
FLAG_COOPERATIVE = 1
FLAG_PROGRAMMATIC = 4
LAUNCH_FLAGS = FLAG_COOPERATIVE | FLAG_PROGRAMMATIC  # the ring's flags that a LaunchRecord keeps as they are
# launch_ring.c's kinds of launch call, by driver call name (with their _ptsz and _ptds variants)
_LAUNCH_KINDS = {"cuLaunchKernel": 1, "cuLaunchKernelEx": 2, "cuLaunchCooperativeKernel": 3}


@dataclass(frozen=True, slots=True)
class ArmedLaunch:
    """What the translator armed: each repeat of it is written as ``template`` in its own shape."""

    kernel: ev.Kernel
    template: LaunchTemplate  # executable, function, argument bytes, relocations
    stats: KernelStats


class LaunchRing:
    """The library's ring of repeated launches: arming, taking. ``clock``: the address of
    CUPTI's ``cuptiGetTimestamp`` (each ring launch carries its call's time), or 0."""

    def __init__(self, library: ctypes.CDLL, callback_ids: dict[str, int], clock: int = 0) -> None:
        library.replayfmt_launches_record_size.restype = ctypes.c_uint32
        library.replayfmt_launches_capacity.restype = ctypes.c_uint32
        size = library.replayfmt_launches_record_size()
        if size != RING_DTYPE.itemsize:
            raise ValueError(f"the recorder library's ring records are {size} bytes, not {RING_DTYPE.itemsize}")
        library.replayfmt_launches_call.argtypes = [ctypes.c_uint, ctypes.c_int]
        library.replayfmt_launches_clock.argtypes = [ctypes.c_void_p]
        library.replayfmt_launches_arm.argtypes = [
            ctypes.c_uint64,
            ctypes.c_void_p,
            ctypes.c_uint32,
            ctypes.c_char_p,
            ctypes.c_uint32,
        ]
        library.replayfmt_launches_arm.restype = ctypes.c_uint32
        library.replayfmt_launches_take.argtypes = [ctypes.c_void_p, ctypes.c_int]
        library.replayfmt_launches_take.restype = ctypes.c_uint32
        library.replayfmt_launches_withdraw.argtypes = []
        self._library = library
        self._pending = ctypes.c_uint32.in_dll(library, "replayfmt_launches_pending")
        self._buffer = (ctypes.c_char * (library.replayfmt_launches_capacity() * RING_DTYPE.itemsize))()
        self._address = ctypes.addressof(self._buffer)
        self._lock = threading.Lock()
        self._armed: dict[int, ArmedLaunch] = {}
        self._by_function: dict[int, int] = {}  # function -> its latest arming id
        self._superseded: list[int] = []  # arming ids replaced since the last take: forgotten after it
        for name, cbid in callback_ids.items():
            kind = _LAUNCH_KINDS.get(name.removesuffix("_ptsz").removesuffix("_ptds"))
            if kind is not None:
                library.replayfmt_launches_call(cbid, kind)
        library.replayfmt_launches_clock(clock or None)
        library.replayfmt_launches_take(self._address, 1)  # nothing left from an earlier recorder
        self.enabled = True  # False while a stream capture runs: launches then go into graphs

    def pending(self) -> bool:
        """Whether launches wait in the ring (read without a lock: a hint)."""
        return bool(self._pending.value)

    def arm(self, launch: ArmedLaunch) -> bool:
        """Record in C the next launches of ``launch.kernel`` whose arguments equal
        ``launch.template.parameters``, until the next take with ``disarm``; ``launch`` comes back with
        them (``events.RepeatedLaunches``). False when the library refuses (too many parameters)."""
        if not self.enabled:
            return False
        layout = launch.kernel.layout
        pairs = (ctypes.c_uint32 * (2 * len(layout)))(*(v for pair in layout for v in pair))
        parameters = launch.template.parameters
        with self._lock:
            armed = self._library.replayfmt_launches_arm(
                launch.kernel.handle, pairs, len(layout), parameters, len(parameters)
            )
            if armed:
                self._armed[armed] = launch
                replaced = self._by_function.get(launch.kernel.handle)
                if replaced is not None:  # launches of it still in the ring name it until the next take
                    self._superseded.append(replaced)
                self._by_function[launch.kernel.handle] = armed
        return bool(armed)

    def withdraw(self) -> None:
        """Withdraw every arming; the launches in the ring stay for the next take."""
        with self._lock:
            self._library.replayfmt_launches_withdraw()
            self._superseded += self._by_function.values()  # forgotten once the ring is next taken
            self._by_function.clear()

    def take(self, *, disarm: bool) -> ev.RepeatedLaunches | None:
        """Every launch in the ring, oldest first, with what each arming they name stands for
        (None when there is none); ``disarm``: withdraw every arming in the same step (the next
        launch of any function goes through Python)."""
        with self._lock:
            superseded, self._superseded = self._superseded, []
            count = self._library.replayfmt_launches_take(self._address, int(disarm))
            armed = self._armed
            taken = None
            if count:  # (most calls find the ring empty: nothing to read then)
                launches = np.frombuffer(ctypes.string_at(self._address, count * RING_DTYPE.itemsize), RING_DTYPE)
                taken = ev.RepeatedLaunches(launches, {a: armed[a] for a in set(launches["armed"].tolist())})
            if disarm:
                self._armed, self._by_function = {}, {}
            else:
                for old in superseded:  # taken now: no launch recorded from here on names them
                    armed.pop(old, None)
            return taken


def recorder_library() -> ctypes.CDLL | None:
    """The recorder's C library pip built beside this module (``c_library.built_library``);
    None when there is none (launches then all go through Python)."""
    built = built_library()
    return ctypes.CDLL(str(built)) if built is not None else None
