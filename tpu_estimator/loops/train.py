"""The training step (pure) and the programs that run it: a `lax.scan` loop, or one step.

`train_step(state, batch) -> (state, outputs)` computes one replica's
gradients, averages them over replicas and applies `train_op`. The estimator
picks a strategy: "scan" (iterations_per_loop steps in one program) or
"step" (one program per step, dispatched by the host; faster for
convolutions on XLA:CPU).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import optax
from jax import lax

from tpu_estimator.loops._replica import (
    REPLICATED,
    STACKED_BATCH,
    BATCH,
    over_replicas,
    replica_key,
)
from tpu_estimator.model.module import BoundModel
from tpu_estimator.model.spec_view import SpecView
from tpu_estimator.model.state import TrainState
from tpu_estimator.parallel.mesh import DATA, Topology
from tpu_estimator.summary._collect import collecting
from tpu_estimator.summary._collect import replicate as replicate_summaries

ViewFn = Callable[[Any], SpecView]


def train_step(
    model: BoundModel, view: ViewFn, state: TrainState, batch: tuple[Any, Any]
) -> tuple[TrainState, dict[str, Any]]:
    """One step on one replica: loss, gradients averaged over "data", update.

    Returns the new state and outputs: `loss` (mean over replicas) and
    `host_call` (this replica's host_call tensors, batch-major) and
    `summaries` (what model_fn recorded with `tpu_estimator.summary`, one copy).
    """
    features, labels = batch
    rng = replica_key(state.rng, state.step)
    mutable = sorted(state.collections)
    found: dict[str, SpecView] = {}

    def loss_fn(params: Any) -> tuple[jax.Array, tuple[Any, Any]]:
        with collecting() as summaries:
            spec, mutated = model.apply(
                {"params": params, **state.collections}, features, labels, rng=rng, mutable=mutable
            )
        found["spec"] = sv = view(spec)
        return sv.loss, (mutated, sv.host_call_tensors, summaries)

    (loss, (mutated, host_tensors, summaries)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        state.params
    )
    tx = found["spec"].train_op
    grads = lax.pmean(grads, DATA)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    new_state = state.replace(
        params=optax.apply_updates(state.params, updates),
        opt_state=opt_state,
        collections={**state.collections, **lax.pmean(dict(mutated), DATA)},
        step=state.step + 1,
    )
    outputs = {"loss": lax.pmean(loss, DATA), "host_call": host_tensors}
    return new_state, {**outputs, "summaries": replicate_summaries(summaries, DATA)}


def scan_program(model: BoundModel, view: ViewFn, topology: Topology) -> Callable[..., Any]:
    """jit(state, stacked batches [k, B, ...]) -> (state, outputs stacked over k steps)."""

    def loop(state: TrainState, blocks: Any) -> tuple[TrainState, dict[str, Any]]:
        return lax.scan(lambda s, b: train_step(model, view, s, b), state, blocks)

    sharded = over_replicas(
        loop,
        topology,
        in_specs=(REPLICATED, STACKED_BATCH),
        out_specs=(
            REPLICATED,
            {"loss": REPLICATED, "host_call": STACKED_BATCH, "summaries": REPLICATED},
        ),
    )
    return jax.jit(sharded, donate_argnums=0)


def step_program(model: BoundModel, view: ViewFn, topology: Topology) -> Callable[..., Any]:
    """jit(state, batch [B, ...]) -> (state, outputs of this step)."""
    sharded = over_replicas(
        lambda s, b: train_step(model, view, s, b),
        topology,
        in_specs=(REPLICATED, BATCH),
        out_specs=(
            REPLICATED, {"loss": REPLICATED, "host_call": BATCH, "summaries": REPLICATED}
        ),
    )
    return jax.jit(sharded, donate_argnums=0)


def init_program(
    model: BoundModel, view: ViewFn, topology: Topology, seed: int, with_optimizer: bool
) -> Callable[..., Any]:
    """jit(features, labels) -> (TrainState at step 0, replicated). Traces model_fn once."""

    def init(features: Any, labels: Any) -> TrainState:
        base = jax.random.PRNGKey(seed)
        spec, variables = model.init(jax.random.fold_in(base, 1 << 20), features, labels)
        sv = view(spec)  # validates the spec; the runtime keeps its host-side parts
        tx = sv.train_op if with_optimizer else None
        return TrainState.create(variables, tx, seed)

    return jax.jit(init, out_shardings=topology.replicated())
