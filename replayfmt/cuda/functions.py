"""What the driver says about a loaded kernel function."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_MAX_PARAMETERS = 4096  # far above any kernel's; the driver answers an error past the last one


def parameter_layout(
    cu: Any, handle: Any, param_info: Callable[[Any, int], Any] | None = None
) -> list[tuple[int, int]]:
    """(offset, size) of every parameter of a function, in order, as driver ``cu`` reports them.

    ``param_info`` is ``cu.cuFuncGetParamInfo`` for a CUfunction (the default) or
    ``cu.cuKernelGetParamInfo`` for a CUkernel."""
    info = param_info or cu.cuFuncGetParamInfo
    layout = []
    for index in range(_MAX_PARAMETERS):
        err, offset, size = info(handle, index)
        if err != cu.CUresult.CUDA_SUCCESS:
            break
        layout.append((int(offset), int(size)))
    return layout
