"""A stream callback (cuLaunchHostFunc through torch's record_stream-free path: CuPy)."""

import cupy as cp

x = cp.ones(16, dtype=cp.float32)
stream = cp.cuda.Stream(non_blocking=True)
with stream:
    x *= 2
    stream.launch_host_func(lambda _: None, None)
stream.synchronize()
