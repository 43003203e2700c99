"""NVTX ranges, so that Nsight Systems and Nsight Compute can select replayed scopes and launches
(``ncu --nvtx --nvtx-include "step/"``). Uses the NVTX shared library (libnvToolsExt) through
ctypes; the profiler injects itself into it, and without a profiler the calls cost almost nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import sys
from typing import Any

from .errors import DeviceUnavailableError


def _candidates() -> list[str]:
    found = ctypes.util.find_library("nvToolsExt")
    paths = [found] if found else []
    for root in sys.path:
        paths += glob.glob(os.path.join(root, "nvidia", "*", "lib", "libnvToolsExt.so*"))
    paths += glob.glob("/usr/local/cuda*/lib64/libnvToolsExt.so*") + glob.glob(
        "/usr/local/cuda*/targets/*/lib/libnvToolsExt.so*"
    )
    return paths


class Nvtx:
    """Push/pop NVTX ranges. Construct with :meth:`load`."""

    def __init__(self, library: Any) -> None:
        self._push = library.nvtxRangePushA
        self._push.argtypes = [ctypes.c_char_p]
        self._push.restype = ctypes.c_int
        self._pop = library.nvtxRangePop
        self._pop.restype = ctypes.c_int

    @classmethod
    def load(cls) -> Nvtx:
        for path in _candidates():
            try:
                return cls(ctypes.CDLL(path))
            except OSError:
                continue
        raise DeviceUnavailableError(
            "--nvtx: the NVTX library (libnvToolsExt.so) was not found; install the nvidia-nvtx package or CUDA"
        )

    def push(self, name: bytes) -> None:
        self._push(name)

    def pop(self) -> None:
        self._pop()
