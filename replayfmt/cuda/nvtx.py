"""NVTX ranges, so that Nsight Systems and Nsight Compute can select replayed scopes and launches
(``ncu --nvtx --nvtx-include "step/"``). Uses the NVTX shared library (libnvToolsExt) through
ctypes when there is one, else PyTorch's compiled NVTX bindings (CUDA 13 ships NVTX 3 as headers
only); the profiler injects itself, and without a profiler the calls cost almost nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import sys
from typing import Any

from replayfmt.errors import DeviceUnavailableError


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

    def __init__(self, push: Any, pop: Any, *, text: bool) -> None:
        self._push, self._pop, self._text = push, pop, text

    @classmethod
    def load(cls) -> Nvtx:
        for path in _candidates():
            try:
                library = ctypes.CDLL(path)
            except OSError:
                continue
            library.nvtxRangePushA.argtypes = [ctypes.c_char_p]
            return cls(library.nvtxRangePushA, library.nvtxRangePop, text=False)
        try:
            from torch.cuda import nvtx as torch_nvtx
        except ImportError:
            raise DeviceUnavailableError(
                "--nvtx: no NVTX library (libnvToolsExt.so) and no PyTorch to provide one; install nvidia-nvtx or torch"
            ) from None
        return cls(torch_nvtx.range_push, torch_nvtx.range_pop, text=True)

    def push(self, name: bytes) -> None:
        self._push(name.decode() if self._text else name)

    def pop(self) -> None:
        self._pop()
