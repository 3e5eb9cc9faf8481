"""The evaluation programs: per batch, and per example for a padded final batch.

Full batches run model_fn as written. A final batch that had to be padded
runs model_fn once per example (`jax.vmap` over a batch of 1), so the loss,
`eval_metrics` tensors and `eval_metric_ops` of padding rows can be dropped
exactly on the host.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax import lax

from tpu_estimator.loops.embedded import looked_up
from tpu_estimator.loops.replica import REPLICATED, Placement, over_replicas, replica_key, specs_of
from tpu_estimator.model.module import BoundModel
from tpu_estimator.model.spec_view import SpecView
from tpu_estimator.parallel.mesh import Topology

ViewFn = Callable[[Any], SpecView]


def eval_step(model: BoundModel, view: ViewFn, variables: Any, step: Any, rng: Any, batch: Any) -> dict[str, Any]:
    """One replica's batch: loss [1], metric tensors (batch-major), metric states [1, ...]."""
    features, labels = batch
    variables, features = looked_up(model.embedding, variables, features)
    spec, _ = model.apply(variables, features, labels, rng=replica_key(rng, step))
    sv = view(spec)
    ops = jax.tree.map(lambda x: jnp.asarray(x)[None], sv.metric_ops or {})
    return {"loss": jnp.reshape(sv.loss, (1,)), "tensors": sv.metric_tensors, "ops": ops}


def example_step(model: BoundModel, view: ViewFn, variables: Any, step: Any, rng: Any, batch: Any) -> dict[str, Any]:
    """Like `eval_step`, but model_fn sees one example at a time: every output is per example."""
    features, labels = batch
    variables, features = looked_up(model.embedding, variables, features)  # once, for the batch
    batch = (features, labels)

    def one(example: Any) -> dict[str, Any]:
        single = jax.tree.map(lambda x: x[None], example)
        out = eval_step(model, view, variables, step, rng, single)
        return {
            "loss": out["loss"][0],
            "tensors": jax.tree.map(lambda x: x[0], out["tensors"]),
            "ops": jax.tree.map(lambda x: x[0], out["ops"]),
        }

    return jax.vmap(one)(batch)


def eval_program(
    model: BoundModel,
    view: ViewFn,
    topology: Topology,
    *,
    per_example: bool,
    placement: Placement = Placement(),
) -> Callable[..., Any]:
    """jit(variables, step, rng, batch) -> outputs concatenated over replicas (see `Placement`)."""
    step_fn = example_step if per_example else eval_step

    def run(v: Any, s: Any, r: Any, b: Any) -> Any:
        return placement.collect(step_fn(model, view, v, s, r, placement.constrain(b)))

    run.__name__ = "evaluate_examples" if per_example else "evaluate_batch"

    sharded = over_replicas(
        run,
        topology,
        in_specs=lambda v, *_: (specs_of(v), REPLICATED, REPLICATED, placement.in_spec()),
        out_specs=placement.out_spec(),
    )
    return jax.jit(sharded)


def eval_scan_program(
    model: BoundModel, view: ViewFn, topology: Topology, placement: Placement = Placement()
) -> Callable[..., Any]:
    """jit(variables, step, rng, [batch] * k) -> `eval_program`'s outputs stacked over k full
    batches, in one program (`lax.map`): an on-device evaluation loop. The batches are
    stacked inside the program (one compilation per k)."""

    def run(v: Any, s: Any, r: Any, blocks: Any) -> Any:
        blocks = placement.constrain(blocks, leading=1)
        outs = lax.map(lambda b: eval_step(model, view, v, s, r, b), blocks)
        return placement.collect(outs, leading=1)

    sharded = over_replicas(
        run,
        topology,
        in_specs=lambda v, *_: (specs_of(v), REPLICATED, REPLICATED, placement.in_spec(1)),
        out_specs=placement.out_spec(1),
    )

    def evaluate_loop(v: Any, s: Any, r: Any, batches: list[Any]) -> Any:
        return sharded(v, s, r, stack(batches))

    return jax.jit(evaluate_loop)


def stack(batches: list[Any]) -> Any:
    """k batches (pytrees alike) as one with a leading axis of k."""
    return jax.tree.map(lambda *xs: jnp.stack(xs), *batches)
