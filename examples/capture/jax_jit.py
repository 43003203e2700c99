"""A jit'd JAX training step (a two-layer MLP, about 4 MB of parameters, SGD), with XLA's default
settings: it preallocates most of the device's memory as one arena and runs the step through its
command buffers. A few steps (the first argument, default 3), then a checksum. ``--donate``
donates the parameters to the step, as training loops do.

python -m replayfmt.capture -o jax.kreplay examples/capture/jax_jit.py
run-replay --verify --tolerance jax.kreplay
"""

import functools
import sys

import jax
import jax.numpy as jnp

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 3
DONATE = "--donate" in sys.argv


def init(key: jax.Array) -> dict[str, jax.Array]:
    k1, k2 = jax.random.split(key)
    return {
        "w1": jax.random.normal(k1, (512, 1536), jnp.float32) * 0.02,
        "b1": jnp.zeros((1536,), jnp.float32),
        "w2": jax.random.normal(k2, (1536, 128), jnp.float32) * 0.02,
        "b2": jnp.zeros((128,), jnp.float32),
    }


def loss(params: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
    hidden = jax.nn.gelu(x @ params["w1"] + params["b1"])
    logits = hidden @ params["w2"] + params["b2"]
    return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * y, axis=-1))


@functools.partial(jax.jit, donate_argnums=(0,) if DONATE else ())
def step(params: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> tuple[dict[str, jax.Array], jax.Array]:
    value, grads = jax.value_and_grad(loss)(params, x, y)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), value


key_params, key_x, key_y = jax.random.split(jax.random.PRNGKey(0), 3)
params = init(key_params)
x = jax.random.normal(key_x, (256, 512), jnp.float32)
y = jax.nn.one_hot(jax.random.randint(key_y, (256,), 0, 128), 128)
for _ in range(STEPS):
    params, value = step(params, x, y)
checksum = float(sum(jnp.sum(jnp.abs(p)) for p in jax.tree.leaves(params)))
print(f"loss {float(value):.6f} checksum {checksum:.6f}")
