"""JAX's FFTs (cuFFT through XLA): a jitted frequency-domain low-pass filter of a batch of 2-D
fields and its gradient with respect to the filter. Region: scope "step"."""

import jax
import jax.numpy as jnp

from replayfmt.capture import scope

key = jax.random.PRNGKey(0)
fields = jax.random.normal(key, (16, 256, 256))
ky, kx = jnp.meshgrid(jnp.fft.fftfreq(256), jnp.fft.rfftfreq(256), indexing="ij")
cutoff = jnp.full((256, 129), 0.2)


def loss(cut):
    response = jax.nn.sigmoid((cut - jnp.sqrt(kx**2 + ky**2)) * 40.0)
    smooth = jnp.fft.irfft2(jnp.fft.rfft2(fields) * response, s=(256, 256))
    return jnp.mean((smooth - fields) ** 2)


step = jax.jit(jax.value_and_grad(loss))
value, grad = step(cutoff)
value.block_until_ready()
with scope("step"):
    value, grad = step(cutoff)
    value.block_until_ready()
print(f"loss {float(value):.5f} grad {float(jnp.abs(grad).mean()):.3e}")
