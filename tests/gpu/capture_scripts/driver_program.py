"""What the capture scripts that drive CUDA through cuda-python's driver bindings share: a call
checked (the program exits naming the error, as a program would), and CUDA C++ built with nvcc for
the architecture the test passes (argv[1], default sm_90) and loaded in device 0's primary
context."""

import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from cuda.bindings import driver as cu


def ok(result: Any) -> Any:
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != cu.CUresult.CUDA_SUCCESS:
        sys.exit(f"CUDA error: {err}")
    return rest[0] if len(rest) == 1 else rest


def load_module(source: Path | str) -> Any:
    """``source`` (a .cu file, or CUDA C++ text) built to a cubin and loaded on device 0."""
    arch = sys.argv[1] if len(sys.argv) > 1 else "sm_90"
    with tempfile.TemporaryDirectory() as tmp:
        if isinstance(source, str):
            Path(f"{tmp}/k.cu").write_text(source)
            source = Path(f"{tmp}/k.cu")
        subprocess.run(["nvcc", "-cubin", f"-arch={arch}", "-o", f"{tmp}/k.cubin", str(source)], check=True)
        image = Path(f"{tmp}/k.cubin").read_bytes()
    ok(cu.cuInit(0))
    ok(cu.cuCtxSetCurrent(ok(cu.cuDevicePrimaryCtxRetain(ok(cu.cuDeviceGet(0))))))
    return ok(cu.cuModuleLoadData(image))
