"""A data-parallel training step of an MLP under jax.jit, its batch sharded over every GPU of one
process (a Mesh of two devices; the gradients' mean is XLA's all-reduce). Needs 2 GPUs.
Region: scope "step"."""

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from replayfmt.capture import scope

devices = jax.devices()[:2]
mesh = Mesh(devices, ("data",))
replicated, by_row = NamedSharding(mesh, PartitionSpec()), NamedSharding(mesh, PartitionSpec("data"))
key = jax.random.PRNGKey(0)
k1, k2, k3 = jax.random.split(key, 3)
params = jax.device_put(
    {"w1": jax.random.normal(k1, (512, 1024)) * 0.02, "w2": jax.random.normal(k2, (1024, 10)) * 0.02}, replicated
)
x = jax.device_put(jax.random.normal(k3, (512, 512)), by_row)
y = jax.device_put(jnp.arange(512) % 10, by_row)


def loss_fn(p, x, y):
    logits = jax.nn.relu(x @ p["w1"]) @ p["w2"]
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))


@jax.jit
def step(p, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(p, x, y)
    return jax.tree.map(lambda a, g: a - 0.1 * g, p, grads), loss


for _ in range(3):
    params, loss = step(params, x, y)
jax.block_until_ready(params)
with scope("step"):
    params, loss = step(params, x, y)
    jax.block_until_ready(params)
print(f"loss {float(loss):.4f}")
