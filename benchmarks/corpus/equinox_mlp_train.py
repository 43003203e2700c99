"""equinox: an eqx.nn.MLP training step with optax's adam through eqx.filter_jit (XLA's defaults).
Region: scope "step".
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

from replayfmt.capture import scope

k1, k2, k3 = jax.random.split(jax.random.PRNGKey(5), 3)
model = eqx.nn.MLP(in_size=64, out_size=1, width_size=256, depth=3, key=k1)
x = jax.random.normal(k2, (512, 64))
y = jnp.sin(x.sum(axis=1, keepdims=True))
optimizer = optax.adam(1e-3)
opt_state = optimizer.init(eqx.filter(model, eqx.is_array))


@eqx.filter_jit
def step(model, opt_state, x, y):
    def loss_fn(m):
        return jnp.mean((jax.vmap(m)(x) - y) ** 2)

    loss, grads = eqx.filter_value_and_grad(loss_fn)(model)
    updates, opt_state = optimizer.update(grads, opt_state, eqx.filter(model, eqx.is_array))
    return eqx.apply_updates(model, updates), opt_state, loss


model, opt_state, loss = step(model, opt_state, x, y)
jax.block_until_ready(loss)
with scope("step"):
    model, opt_state, loss = step(model, opt_state, x, y)
    jax.block_until_ready((eqx.filter(model, eqx.is_array), opt_state, loss))
print(f"loss {float(loss):.6f}")
