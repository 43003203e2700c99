"""JAX with XLA_PYTHON_CLIENT_PREALLOCATE=false (buffers allocated as needed, no arena): a jit'd
training step with optax's sgd with momentum, parameters donated. Region: scope "step".
"""

import os

os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"

import functools

import jax
import jax.numpy as jnp
import optax

from replayfmt.capture import scope

k1, k2, k3 = jax.random.split(jax.random.PRNGKey(1), 3)
params = [jax.random.normal(k1, (384, 384)) * 0.05, jax.random.normal(k2, (384, 384)) * 0.05]
x = jax.random.normal(k3, (256, 384))
optimizer = optax.sgd(1e-2, momentum=0.9)
opt_state = optimizer.init(params)


def loss_fn(p, x):
    h = jnp.tanh(x @ p[0])
    return jnp.mean((h @ p[1] - x) ** 2)


@functools.partial(jax.jit, donate_argnums=(0, 1))
def step(p, s, x):
    loss, grads = jax.value_and_grad(loss_fn)(p, x)
    updates, s = optimizer.update(grads, s, p)
    return optax.apply_updates(p, updates), s, loss


params, opt_state, loss = step(params, opt_state, x)
jax.block_until_ready(loss)
with scope("step"):
    params, opt_state, loss = step(params, opt_state, x)
    jax.block_until_ready((params, opt_state, loss))
print(f"loss {float(loss):.6f}")
