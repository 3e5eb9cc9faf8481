"""The prediction program: model_fn in PREDICT mode on each replica's batch."""

from __future__ import annotations

from typing import Any, Callable

import jax
from jax import lax

from tpu_estimator.loops.evaluate import stacked
from tpu_estimator.model import components
from tpu_estimator.loops.replica import REPLICATED, Placement, over_replicas, replica_key, specs_of
from tpu_estimator.model.module import BoundModel
from tpu_estimator.model.spec_view import SpecView
from tpu_estimator.parallel.mesh import Topology

ViewFn = Callable[[Any], SpecView]


def predict_step(model: BoundModel, view: ViewFn, variables: Any, step: Any, rng: Any, features: Any) -> Any:
    """One replica's predictions (batch-major)."""
    variables, features = components.forward_inputs(model.components, variables, features)
    spec, _ = model.apply(variables, features, None, rng=replica_key(rng, step))
    return view(spec).predictions


def predict_program(
    model: BoundModel, view: ViewFn, topology: Topology, placement: Placement = Placement()
) -> Callable[..., Any]:
    """jit(variables, step, rng, features) -> predictions concatenated over replicas."""

    def predict_batch(v: Any, s: Any, r: Any, f: Any) -> Any:
        features = placement.constrain((f, None))[0]
        return placement.collect(predict_step(model, view, v, s, r, features))

    sharded = over_replicas(
        predict_batch,
        topology,
        in_specs=lambda v, *_: (specs_of(v, model.components), REPLICATED, REPLICATED, placement.in_spec(part=0)),
        out_specs=placement.out_spec(),
    )
    return jax.jit(sharded)


def predict_scan_program(
    model: BoundModel, view: ViewFn, topology: Topology, placement: Placement = Placement()
) -> Callable[..., Any]:
    """jit(variables, step, rng, features) -> predictions stacked over k batches, in one
    program (`lax.map`): an on-device prediction loop. `features`: stacked on a leading
    axis of k, or a list of k batches' (stacked inside the program)."""

    def run(v: Any, s: Any, r: Any, blocks: Any) -> Any:
        features = placement.constrain((blocks, None), leading=1)[0]
        preds = lax.map(lambda f: predict_step(model, view, v, s, r, f), features)
        return placement.collect(preds, leading=1)

    sharded = over_replicas(
        run,
        topology,
        in_specs=lambda v, *_: (
            specs_of(v, model.components), REPLICATED, REPLICATED, placement.in_spec(leading=1, part=0)
        ),
        out_specs=placement.out_spec(1),
    )

    def predict_loop(v: Any, s: Any, r: Any, batches: Any) -> Any:
        return sharded(v, s, r, stacked(batches))

    return jax.jit(predict_loop)
