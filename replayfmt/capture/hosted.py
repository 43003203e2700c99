"""The recorder inside a program that is not Python: run by the injection library (``inject.c``)
in an interpreter it embeds in the program, at the program's first driver call after cuInit.

:func:`start` builds the same :class:`~replayfmt.capture.recorder.Recorder` that records Python
programs, over the library's CUPTI subscriber (:class:`HostedCupti`: CUPTI has one subscriber
per process, and the library took it inside cuInit, before the program's first driver call);
``--scope`` names become NVTX ranges (:class:`NvtxScopes`), since the program cannot call our
Python ``scope``. :func:`finish` runs at exit: it closes the recorder (final checkpoint, index,
verdict) and writes ``report.json`` for the parent. Nothing here may raise into the program.
"""

from __future__ import annotations

import ctypes
import json
import os
import struct
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from replayfmt.capture.cupti_api import CallbackType, Cupti
from replayfmt.capture.injection import InjectionConfig
from replayfmt.capture.options import CaptureMode
from replayfmt.capture.process_memory import MEMORY, c_string
from replayfmt.capture.recorder import Recorder
from replayfmt.cuda.activity import loaded_cupti_path
from replayfmt.errors import ReplayUsageError

SLOT_NVTX = 1  # the library's forwarding slot for the NVTX domain (inject.c)
DOMAIN_NVTX = 5
# CUpti_nvtx_api_trace_cbid (cupti_nvtx_cbid.h): the ranges a program pushes and pops
NVTX_PUSH_A, NVTX_PUSH_W, NVTX_PUSH_EX, NVTX_POP = 8, 9, 10, 11
NVTX_DOMAIN_PUSH_EX, NVTX_DOMAIN_POP = 33, 34
_MESSAGE_ASCII, _MESSAGE_UNICODE = 1, 2  # nvtxMessageType_t
_ATTRIBUTE_MESSAGE_TYPE, _ATTRIBUTE_MESSAGE = 32, 40  # offsets in nvtxEventAttributes_t (v2)
_MAX_NAME = 4096


class HostedCupti(Cupti):
    """libcupti as the injection library holds it: ``subscribe`` adopts the library's subscriber
    and has the library's trampoline forward the driver and resource callbacks to ``callback``."""

    def __init__(self, library: ctypes.CDLL) -> None:
        super().__init__()
        self.use_library(library)
        library.replayfmt_injection_subscriber.restype = ctypes.c_void_p

    def subscribe(self, callback: Callable[[int | None, int, int, int | None], None], name: str) -> tuple[Any, Any]:
        c_callback = CallbackType(callback)
        self.forward(c_callback)
        return ctypes.c_void_p(self.library.replayfmt_injection_subscriber()), c_callback

    def unsubscribe(self, subscriber: Any) -> None:
        self.forward(None)  # the library keeps the subscription: the process is ending


class NvtxScopes:
    """The program's NVTX ranges named by ``--scope`` open and close the recorder's scopes
    (``nvtxRangePushA/W/Ex``, ``nvtxDomainRangePushEx`` and their pops, per thread)."""

    def __init__(self, recorder: Recorder, names: tuple[str, ...]) -> None:
        self.recorder = recorder
        self.names = frozenset(names)
        self._threads = threading.local()  # each thread's stack of open ranges: scope or None
        self.c_callback = CallbackType(self._callback)

    def enable(self, cupti: HostedCupti, subscriber: Any) -> None:
        for cbid in (NVTX_PUSH_A, NVTX_PUSH_W, NVTX_PUSH_EX, NVTX_POP, NVTX_DOMAIN_PUSH_EX, NVTX_DOMAIN_POP):
            cupti.enable_callback(subscriber, DOMAIN_NVTX, cbid)
        cupti.forward(self.c_callback, SLOT_NVTX)

    def _callback(self, userdata: int | None, domain: int, cbid: int, data: int | None) -> None:
        if not data:
            return
        try:
            stack = self._threads.__dict__.setdefault("stack", [])
            if cbid in (NVTX_POP, NVTX_DOMAIN_POP):
                if stack:
                    scope = stack.pop()
                    if scope is not None:
                        scope.__exit__(None, None, None)
                return
            params = struct.unpack_from("<Q", MEMORY, data + 8)[0]  # CUpti_NvtxData.functionParams
            name = range_name(cbid, params) if params else None
            if name is not None and name in self.names:
                scope = self.recorder.scope(name)
                scope.__enter__()
                stack.append(scope)
            else:
                stack.append(None)
        except Exception as exc:  # never raise into the program
            self.recorder.report.errors.append(f"NVTX range callback {cbid}: {type(exc).__name__}: {exc}")


