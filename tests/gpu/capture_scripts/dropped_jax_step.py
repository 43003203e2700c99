"""A jitted JAX step run once to compile, then once in a scope whose result is dropped at once:
XLA frees the array in its arena with no driver call and no hook. Command buffers are off so
that each kernel is a launch of its own (a test makes one of them wrong).

    python -m replayfmt.capture -o step.kreplay --scope step dropped_jax_step.py
"""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_gpu_enable_command_buffer=").strip()

import jax  # (after XLA_FLAGS)
import jax.numpy as jnp

import replayfmt.capture


@jax.jit
def step(x: jax.Array, w: jax.Array) -> jax.Array:
    return jnp.tanh(x @ w) * 2.0 + jnp.sin(x)


key_x, key_w = jax.random.split(jax.random.PRNGKey(0))
x = jax.random.normal(key_x, (512, 512))
w = jax.random.normal(key_w, (512, 512)) / 32
step(x, w).block_until_ready()  # compiled and run once
with replayfmt.capture.scope("step"):
    step(x, w)  # the result is dropped at once
print("ok")
