"""Issuing steps from C (``issue.c``): the driver calls a replay makes most (launches, event
records, stream waits, copies, memsets) packed once into rows of integers and issued by one C loop
through the driver's own entry points, instead of one cuda-python call each (about 7 us of host
time a launch on an H100 machine, where the host sets the pace: captures of many tiny kernels).
A step of another kind, or whose arguments are not plain handles and integers, runs from Python
in its place in the order.

The library is built by setup.py beside this module (``_issue*.so``); where it is absent, or the
driver gives no entry points (a stand-in driver), nothing here is used and the runner issues
every step from Python.
"""

from __future__ import annotations

import ctypes
import enum
import glob
import operator
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from replayfmt.replay.steps import Step, StepKind

ISSUE_ABI = 1  # replayfmt_issue_abi() of a library this module can drive

CALL_DTYPE = np.dtype([("kind", "<u8"), ("args", "<u8", (11,))])  # struct issue_call


class IssueKind(enum.IntEnum):
    """The driver calls the C loop makes (``enum issue_kind``), each with its arguments in order."""

    LAUNCH = 0
    LAUNCH_EX = 1
    EVENT_RECORD = 2
    STREAM_WAIT = 3
    COPY_HTOD = 4
    COPY_DTOD = 5
    COPY_DTOH = 6
    MEMSET_8 = 7
    MEMSET_16 = 8
    MEMSET_32 = 9


# Each symbol is asked for as CUDA 12.0 has it (cuMemcpyHtoDAsync: its _v2): the signatures issue.c
# declares, whatever a later driver adds under the same name.
API_VERSION = 12000
# the driver symbol behind each kind
DRIVER_SYMBOLS: dict[IssueKind, str] = {
    IssueKind.LAUNCH: "cuLaunchKernel",
    IssueKind.LAUNCH_EX: "cuLaunchKernelEx",
    IssueKind.EVENT_RECORD: "cuEventRecord",
    IssueKind.STREAM_WAIT: "cuStreamWaitEvent",
    IssueKind.COPY_HTOD: "cuMemcpyHtoDAsync",
    IssueKind.COPY_DTOD: "cuMemcpyDtoDAsync",
    IssueKind.COPY_DTOH: "cuMemcpyDtoHAsync",
    IssueKind.MEMSET_8: "cuMemsetD8Async",
    IssueKind.MEMSET_16: "cuMemsetD16Async",
    IssueKind.MEMSET_32: "cuMemsetD32Async",
}
# which kinds a step of each StepKind may be (told apart by its function: the same call site
# issues an upload from device or from host memory)
_CANDIDATES: dict[StepKind, tuple[IssueKind, ...]] = {
    StepKind.LAUNCH: (IssueKind.LAUNCH,),
    StepKind.LAUNCH_EX: (IssueKind.LAUNCH_EX,),
    StepKind.EVENT_RECORD: (IssueKind.EVENT_RECORD,),
    StepKind.STREAM_WAIT: (IssueKind.STREAM_WAIT,),
    StepKind.POINTER_SITE: (IssueKind.COPY_HTOD,),
    StepKind.UPLOAD: (IssueKind.COPY_HTOD, IssueKind.COPY_DTOD),
    StepKind.COPY: (IssueKind.COPY_DTOD,),
    StepKind.DOWNLOAD: (IssueKind.COPY_DTOH,),
    StepKind.MEMSET: (IssueKind.MEMSET_8, IssueKind.MEMSET_16, IssueKind.MEMSET_32),
}
_ARITY = {IssueKind.LAUNCH: 11, IssueKind.LAUNCH_EX: 4, IssueKind.EVENT_RECORD: 2, IssueKind.STREAM_WAIT: 3}


def built_issue_library() -> Path | None:
    """The library setup.py built beside this module, of this interface version (None: none)."""
    for built in sorted(glob.glob(str(Path(__file__).with_name("_issue")) + "*.so")):
        try:
            library = ctypes.CDLL(built)
            if library.replayfmt_issue_abi() == ISSUE_ABI:
                return Path(built)
        except (OSError, AttributeError):
            continue
    return None


def driver_entry_points(cu: Any) -> dict[IssueKind, int] | None:
    """The driver's entry point of each kind, from cuGetProcAddress (None where the driver module
    has none, as a stand-in driver, or any symbol is missing)."""
    get = getattr(cu, "cuGetProcAddress", None)
    version_of = getattr(cu, "cuDriverGetVersion", None)
    if get is None or version_of is None:
        return None
    try:
        err, version = version_of()
        if int(err) or version < API_VERSION:
            return None
        # the default stream's semantics cuda-python's own calls have (it reads this variable so)
        per_thread = int(os.environ.get("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM", "0") or 0)
        flags = cu.CUdriverProcAddress_flags.CU_GET_PROC_ADDRESS_DEFAULT
        if per_thread:
            flags = cu.CUdriverProcAddress_flags.CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
        entries = {}
        for kind, symbol in DRIVER_SYMBOLS.items():
            out = get(symbol.encode(), API_VERSION, flags)
            if int(out[0]) or not int(out[1]):
                return None
            entries[kind] = int(out[1])
        return entries
    except Exception:  # a cuda-python without the call as written here: issue from Python
        return None


