"""`TrainState`: everything that training updates, as one immutable pytree."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct


@struct.dataclass
class TrainState:
    """Parameters, other Flax collections, optimizer state, step and RNG key.

    Attributes:
      params: the `params` collection (trained).
      collections: other Flax collections (e.g. `batch_stats`), updated in TRAIN.
      opt_state: the optax state of `train_op`.
      step: the global step (int32 scalar).
      rng: the base PRNG key (uint32[2]); per-step, per-replica keys fold in
        the step and the replica index, so a resumed run draws the same numbers.
      extras: the state of the run's `StateComponent`s (model/components.py) by
        component name (e.g. `moving_average`, `embedding`: the tables of
        `embedding_config_spec`), or None without any.
    """

    params: Any
    collections: dict[str, Any]
    opt_state: Any
    step: jax.Array
    rng: jax.Array
    extras: Any = None

    @classmethod
    def create(
        cls, variables: dict[str, Any], tx: optax.GradientTransformation | None, seed: int
    ) -> "TrainState":
        """A step-0 state from Flax `variables`; `tx` None (eval/predict) gives no optimizer state."""
        variables = dict(variables)
        params = variables.pop("params", {})
        return cls(
            params=params,
            collections=variables,
            opt_state=tx.init(params) if tx is not None else None,
            step=jnp.zeros((), jnp.int32),
            rng=jax.random.PRNGKey(seed),
        )

    @property
    def variables(self) -> dict[str, Any]:
        """The Flax variables dict (`params` plus the other collections)."""
        return {"params": self.params, **self.collections}
