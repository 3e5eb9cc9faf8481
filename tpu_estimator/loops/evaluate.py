"""The evaluation programs: per batch, per loop of batches, and per example for a padded
final batch.

Full batches run model_fn as written. A final batch that had to be padded
runs model_fn once per example (`jax.vmap` over a batch of 1), so the loss,
`eval_metrics` tensors and `eval_metric_ops` of padding rows can be dropped
exactly on the host.

`eval_metrics=(metric_fn, tensors)`: in the programs of full batches,
metric_fn runs inside the program on each batch's tensors, gathered over the
replicas as the host would see them (`on_device_metrics`), and the program
returns its metric states (a few numbers) instead of the tensors. A
metric_fn that does not trace (numpy on values, Python control flow on
them) runs on the host, on the fetched tensors: the same states either way,
per batch, up to float32 rounding on the device.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax import lax

from tpu_estimator.metrics import Metric
from tpu_estimator.model import components
from tpu_estimator.loops.replica import REPLICATED, Placement, over_replicas, replica_key, specs_of
from tpu_estimator.model.module import BoundModel
from tpu_estimator.model.spec_view import SpecView
from tpu_estimator.parallel.mesh import Topology

log = logging.getLogger("tpu_estimator")

ViewFn = Callable[[Any], SpecView]


def eval_step(model: BoundModel, view: ViewFn, variables: Any, step: Any, rng: Any, batch: Any) -> dict[str, Any]:
    """One replica's batch: loss [1], metric tensors (batch-major), metric states [1, ...]."""
    features, labels = batch
    variables, features = components.forward_inputs(model.components, variables, features)
    spec, _ = model.apply(variables, features, labels, rng=replica_key(rng, step))
    sv = view(spec)
    ops = jax.tree.map(lambda x: jnp.asarray(x)[None], sv.metric_ops or {})
    return {"loss": jnp.reshape(sv.loss, (1,)), "tensors": sv.metric_tensors, "ops": ops}


def example_step(model: BoundModel, view: ViewFn, variables: Any, step: Any, rng: Any, batch: Any) -> dict[str, Any]:
    """Like `eval_step`, but model_fn sees one example at a time: every output is per example."""
    features, labels = batch
    variables, features = components.forward_inputs(model.components, variables, features)  # once, for the batch
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


def on_device_metrics(metric_fn: Callable[..., Any] | None, out: dict[str, Any], *, stacked: bool) -> dict[str, Any]:
    """`out` with its "tensors" replaced by "states": metric_fn's states of each batch
    (`stacked`: of each of the k batches on the leading axis). `out` as it is when there is
    no metric_fn, or it does not trace to a dict of metric states (the host then calls it on
    the fetched tensors, and reports what is wrong with it)."""
    if metric_fn is None:
        return out

    def call(tensors: Any) -> Any:
        return metric_fn(**tensors) if isinstance(tensors, dict) else metric_fn(*tensors)

    try:
        states = (jax.vmap(call) if stacked else call)(out["tensors"])
    except Exception as e:  # noqa: BLE001  (not traceable: the host runs it, and raises what is wrong)
        log.info("metric_fn runs on the host, on each batch's fetched tensors: it does not trace (%s).",
                 type(e).__name__)
        return out
    if not isinstance(states, dict) or not all(isinstance(v, Metric) for v in states.values()):
        return out
    return {"loss": out["loss"], "ops": out["ops"], "states": states}


def eval_program(
    model: BoundModel,
    view: ViewFn,
    topology: Topology,
    *,
    per_example: bool,
    placement: Placement = Placement(),
    metric_fn: Callable[..., Any] | None = None,
) -> Callable[..., Any]:
    """jit(variables, step, rng, batch) -> outputs concatenated over replicas (see `Placement`);
    `metric_fn` runs in the program (see `on_device_metrics`) unless `per_example`."""
    step_fn = example_step if per_example else eval_step

    def run(v: Any, s: Any, r: Any, b: Any) -> Any:
        return placement.collect(step_fn(model, view, v, s, r, placement.constrain(b)))

    run.__name__ = "evaluate_examples" if per_example else "evaluate_batch"

    sharded = over_replicas(
        run,
        topology,
        in_specs=lambda v, *_: (specs_of(v, model.components), REPLICATED, REPLICATED, placement.in_spec()),
        out_specs=placement.out_spec(),
    )
    if per_example:
        return jax.jit(sharded)

    def evaluate_batch(v: Any, s: Any, r: Any, b: Any) -> Any:
        return on_device_metrics(metric_fn, sharded(v, s, r, b), stacked=False)

    return jax.jit(evaluate_batch)


def eval_scan_program(
    model: BoundModel,
    view: ViewFn,
    topology: Topology,
    placement: Placement = Placement(),
    metric_fn: Callable[..., Any] | None = None,
) -> Callable[..., Any]:
    """jit(variables, step, rng, batches) -> `eval_program`'s outputs stacked over k full
    batches, in one program (`lax.map`): an on-device evaluation loop. `batches` is one
    tree stacked on a leading axis of k (the feeder stacked it), or a list of k batches
    (stacked inside the program). One compilation per k."""

    def run(v: Any, s: Any, r: Any, blocks: Any) -> Any:
        blocks = placement.constrain(blocks, leading=1)
        outs = lax.map(lambda b: eval_step(model, view, v, s, r, b), blocks)
        return placement.collect(outs, leading=1)

    sharded = over_replicas(
        run,
        topology,
        in_specs=lambda v, *_: (specs_of(v, model.components), REPLICATED, REPLICATED, placement.in_spec(1)),
        out_specs=placement.out_spec(1),
    )

    def evaluate_loop(v: Any, s: Any, r: Any, batches: Any) -> Any:
        return on_device_metrics(metric_fn, sharded(v, s, r, stacked(batches)), stacked=True)

    return jax.jit(evaluate_loop)


def stacked(batches: Any) -> Any:
    """k batches (a list of pytrees alike) as one with a leading axis of k; a tree that is
    stacked already as it is."""
    if not isinstance(batches, list):
        return batches
    return jax.tree.map(lambda *xs: jnp.stack(xs), *batches)