class IssueLibrary:
    """The compiled loop, bound to one driver's entry points."""

    def __init__(self, path: Path, entries: dict[IssueKind, int]) -> None:
        self._library = ctypes.CDLL(str(path))
        if self._library.replayfmt_issue_abi() != ISSUE_ABI:
            raise OSError(f"{path} is not of interface version {ISSUE_ABI}")
        self._issue = self._library.replayfmt_issue
        self._issue.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
        self._issue.restype = ctypes.c_int64
        self._entries = (ctypes.c_void_p * len(IssueKind))(*(entries.get(k) or None for k in IssueKind))
        self._result = ctypes.c_int()

    @classmethod
    def for_driver(cls, cu: Any) -> IssueLibrary | None:
        """The built library bound to ``cu``'s entry points, or None (not built, no entry points)."""
        path = built_issue_library()
        entries = driver_entry_points(cu) if path is not None else None
        return cls(path, entries) if path is not None and entries is not None else None

    def issue(self, calls: np.ndarray) -> tuple[int, int]:
        """Issue ``calls`` (CALL_DTYPE rows) in order: (how many succeeded, the failing call's
        CUresult, or 0 when all did; -1: no entry point for its kind)."""
        done = self._issue(calls.ctypes.data, len(calls), self._entries, ctypes.byref(self._result))
        return int(done), self._result.value


class IssueRun(NamedTuple):
    """Steps ``start`` to ``stop`` (exclusive) of a sequence: ``calls``, their packed rows for the
    C loop, or None for steps issued from Python."""

    start: int
    stop: int
    calls: np.ndarray | None


@dataclass
class IssuePlan:
    """A sequence of steps cut into runs."""

    runs: list[IssueRun] = field(default_factory=list)
    steps: tuple[Step, ...] = ()  # the steps it was made from (a plan is for exactly these)

    def matches(self, steps: Sequence[Step]) -> bool:
        """Whether ``steps`` are still the very steps this plan packed (an edited step is another)."""
        return len(steps) == len(self.steps) and all(map(operator.is_, steps, self.steps))


class IssuePlanner:
    """Cuts steps into runs the C loop issues and runs issued from Python, a stretch at a time
    (a first run issues each stretch as soon as it is cut, so the device starts at once). Cheap
    per step (a replay packs 200k): a step's kind is looked up once per (step kind, function),
    and launches alike, which share one argument tuple, are converted once."""

    def __init__(self, cu: Any) -> None:
        self._functions = {kind: getattr(cu, symbol, None) for kind, symbol in DRIVER_SYMBOLS.items()}
        self._kinds: dict[tuple[StepKind, Any], IssueKind | None] = {}
        self._rows: dict[tuple[IssueKind, int], list[int] | None] = {}  # (kind, id(args)): the steps keep them

    def runs(self, steps: Sequence[Step], start: int, stop: int) -> list[IssueRun]:
        """The runs of steps[start:stop]."""
        kinds, rows, functions = self._kinds, self._rows, self._functions
        runs: list[IssueRun] = []
        pending: list[int] = []  # the rows of the C run being gathered, 12 integers each

        def close(end: int) -> None:  # the C run of the rows gathered, ending before ``end``
            if pending:
                calls = np.array(pending, dtype=np.uint64).view(CALL_DTYPE).reshape(-1)
                runs.append(IssueRun(end - len(calls), end, calls))
                pending.clear()

        for i in range(start, stop):
            step = steps[i]
            key = (step.kind, step.fn)
            kind = kinds[key] if key in kinds else kinds.setdefault(key, _kind_of(step, functions))
            row = None
            if kind is not None:
                args = step.args
                row = rows.get((kind, id(args)), _UNPACKED)
                if row is _UNPACKED:
                    row = rows[(kind, id(args))] = _row(kind, args)
            if row is not None:
                pending += row
                continue
            close(i)
            if runs and runs[-1].calls is None and runs[-1].stop == i:  # Python steps in a row: one run
                runs[-1] = runs[-1]._replace(stop=i + 1)
            else:
                runs.append(IssueRun(i, i + 1, None))
        close(stop)
        return runs


_UNPACKED: Any = object()


def _kind_of(step: Step, functions: dict[IssueKind, Any]) -> IssueKind | None:
    """What a step's function is to the C loop (None: a call it does not make)."""
    for kind in _CANDIDATES.get(step.kind, ()):
        if functions[kind] is not None and step.fn is functions[kind]:
            return kind
    return None


def _row(kind: IssueKind, args: tuple[Any, ...]) -> list[int] | None:
    """The 12 integers of a call's row (its kind, then its arguments), or None where an argument
    is no handle, address or count that fits 64 bits."""
    if len(args) != _ARITY.get(kind, 4):
        return None
    try:
        if kind is IssueKind.LAUNCH_EX:
            values = [int(args[0].getPtr()), *(_integer(a) for a in args[1:])]
        else:
            values = [_integer(a) for a in args]
    except (TypeError, ValueError, AttributeError):
        return None
    widths = _WIDTHS.get(kind)
    if min(values) < 0 or max(values) >= 1 << 64 or (widths and any(v >> w for v, w in zip(values, widths))):
        return None  # as cuda-python would refuse it: from Python, which says so
    return [int(kind), *values, *_PADDING[len(values) :]]


# bits of each argument the driver takes narrower than 64 (a value wider is issued from Python)
_WIDTHS: dict[IssueKind, tuple[int, ...]] = {
    IssueKind.LAUNCH: (64, 32, 32, 32, 32, 32, 32, 32, 64, 64, 64),
    IssueKind.STREAM_WAIT: (64, 64, 32),
    IssueKind.MEMSET_8: (64, 8, 64, 64),
    IssueKind.MEMSET_16: (64, 16, 64, 64),
    IssueKind.MEMSET_32: (64, 32, 64, 64),
}


_PADDING = [0] * 11


def _integer(value: Any) -> int:
    """A handle, address or count as the integer the driver takes (None: a null pointer)."""
    return 0 if value is None else int(value)
