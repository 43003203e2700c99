"""A JAX training step that donates its parameters and optimizer state (XLA's defaults), as training
loops do: the arrays it reads are deleted before its kernels run. optax's adamw. Region: scope "step".
"""

import functools

import jax
import jax.numpy as jnp
import optax

from replayfmt.capture import scope

k1, k2, k3 = jax.random.split(jax.random.PRNGKey(2), 3)
params = {"w": jax.random.normal(k1, (512, 512)) * 0.03, "v": jax.random.normal(k2, (512, 64)) * 0.03}
x = jax.random.normal(k3, (64, 512))
optimizer = optax.adamw(3e-4, weight_decay=1e-2)
opt_state = optimizer.init(params)


def loss_fn(p, x):
    return jnp.mean(jax.nn.gelu(x @ p["w"]) @ p["v"]) ** 2


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
