"""`DynamicLossScale`: the loss scaling of `precision_policy="mixed_float16"`, as a `StateComponent`.

Keras' `LossScaleOptimizer` semantics: the loss is multiplied by `scale`
(2**15 at first) before differentiation, so that small float16 gradients do
not flush to zero; the gradients are divided by it before the update. When
any gradient is not finite the update is skipped (parameters, optimizer state
and embedding tables stay as they were) and the scale halves (not below 1);
after 2000 finite steps in a row it doubles. A skipped step still advances
`global_step` (the step counter of the loops, checkpoints and hooks, as TF's
global_step did), while optax's own step count (inside the optimizer state)
does not advance, like Keras' `optimizer.iterations`.

State in `TrainState.extras["loss_scale"]`: `scale` (float32) and
`good_steps` (int32, finite steps since the last change), checkpointed and
read as `loss_scale/scale`, `loss_scale/good_steps`. A checkpoint written
without them (another precision policy) is used as it is, the scale starting
from 2**15.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from tpu_estimator.model.state import TrainState
from tpu_estimator.parallel.collectives import replica_mean

NAME = "loss_scale"


@dataclasses.dataclass(frozen=True)
class DynamicLossScale:
    """A dynamic loss scale (a `StateComponent` with `scale_loss` and `gradients` hooks)."""

    initial_scale: float = 2.0**15
    growth_interval: int = 2000
    name: str = NAME
    setting: str = "TPUConfig.precision_policy='mixed_float16'"
    optional: bool = True  # a checkpoint written with another policy: the scale starts afresh

    def init(self, state: TrainState) -> Any:
        return {"scale": jnp.asarray(self.initial_scale, jnp.float32), "good_steps": jnp.zeros((), jnp.int32)}

    def specs(self, extra: Any, state_specs: TrainState) -> Any:
        return {"scale": P(), "good_steps": P()}

    def after_step(self, extra: Any, state: TrainState) -> Any:
        return extra  # advanced in `gradients`

    def inference_variables(self, extra: Any, variables: dict[str, Any]) -> dict[str, Any]:
        return variables

    def scale_loss(self, extra: Any, loss: jax.Array) -> jax.Array:
        return loss.astype(jnp.float32) * extra["scale"]

    def gradients(self, extra: Any, grads: Any) -> tuple[Any, jax.Array, Any]:
        scale = extra["scale"]
        grads = jax.tree.map(lambda g: (g / scale).astype(g.dtype), grads)
        leaves = jax.tree.leaves(grads)
        finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(g)) for g in leaves])) if leaves else jnp.bool_(True)
        finite = replica_mean(finite.astype(jnp.float32)) == 1.0  # one decision on every replica
        good = jnp.where(finite, extra["good_steps"] + 1, 0)
        grow = good >= self.growth_interval
        new_scale = jnp.where(finite, jnp.where(grow, scale * 2.0, scale), jnp.maximum(scale / 2.0, 1.0))
        return grads, finite, {"scale": new_scale, "good_steps": jnp.where(grow, 0, good).astype(jnp.int32)}
