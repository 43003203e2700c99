"""numpyro: stochastic variational inference (AutoNormal guide, optax-backed Adam) on a Bayesian
linear regression; one jit'd SVI update. Region: scope "step".
"""

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoNormal

from replayfmt.capture import scope


def model(x, y=None):
    w = numpyro.sample("w", dist.Normal(jnp.zeros(x.shape[1]), 1.0).to_event(1))
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    numpyro.sample("y", dist.Normal(x @ w + b, sigma), obs=y)


k1, k2, k3 = jax.random.split(jax.random.PRNGKey(6), 3)
x = jax.random.normal(k1, (1024, 16))
y = x @ jnp.arange(16.0) / 16 + 0.1 * jax.random.normal(k2, (1024,))
svi = SVI(model, AutoNormal(model), numpyro.optim.Adam(1e-2), Trace_ELBO())
state = svi.init(k3, x, y)
update = jax.jit(svi.update)
state, loss = update(state, x, y)
jax.block_until_ready(loss)
with scope("step"):
    state, loss = update(state, x, y)
    jax.block_until_ready((state, loss))
print(f"elbo loss {float(loss):.4f}")
