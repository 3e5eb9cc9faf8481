"""The prediction program: model_fn in PREDICT mode on each replica's batch."""

from __future__ import annotations

from typing import Any, Callable

import jax

from tpu_estimator.loops._replica import BATCH, REPLICATED, over_replicas, replica_key
from tpu_estimator.model.module import BoundModel
from tpu_estimator.model.spec_view import SpecView
from tpu_estimator.parallel.mesh import Topology

ViewFn = Callable[[Any], SpecView]


def predict_step(model: BoundModel, view: ViewFn, variables: Any, step: Any, rng: Any, features: Any) -> Any:
    """One replica's predictions (batch-major)."""
    spec, _ = model.apply(variables, features, None, rng=replica_key(rng, step))
    return view(spec).predictions


def predict_program(model: BoundModel, view: ViewFn, topology: Topology) -> Callable[..., Any]:
    """jit(variables, step, rng, features) -> predictions concatenated over replicas."""
    sharded = over_replicas(
        lambda v, s, r, f: predict_step(model, view, v, s, r, f),
        topology,
        in_specs=(REPLICATED, REPLICATED, REPLICATED, BATCH),
        out_specs=BATCH,
    )
    return jax.jit(sharded)
