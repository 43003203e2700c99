"""JAX as it runs by default: a jit'd MLP training step with optax's adam (XLA's defaults: the
preallocated arena, command buffers updated between launches). Region: scope "step" (--scope step).
"""

import jax
import jax.numpy as jnp
import optax

from replayfmt.capture import scope

key = jax.random.PRNGKey(0)
k1, k2, k3, k4 = jax.random.split(key, 4)
params = {
    "w1": jax.random.normal(k1, (256, 512)) * 0.05,
    "b1": jnp.zeros(512),
    "w2": jax.random.normal(k2, (512, 10)) * 0.05,
    "b2": jnp.zeros(10),
}
x = jax.random.normal(k3, (128, 256))
y = jax.nn.one_hot(jax.random.randint(k4, (128,), 0, 10), 10)
optimizer = optax.adam(1e-3)
opt_state = optimizer.init(params)


def loss_fn(p, x, y):
    h = jax.nn.relu(x @ p["w1"] + p["b1"])
    return optax.softmax_cross_entropy(h @ p["w2"] + p["b2"], y).mean()


@jax.jit
def step(p, s, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(p, x, y)
    updates, s = optimizer.update(grads, s, p)
    return optax.apply_updates(p, updates), s, loss


for _ in range(2):  # compiled and warmed up outside the region
    params, opt_state, loss = step(params, opt_state, x, y)
jax.block_until_ready(loss)
with scope("step"):
    for _ in range(2):
        params, opt_state, loss = step(params, opt_state, x, y)
    jax.block_until_ready((params, opt_state, loss))
print(f"loss {float(loss):.6f}")
