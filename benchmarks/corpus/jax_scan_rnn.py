"""JAX control flow: an RNN unrolled with lax.scan and its gradient (a while loop in XLA's command
buffers), jit'd with XLA's defaults. Region: scope "step".
"""

import jax
import jax.numpy as jnp

from replayfmt.capture import scope

k1, k2, k3 = jax.random.split(jax.random.PRNGKey(7), 3)
w = jax.random.normal(k1, (128, 128)) * 0.05
u = jax.random.normal(k2, (64, 128)) * 0.05
xs = jax.random.normal(k3, (32, 16, 64))  # time, batch, features


def loss_fn(w, u, xs):
    def cell(h, x):
        h = jnp.tanh(h @ w + x @ u)
        return h, h.sum()

    _, sums = jax.lax.scan(cell, jnp.zeros((16, 128)), xs)
    return jnp.mean(sums**2)


grad = jax.jit(jax.value_and_grad(loss_fn, argnums=(0, 1)))
loss, grads = grad(w, u, xs)
jax.block_until_ready(grads)
with scope("step"):
    loss, grads = grad(w, u, xs)
    jax.block_until_ready((loss, grads))
print(f"loss {float(loss):.6f}")
