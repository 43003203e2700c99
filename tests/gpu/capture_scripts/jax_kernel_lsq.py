"""Kernel least squares in JAX, as jax-ml's examples write it: a Gaussian kernel's Gram matrix by
nested vmap, the regularised risk minimised by gradient descent with momentum under jit, checked
against the closed-form solve, and a prediction on new points. A whole program: captured with no
--scope (benchmarks/jax_whole_bench.py), its XLA autotuner's delay kernels included.

    python tests/gpu/capture_scripts/jax_kernel_lsq.py [n]
"""

from __future__ import annotations

import sys
from functools import partial

import jax
import jax.numpy as jnp


def gaussian(gamma: float, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.exp(-gamma * jnp.sum((x - y) ** 2))


def gram(kernel, xs: jax.Array, ys: jax.Array) -> jax.Array:
    return jax.vmap(lambda x: jax.vmap(lambda y: kernel(x, y))(ys))(xs)


def fit(kernel, xs: jax.Array, ys: jax.Array, regularization: float, steps: int) -> jax.Array:
    k = jax.jit(partial(gram, kernel))(xs, xs)

    def objective(v: jax.Array) -> jax.Array:
        return 0.5 * jnp.sum((k @ v - ys) ** 2) + regularization * jnp.sum(v**2)

    @jax.jit
    def update(state: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        v, velocity = state
        velocity = 0.9 * velocity - 2e-4 * jax.grad(objective)(v)
        return v + velocity, velocity

    state = (jnp.zeros(xs.shape[0]), jnp.zeros(xs.shape[0]))
    for _ in range(steps):
        state = update(state)
    exact = jnp.linalg.solve(k + 2 * regularization * jnp.eye(k.shape[0]), ys)  # the same minimum, closed form
    return state[0], exact


def main(n: int = 1024, steps: int = 300) -> float:
    key_x, key_w, key_t = jax.random.split(jax.random.PRNGKey(0), 3)
    xs = jax.random.normal(key_x, (n, 8))
    ys = jnp.sin(xs @ jax.random.normal(key_w, (8,)))
    kernel = partial(gaussian, 0.5)
    v, exact = fit(kernel, xs, ys, 0.1, steps)
    tests = jax.random.normal(key_t, (256, 8))
    predict = jax.jit(jax.vmap(lambda t: jnp.sum(v * jax.vmap(lambda x: kernel(t, x))(xs))))
    error = float(jnp.mean((predict(tests) - jnp.sin(tests @ jax.random.normal(key_w, (8,)))) ** 2))
    gap = float(jnp.max(jnp.abs(gram(kernel, xs, xs) @ (v - exact))))
    print(f"kernel least squares: n={n}, {steps} steps, test error {error:.4f}, distance to the solve {gap:.4f}")
    return error


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1024)
