"""flax.linen: a small CNN's training step on random images with optax's adamw (XLA's defaults).
Region: scope "step".
"""

import flax.linen as nn
import jax
import optax

from replayfmt.capture import scope


class CNN(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(16, (3, 3))(x))
        x = nn.avg_pool(x, (2, 2), strides=(2, 2))
        x = nn.relu(nn.Conv(32, (3, 3))(x))
        x = x.reshape((x.shape[0], -1))
        return nn.Dense(10)(x)


model = CNN()
k1, k2, k3 = jax.random.split(jax.random.PRNGKey(3), 3)
images = jax.random.normal(k1, (32, 28, 28, 1))
labels = jax.random.randint(k2, (32,), 0, 10)
params = model.init(k3, images)
optimizer = optax.adamw(1e-3)
opt_state = optimizer.init(params)


@jax.jit
def step(params, opt_state, images, labels):
    def loss_fn(p):
        logits = model.apply(p, images)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


params, opt_state, loss = step(params, opt_state, images, labels)
jax.block_until_ready(loss)
with scope("step"):
    params, opt_state, loss = step(params, opt_state, images, labels)
    jax.block_until_ready((params, opt_state, loss))
print(f"loss {float(loss):.6f}")
