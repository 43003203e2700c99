"""flax.linen: a transformer encoder block (multi-head self-attention, layer norm, MLP) in
inference, jit'd, XLA's defaults. Region: scope "step".
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from replayfmt.capture import scope


class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = x + nn.MultiHeadDotProductAttention(num_heads=4)(nn.LayerNorm()(x))
        h = nn.Dense(512)(nn.LayerNorm()(x))
        return x + nn.Dense(128)(nn.gelu(h))


model = Block()
k1, k2 = jax.random.split(jax.random.PRNGKey(4))
x = jax.random.normal(k1, (8, 64, 128))
params = model.init(k2, x)
forward = jax.jit(model.apply)
out = forward(params, x)
jax.block_until_ready(out)
with scope("step"):
    out = forward(params, x)
    jax.block_until_ready(out)
print(f"mean {float(jnp.mean(out)):.6f}")
