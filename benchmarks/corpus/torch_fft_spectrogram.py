"""PyTorch's FFTs (cuFFT): a short-time Fourier transform of a batch of signals, a learned
filter applied in the frequency domain with rfft2/irfft2, forward and backward. Region: scope "step"."""

import torch

from replayfmt.capture import scope

torch.manual_seed(0)
signals = torch.randn(8, 16000, device="cuda")
window = torch.hann_window(512, device="cuda")
gain = torch.randn(257, 1, device="cuda", requires_grad=True)
image = torch.randn(4, 3, 128, 128, device="cuda")
kernel = torch.randn(3, 128, 65, device="cuda", dtype=torch.complex64, requires_grad=True)


def step():
    spec = torch.stft(signals, n_fft=512, hop_length=128, window=window, return_complex=True)
    power = (spec.abs() * gain).pow(2).mean()
    filtered = torch.fft.irfft2(torch.fft.rfft2(image) * kernel, s=image.shape[-2:])
    loss = power + filtered.pow(2).mean()
    loss.backward()
    return loss


step()
torch.cuda.synchronize()
with scope("step"):
    loss = step()
    torch.cuda.synchronize()
print(f"loss {float(loss):.4f} grad {float(gain.grad.abs().mean()):.5f}")
