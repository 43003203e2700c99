"""A host function in a stream's order (cuLaunchHostFunc, here through CuPy): replayed as a host
step that does nothing, in the same place.

python -m replayfmt.capture -o host.kreplay examples/capture/cupy_host_function.py
"""

import cupy as cp

calls = []
x = cp.ones(1 << 16, dtype=cp.float32)
stream = cp.cuda.Stream(non_blocking=True)
with stream:
    x *= 2
    stream.launch_host_func(lambda arg: calls.append(arg), "after the multiply")
    x += 1
stream.synchronize()
assert calls == ["after the multiply"] and float(x[0]) == 3.0
print("host function ran", calls)
