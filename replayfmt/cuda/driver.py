"""The one door to the CUDA driver: lazy import of cuda-python and one checking function.

Every driver call goes through :func:`check`, which raises DeviceError carrying the driver's
error name and explanation, plus where it happened (operation index, object id, kernel), so that
no CUDA failure is ever silent. Errors that poison the context ("sticky" errors such as an
illegal address) say that the process must restart.
"""

from __future__ import annotations

import ctypes
import functools
from types import ModuleType
from typing import Any

from replayfmt.errors import DeviceError, DeviceUnavailableError

STICKY_ERRORS = frozenset(
    {
        "CUDA_ERROR_ILLEGAL_ADDRESS",
        "CUDA_ERROR_LAUNCH_FAILED",
        "CUDA_ERROR_ILLEGAL_INSTRUCTION",
        "CUDA_ERROR_MISALIGNED_ADDRESS",
        "CUDA_ERROR_INVALID_ADDRESS_SPACE",
        "CUDA_ERROR_INVALID_PC",
        "CUDA_ERROR_HARDWARE_STACK_ERROR",
        "CUDA_ERROR_ASSERT",
        "CUDA_ERROR_LAUNCH_TIMEOUT",
    }
)
"""Errors after which the CUDA context is unusable: the process must restart to use the GPU."""


class CudaCallError(DeviceError):
    """A driver call returned an error; ``name`` is the CUresult name."""

    def __init__(self, message: str, name: str) -> None:
        super().__init__(message, sticky=name in STICKY_ERRORS)
        self.name = name


@functools.cache
def driver() -> ModuleType:
    """``cuda.bindings.driver``, initialised; DeviceError when it or the driver is missing."""
    try:
        from cuda.bindings import driver as cu
    except ImportError:
        raise DeviceUnavailableError(
            "cuda-python is not installed: pip install 'replayfmt[cuda]' (or cuda-bindings)"
        ) from None
    try:
        (err,) = cu.cuInit(0)
    except RuntimeError as exc:  # the bindings could not load libcuda
        raise DeviceUnavailableError(f"no CUDA driver on this machine ({exc}); replay needs an NVIDIA GPU") from None
    if err != cu.CUresult.CUDA_SUCCESS:
        raise DeviceUnavailableError(f"cuInit failed: {error_text(cu, err)}; is there a usable NVIDIA GPU?")
    return cu


def libcuda() -> ctypes.CDLL | None:
    """The CUDA driver library itself, through ctypes (None where it cannot be loaded): a call
    through ctypes releases the GIL, which cuda-python's start of the driver was measured not to."""
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


def initialised() -> bool:
    """Whether this process has started CUDA through :func:`driver` (work that must happen before,
    such as steering the driver's device address range for --fixed-addresses, is then too late)."""
    return driver.cache_info().currsize > 0


def is_sticky(err: Any) -> bool:
    """Whether a CUresult is one of the sticky errors that leave the context unusable."""
    return getattr(err, "name", "") in STICKY_ERRORS


def error_text(cu: ModuleType, err: Any) -> str:
    name = getattr(err, "name", str(err))
    try:
        _, text = cu.cuGetErrorString(err)
        text = text.decode() if isinstance(text, bytes) else str(text)
    except Exception:
        text = ""
    return f"{name}: {text}" if text else name


def check(result: Any, what: str) -> Any:
    """Unpack a cuda-python result tuple; raise CudaCallError naming ``what`` on failure.

    Returns None, the single value, or the tuple of values after the status.
    """
    cu = driver()
    if isinstance(result, tuple):
        err, values = result[0], result[1:]
    else:
        err, values = result, ()
    if err != cu.CUresult.CUDA_SUCCESS:
        name = getattr(err, "name", str(err))
        message = f"{what}: {error_text(cu, err)}"
        if name in STICKY_ERRORS:
            message += " (the CUDA context is now unusable; the process must restart)"
        raise CudaCallError(message, name)
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def compute_capability(device: Any) -> tuple[int, int]:
    """(major, minor) of a CUdevice."""
    cu = driver()
    attr = cu.CUdevice_attribute
    major = check(
        cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device), "compute capability"
    )
    minor = check(
        cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device), "compute capability"
    )
    return major, minor
