"""JAX: scaled dot-product attention written with jnp and vmap over heads, bf16 inputs, jit'd
inference with XLA's defaults. Region: scope "step".
"""

import jax
import jax.numpy as jnp

from replayfmt.capture import scope


def attention(q, k, v):
    scores = (q @ k.T) / jnp.sqrt(q.shape[-1]).astype(q.dtype)
    return jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(v.dtype) @ v


k1, k2, k3 = jax.random.split(jax.random.PRNGKey(8), 3)
shape = (8, 256, 64)  # heads, tokens, head dim
q, k, v = (jax.random.normal(key, shape, jnp.bfloat16) for key in (k1, k2, k3))
forward = jax.jit(jax.vmap(attention))
out = forward(q, k, v)
jax.block_until_ready(out)
with scope("step"):
    out = forward(q, k, v)
    jax.block_until_ready(out)
print(f"mean {float(jnp.mean(out.astype(jnp.float32))):.6f}")
