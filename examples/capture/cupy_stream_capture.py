"""A CUDA graph made by stream capture (CuPy) and launched twice.

python -m replayfmt.capture -o captured_graph.kreplay examples/capture/cupy_stream_capture.py
"""

import cupy as cp

n = 1 << 16
x = cp.arange(n, dtype=cp.float32)
y = cp.empty_like(x)
z = cp.zeros_like(x)
stream = cp.cuda.Stream(non_blocking=True)
with stream:
    stream.begin_capture()
    cp.multiply(x, 2, out=y)  # nothing runs while the stream captures
    cp.add(y, z, out=z)
    graph = stream.end_capture()
graph.launch(stream)
graph.launch(stream)
stream.synchronize()
assert bool(cp.allclose(z, 4 * x))
print("stream capture ok", float(z.sum()))
