"""DynamicLossScale (extras/loss_scale.py): Keras' LossScaleOptimizer rule, hook by hook."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from tpu_estimator.extras.loss_scale import DynamicLossScale
from tpu_estimator.parallel.collectives import single_replica


def test_the_scale_halves_on_overflow_and_doubles_after_growth_interval_finite_steps():
    ls = DynamicLossScale(initial_scale=8.0, growth_interval=2)
    extra = ls.init(None)
    assert float(ls.scale_loss(extra, jnp.float16(3.0))) == 24.0  # in float32
    finite = {"w": jnp.array([8.0, -16.0])}
    with single_replica():
        grads, ok, extra = ls.gradients(extra, finite)
        np.testing.assert_array_equal(grads["w"], [1.0, -2.0])  # unscaled
        assert bool(ok) and float(extra["scale"]) == 8.0 and int(extra["good_steps"]) == 1
        _, ok, extra = ls.gradients(extra, finite)
        assert bool(ok) and float(extra["scale"]) == 16.0 and int(extra["good_steps"]) == 0  # grown
        _, ok, extra = ls.gradients(extra, {"w": jnp.array([jnp.inf, 1.0])})
        assert not bool(ok) and float(extra["scale"]) == 8.0 and int(extra["good_steps"]) == 0
        _, ok, extra = ls.gradients(extra, {"w": jnp.array([jnp.nan, 1.0])})
        assert not bool(ok) and float(extra["scale"]) == 4.0
        small = ls.init(None) | {"scale": jnp.float32(1.0)}
        assert float(ls.gradients(small, {"w": jnp.array([jnp.inf])})[2]["scale"]) == 1.0  # not below 1
