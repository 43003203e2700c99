"""A ZeRO-style data-parallel training step written with shard_map over two GPUs of one process:
each device holds half of every weight's rows and half of the batch, all-gathers the weights
(lax.all_gather), takes the gradients of its half of the batch, reduce-scatters them
(lax.psum_scatter) and updates its own rows; the loss is averaged with lax.pmean. Needs 2 GPUs.
Region: scope "step"."""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from replayfmt.capture import scope

try:
    from jax import shard_map
except ImportError:  # older JAX
    from jax.experimental.shard_map import shard_map

devices = jax.devices()[:2]
n = len(devices)
mesh = Mesh(devices, ("data",))
k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
rows = NamedSharding(mesh, P("data"))
w1 = jax.device_put(jax.random.normal(k1, (512, 1024)) * 0.02, rows)
w2 = jax.device_put(jax.random.normal(k2, (1024, 16)) * 0.02, rows)
x = jax.device_put(jax.random.normal(k3, (1024, 512)), rows)
y = jax.device_put(jnp.arange(1024) % 16, rows)


def local_step(w1, w2, x, y):
    full1 = lax.all_gather(w1, "data", tiled=True)
    full2 = lax.all_gather(w2, "data", tiled=True)

    def loss_fn(a, b):
        logits = jax.nn.relu(x @ a) @ b
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))

    loss, (g1, g2) = jax.value_and_grad(loss_fn, argnums=(0, 1))(full1, full2)
    g1 = lax.psum_scatter(g1, "data", scatter_dimension=0, tiled=True) / n
    g2 = lax.psum_scatter(g2, "data", scatter_dimension=0, tiled=True) / n
    return w1 - 0.1 * g1, w2 - 0.1 * g2, lax.pmean(loss, "data")


specs = (P("data"), P("data"), P("data"), P("data"))
step = jax.jit(shard_map(local_step, mesh=mesh, in_specs=specs, out_specs=(P("data"), P("data"), P())))

for _ in range(3):
    w1, w2, loss = step(w1, w2, x, y)
jax.block_until_ready((w1, w2))
with scope("step"):
    w1, w2, loss = step(w1, w2, x, y)
    jax.block_until_ready((w1, w2, loss))
print(f"loss {float(loss):.4f}")
