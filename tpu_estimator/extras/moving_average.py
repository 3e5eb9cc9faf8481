"""`MovingAverage`: exponential moving averages of the parameters, as a `StateComponent`.

After each training step `average = decay * average + (1 - decay) * params`
(as `tf.train.ExponentialMovingAverage(decay)` without `num_updates`),
starting from the initial (or warm-started) parameters. Training uses the
raw parameters; evaluation, prediction and export use the averages, as TF
TPU models (EfficientNet, ResNet) did by restoring the averages for
evaluation. The averages are held like the parameters (same shapes and
shardings), so they restore onto any device count as the parameters do.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from tpu_estimator.model.state import TrainState

NAME = "moving_average"


@dataclasses.dataclass(frozen=True)
class MovingAverage:
    """The averages of `TrainState.params` with `decay` (a `StateComponent`)."""

    decay: float
    name: str = NAME
    setting: str = "TPUConfig.moving_average_decay"

    def init(self, state: TrainState) -> Any:
        return jax.tree.map(jnp.copy, state.params)

    def specs(self, extra: Any, state_specs: TrainState) -> Any:
        return state_specs.params  # held as the parameters are

    def after_step(self, extra: Any, state: TrainState) -> Any:
        d = self.decay

        def average(avg: jax.Array, p: jax.Array) -> jax.Array:
            return (d * avg + (1.0 - d) * p).astype(avg.dtype)

        return jax.tree.map(average, extra, state.params)

    def inference_variables(self, extra: Any, variables: dict[str, Any]) -> dict[str, Any]:
        return {**variables, "params": extra}
