"""Module globals the host wrote before the region, as cuFFT's do: a ``__device__`` pointer to an
array and a ``__constant__`` table, both set with host-to-device copies into the module's own
storage (what cudaMemcpyToSymbol does). The kernel names neither in its parameters; a fresh
module load leaves the pointer zero, so a replay that does not restore (and relocate) it faults."""

import ctypes
import sys
from pathlib import Path

import cupy as cp
import numpy as np

from replayfmt.capture import scope

SOURCE = (Path(__file__).resolve().parents[2] / "kernels" / "module_globals.cu").read_text()
n = 4096
module = cp.RawModule(code=SOURCE)
gather = module.get_function("gather")
data = cp.arange(n, dtype=cp.float32) / 7
out = cp.zeros(n, dtype=cp.float32)
pointer = ctypes.c_uint64(data.data.ptr)
module.get_global("base").copy_from_host(ctypes.addressof(pointer), 8)
table = np.array([0.5, 1.5, 2.5, 3.5], dtype=np.float32)
module.get_global("scale").copy_from_host(table.ctypes.data, table.nbytes)
gather((n // 256,), (256,), (out, np.int32(n)))  # warm-up: the region starts from written globals
cp.cuda.Device().synchronize()
with scope(sys.argv[1] if len(sys.argv) > 1 else "step"):
    gather((n // 256,), (256,), (out, np.int32(n)))
    cp.cuda.Device().synchronize()
expected = cp.arange(n, dtype=cp.float32) / 7 * cp.asarray(np.tile(table, n // 4)) + 1
assert bool(cp.allclose(out, expected)), "the program itself went wrong"
print(f"sum {float(out.sum()):.3f}")
