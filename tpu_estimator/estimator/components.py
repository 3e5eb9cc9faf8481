"""The one place where the user's settings register `StateComponent`s (model/components.py).

A new kind of training state is one module (its component) and one line here.
Each component's package is imported only when its setting asks for it.
"""

from __future__ import annotations

from tpu_estimator.api.run_config import RunConfig
from tpu_estimator.model.components import StateComponent


def registered(config: RunConfig) -> tuple[StateComponent, ...]:
    """The components `config` asks for, in the order their hooks run."""
    found: list[StateComponent] = []
    if config.tpu_config.precision_policy == "mixed_float16":
        from tpu_estimator.extras.loss_scale import DynamicLossScale

        found.append(DynamicLossScale())
    decay = config.tpu_config.moving_average_decay
    if decay is not None:
        from tpu_estimator.extras.moving_average import MovingAverage

        found.append(MovingAverage(float(decay)))
    return tuple(found)
