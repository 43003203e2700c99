"""A diffrax adaptive ODE solve under jax.jit, run once to compile, then once in a scope whose
result is not kept (``keep``: kept past the scope). Issue 44: such a step verified nothing.

    python -m replayfmt.capture -o solve.kreplay --scope step dropped_diffrax_step.py [keep]
"""

import sys

import diffrax
import jax
import jax.numpy as jnp

import replayfmt.capture


@jax.jit
def solve(a: jax.Array, y0: jax.Array) -> jax.Array:
    term = diffrax.ODETerm(lambda t, y, args: -args @ jnp.tanh(y) + jnp.sin(t))
    controller = diffrax.PIDController(rtol=1e-6, atol=1e-6)
    saved = diffrax.SaveAt(ts=jnp.linspace(0.0, 2.0, 64))
    return diffrax.diffeqsolve(
        term, diffrax.Tsit5(), 0.0, 2.0, 0.01, y0, args=a, stepsize_controller=controller, saveat=saved
    ).ys


key_a, key_y = jax.random.split(jax.random.PRNGKey(0))
a = jax.random.normal(key_a, (256, 256)) / 16
y0 = jax.random.normal(key_y, (256,))
solve(a, y0).block_until_ready()  # compiled and run once
keep = sys.argv[1:] == ["keep"]
with replayfmt.capture.scope("step"):
    if keep:
        ys = solve(a, y0)
    else:
        solve(a, y0)  # the result is dropped at once
if keep:
    print("kept", float(ys[-1, 0]))
