"""CuPy's libraries: a 2-D FFT (cuFFT), a matrix product (cuBLAS) and a linear solve (cuSOLVER)
on random data. Region: scope "step"."""

import cupy as cp

from replayfmt.capture import scope

rng = cp.random.default_rng(1)
signal = rng.standard_normal((512, 512), dtype=cp.float32)
a = rng.standard_normal((256, 256), dtype=cp.float32) + 256 * cp.eye(256, dtype=cp.float32)
b = rng.standard_normal((256, 8), dtype=cp.float32)


def step():
    spectrum = cp.fft.fft2(signal)
    power = cp.abs(spectrum) ** 2
    gram = a @ a.T
    return power, cp.linalg.solve(gram, b)


step()
cp.cuda.Device().synchronize()
with scope("step"):
    power, solution = step()
    cp.cuda.Device().synchronize()
print(f"power {float(power.mean()):.2f} solution {float(cp.abs(solution).mean()):.6f}")
