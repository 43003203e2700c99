"""The few CUPTI callback-API entry points the recorder needs, called through ctypes.

cupti-python provides the library (it depends on the matching ``nvidia-cuda-cupti``) and the
names of the driver calls' callback ids; the subscription itself goes through ctypes because
cupti-python wraps every callback's data in numpy-backed objects: on an H100 host an empty
cupti-python callback added about 16 us to each launch, an empty ctypes one about 2 us.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

from replayfmt.capture.launch_ring import recorder_library
from replayfmt.cuda.activity import loaded_cupti_path
from replayfmt.errors import DeviceUnavailableError, ReplayError, ReplayUsageError

DOMAIN_DRIVER_API = 1
DOMAIN_RESOURCE = 3
RESOURCE_MODULE_LOADED = 6
RESOURCE_MODULE_UNLOAD_STARTING = 7
_ERROR_MULTIPLE_SUBSCRIBERS = 39  # CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED
_OLD_SUBSCRIBER_NAME_LEN = 64

# void (*CUpti_CallbackFunc)(void *userdata, CUpti_CallbackDomain, CUpti_CallbackId, const void *cbdata)
CallbackType = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p)


class _SubscriberParams(ctypes.Structure):
    _fields_ = [
        ("structSize", ctypes.c_size_t),
        ("subscriberName", ctypes.c_char_p),
        ("oldSubscriberName", ctypes.c_char_p),
        ("oldSubscriberSize", ctypes.c_size_t),
    ]


def _cupti_python() -> Any:
    try:
        from cupti import cupti
    except ImportError as exc:
        raise ReplayUsageError(
            f"capture needs cupti-python matching the driver's CUPTI ({exc}); install it with "
            "pip install 'replayfmt[capture]'"
        ) from None
    except Exception as exc:  # importing it loads libcupti, which fails its own way without a driver
        raise _unavailable(exc) from None
    return cupti


def _unavailable(exc: Exception) -> DeviceUnavailableError:
    """cupti-python could not start CUPTI: no driver or GPU here, or a CUPTI older than the package."""
    what = (str(exc).strip().splitlines() or [""])[0]
    return DeviceUnavailableError(
        f"cannot start CUPTI ({type(exc).__name__}{': ' + what if what else ''}); capture needs an NVIDIA "
        "driver and a GPU, and cupti-python matching the driver's CUDA version"
    )


def _open(loaded: str | None) -> ctypes.CDLL:
    problems = []
    for candidate in [loaded] if loaded else ["libcupti.so.13", "libcupti.so"]:
        try:
            return ctypes.CDLL(candidate)
        except OSError as exc:
            problems.append(str(exc))
    raise ReplayUsageError(f"cannot load libcupti ({'; '.join(problems)}); reinstall cupti-python")


class Cupti:
    """libcupti, loaded where cupti-python loads it."""

    def __init__(self) -> None:
        module = _cupti_python()
        try:
            module.get_callback_name(DOMAIN_DRIVER_API, 1)  # makes cupti-python load its libcupti
        except Exception as exc:  # cupti-python's own classes (NotSupportedError, cuptiError...) vary by version
            raise _unavailable(exc) from None
        path = loaded_cupti_path()
        self.lib = _open(path)
        for name in ("cuptiSubscribe", "cuptiEnableCallback", "cuptiEnableDomain", "cuptiUnsubscribe"):
            getattr(self.lib, name).restype = ctypes.c_int
        self.driver_callback_ids: dict[str, int] = {item.name: int(item.value) for item in module.driver_api_trace_cbid}
        # the recorder's C library (launch_ring.c): when set, CUPTI calls its callback, which drops
        # ignored launch exits and records repeated launches, and forwards the rest to ``subscribe``'s
        self.library: ctypes.CDLL | None = None

    def _error(self, result: int) -> str:
        text = ctypes.c_char_p()
        get = self.lib.cuptiGetResultString
        if get(result, ctypes.byref(text)) == 0 and text.value:
            return text.value.decode(errors="replace")
        return f"CUPTI error {result}"

    def subscribe(self, callback: Callable[[int | None, int, int, int | None], None], name: str) -> tuple[Any, Any]:
        """Subscribe ``callback``; returns (subscriber, the ctypes callback to keep alive)."""
        c_callback = CallbackType(callback)
        target = c_callback
        if self.library is not None:
            self.forward(c_callback)
            target = ctypes.cast(self.library.replayfmt_recorder_callback, CallbackType)
        subscriber = ctypes.c_void_p()
        if hasattr(self.lib, "cuptiSubscribe_v2"):
            other = ctypes.create_string_buffer(_OLD_SUBSCRIBER_NAME_LEN)
            params = _SubscriberParams(
                ctypes.sizeof(_SubscriberParams), name.encode(), ctypes.cast(other, ctypes.c_char_p), len(other)
            )
            result = self.lib.cuptiSubscribe_v2(ctypes.byref(subscriber), target, None, ctypes.byref(params))
            holder = other.value.decode(errors="replace")
        else:
            result, holder = self.lib.cuptiSubscribe(ctypes.byref(subscriber), target, None), ""
        if result == _ERROR_MULTIPLE_SUBSCRIBERS:
            raise ReplayError(
                f"another CUPTI client is already subscribed ({holder or 'unnamed'}: torch.profiler, nsys, ncu "
                "or another recorder); CUPTI allows one: stop it, or record in a process without it"
            )
        if result != 0:
            raise ReplayError(f"cannot subscribe to CUPTI: {self._error(result)}")
        return subscriber, c_callback

    def enable_callback(self, subscriber: Any, domain: int, callback_id: int) -> None:
        result = self.lib.cuptiEnableCallback(1, subscriber, domain, callback_id)
        if result != 0:
            raise ReplayError(f"cannot enable CUPTI callback {domain}/{callback_id}: {self._error(result)}")

    def enable_domain(self, subscriber: Any, domain: int) -> None:
        result = self.lib.cuptiEnableDomain(1, subscriber, domain)
        if result != 0:
            raise ReplayError(f"cannot enable CUPTI domain {domain}: {self._error(result)}")

    def unsubscribe(self, subscriber: Any) -> None:
        self.lib.cuptiUnsubscribe(subscriber)
        if self.library is not None:
            self.forward(None)

    def use_library(self, library: ctypes.CDLL | None) -> None:
        """Have CUPTI's callbacks go through the recorder's C library (None: straight to Python)."""
        self.library = library
        if library is not None:  # the signatures, once
            library.replayfmt_injection_forward.argtypes = [ctypes.c_int, ctypes.c_void_p]
            library.replayfmt_injection_skip_exit.argtypes = [ctypes.c_uint, ctypes.c_int]

    def forward(self, c_callback: Any, slot: int = 0) -> None:
        """Where the library's callback forwards a slot's domains (None: nowhere): slot 0 the
        driver and resource domains, 1 the NVTX domain (inject.c)."""
        assert self.library is not None
        self.library.replayfmt_injection_forward(slot, ctypes.cast(c_callback, ctypes.c_void_p) if c_callback else None)

    def skip_exits(self, callback_ids: list[int], skip: bool) -> None:
        """Whether the library drops the exit callbacks of these driver calls (no-op without it)."""
        if self.library is not None:
            for cbid in callback_ids:
                self.library.replayfmt_injection_skip_exit(cbid, int(skip))


def load_cupti() -> Cupti:
    """libcupti through cupti-python, or a one-line error saying how to get it; its callbacks go
    through the recorder's C library where pip built it (:mod:`replayfmt.capture.launch_ring`)."""
    cupti = Cupti()
    cupti.use_library(recorder_library())
    return cupti