def range_name(cbid: int, params: int) -> str | None:
    """The message of a pushed NVTX range (``params``: the call's parameter struct); None for a
    registered string or an unknown call."""
    if cbid == NVTX_PUSH_A:
        return _ascii(_pointer(params))
    if cbid == NVTX_PUSH_W:
        return _wide(_pointer(params))
    if cbid in (NVTX_PUSH_EX, NVTX_DOMAIN_PUSH_EX):
        attributes = _pointer(params + (8 if cbid == NVTX_DOMAIN_PUSH_EX else 0))
        if not attributes:
            return None
        kind = struct.unpack_from("<i", MEMORY, attributes + _ATTRIBUTE_MESSAGE_TYPE)[0]
        message = _pointer(attributes + _ATTRIBUTE_MESSAGE)
        if kind == _MESSAGE_ASCII:
            return _ascii(message)
        if kind == _MESSAGE_UNICODE:
            return _wide(message)
    return None


def _pointer(address: int) -> int:
    return struct.unpack_from("<Q", MEMORY, address)[0]


def _ascii(address: int) -> str | None:
    return c_string(address)[:_MAX_NAME] if address else None


def _wide(address: int) -> str | None:
    if not address:
        return None
    return ctypes.wstring_at(address)[:_MAX_NAME]


class _Session:
    """The hosted recorder of this process, between :func:`start` and :func:`finish`."""

    def __init__(self, folder: Path, config: InjectionConfig, recorder: Recorder, keep: list[Any]) -> None:
        self.folder = folder
        self.config = config
        self.recorder = recorder
        self.keep = keep  # ctypes callbacks the library calls: alive until exit


# The hosted recorder between the library's two calls into Python (start, then finish at exit):
# at most one, since the library starts one recorder per process.
_sessions: list[_Session] = []


def start(folder: str) -> None:
    """Build the recorder over the library's subscriber (called by ``inject.c``)."""
    where = Path(folder)
    config = InjectionConfig.from_json((where / "config.json").read_text(encoding="utf-8"))
    library = ctypes.CDLL(os.environ["CUDA_INJECTION64_PATH"])
    cupti = HostedCupti(library)
    loaded = loaded_cupti_path()
    if loaded and config.libcupti and os.path.realpath(loaded) != os.path.realpath(config.libcupti):
        raise ReplayUsageError(
            f"cupti-python loaded {loaded} but the injection library holds {config.libcupti}: two CUPTIs "
            "in one process; set CUPTI's path the same way for both"
        )
    recorder = Recorder(
        config.output, config.options, overwrite=config.overwrite, command_line=config.command_line, cupti=cupti
    )
    # called on every launch: through PyDLL, which keeps the GIL (the call takes nanoseconds)
    outer = ctypes.PyDLL(os.environ["CUDA_INJECTION64_PATH"]).replayfmt_injection_runtime_correlation
    outer.restype, outer.argtypes = ctypes.c_uint32, []
    recorder.times.outer_correlation = outer
    keep: list[Any] = []
    if config.options.mode == CaptureMode.REGION and config.options.region_scopes:
        scopes = NvtxScopes(recorder, config.options.region_scopes)
        scopes.enable(cupti, ctypes.c_void_p(library.replayfmt_injection_subscriber()))
        keep.append(scopes)
    elif config.options.mode == CaptureMode.REGION:
        recorder.start()
    _sessions.append(_Session(where, config, recorder, keep))


def finish(folder: str) -> None:
    """Close the recorder and write ``report.json`` (called by ``inject.c`` at exit)."""
    if not _sessions:
        return
    session = _sessions.pop()
    report = session.recorder.close()
    verdict = report.verdict
    data = {
        "lines": report.lines(),
        "replayable": None if verdict is None else verdict.replayable,
        "reason": "" if verdict is None else verdict.reason,
        "operations": report.operations,
    }
    partial = Path(folder, "report.json.partial")
    partial.write_text(json.dumps(data), encoding="utf-8")
    os.replace(partial, Path(folder, "report.json"))


def probe(folder: str) -> None:
    """Diagnostics without CUDA (``replayfmt_injection_probe``): the configuration as the hosted
    recorder reads it, and the interpreter it runs in, into ``probe.json``."""
    where = Path(folder)
    config = InjectionConfig.from_json((where / "config.json").read_text(encoding="utf-8"))
    data = {
        "config": json.loads(config.to_json()),
        "executable": sys.executable,
        "version": list(sys.version_info[:3]),
        "prefix": sys.base_prefix,
        "replayfmt": os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        "pid": os.getpid(),
    }
    Path(folder, "probe.json").write_text(json.dumps(data), encoding="utf-8")
