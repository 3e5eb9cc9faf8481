"""The training step (pure) and the programs that run it: a `lax.scan` loop, or one step.

`train_step(state, batch) -> (state, outputs)` computes one replica's
gradients, averages them over replicas and applies `train_op`. The estimator
picks a strategy: "scan" (iterations_per_loop steps in one program) or
"step" (one program per step, dispatched by the host; faster for
convolutions on XLA:CPU).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax import lax

from tpu_estimator.api.step_options import checkpoint_policy
from tpu_estimator.loops.accumulate import accumulate
from tpu_estimator.loops.strategy import primitives_of
from tpu_estimator.model import components
from tpu_estimator.loops.replica import (
    REPLICATED,
    Placement,
    check_elementwise,
    over_replicas,
    replica_key,
)
from tpu_estimator.model.module import BoundModel
from tpu_estimator.model.spec_view import SpecView
from tpu_estimator.model.state import TrainState
from tpu_estimator.parallel.collectives import (
    gather_shards,
    reduces_whole_gradients,
    replica_mean,
    shard_mean,
    slice_mean,
)
from tpu_estimator.parallel.mesh import Topology
from tpu_estimator.summary.collect import collecting
from tpu_estimator.summary.collect import replicate as replicate_summaries

ViewFn = Callable[[Any], SpecView]


def train_step(
    model: BoundModel,
    view: ViewFn,
    state: TrainState,
    batch: tuple[Any, Any],
    batch_axes: Any = None,
    shards: Any = None,
) -> tuple[TrainState, dict[str, Any]]:
    """One step on one replica: loss, gradients averaged over "data", update.

    Returns the new state and outputs: `loss` (mean over replicas) and
    `host_call` (this replica's host_call tensors, batch-major) and
    `summaries` (what model_fn recorded with `tpu_estimator.summary`, one copy).
    Components with `split`/`activations` hooks (the embedding tables) give
    model_fn activations in place of some features; the loss is differentiated
    with respect to them too, and their `update` hooks take those gradients.
    `shards` (the parameters' specs, "fsdp"): `state.params` and the optimizer state
    are this replica's shards; model_fn sees the whole parameters (all-gathered in
    the loss, so the gradients come back reduce-scattered to the shards: the
    gather's transpose; on XLA:CPU gathered before the loss, the whole gradients
    all-reduced and sliced: `reduces_whole_gradients`) and the optimizer updates the shards.
    With `model.accumulation_steps` k > 1 the gradients are those of k
    micro-batches (loops/accumulate.py, split on `batch_axes`); with
    `model.remat_policy` the forward pass is rematerialized (`jax.checkpoint`).
    Components may scale the loss and veto the update (model/components.py).
    """
    features, labels = batch
    rng = replica_key(state.rng, state.step)
    mutable = sorted(state.collections)
    found: dict[str, SpecView] = {}
    features, inputs = components.split(model.components, state.extras, features)
    acts = components.activations(model.components, state.extras, inputs)
    # "fsdp" on XLA:CPU: gathered once before the loss, whole gradients all-reduced (see
    # parallel/collectives.py reduces_whole_gradients); elsewhere gathered in the loss.
    whole = shards is not None and reduces_whole_gradients()
    params = gather_shards(state.params, shards) if whole else state.params

    def loss_fn(params: Any, acts: dict[str, Any], features: Any, labels: Any, collections: Any, rng: Any) -> Any:
        with collecting() as summaries:
            variables = {"params": params if whole else gather_shards(params, shards), **collections}
            spec, mutated = model.apply(
                variables, components.merged(features, acts), labels, rng=rng, mutable=mutable
            )
        found["spec"] = sv = view(spec)
        scaled = components.scale_loss(model.components, state.extras, sv.loss)
        return scaled, (sv.loss, mutated, sv.host_call_tensors, summaries)

    if model.remat_policy is not None:
        loss_fn = jax.checkpoint(loss_fn, policy=checkpoint_policy(model.remat_policy))
    grad_fn = jax.value_and_grad(loss_fn, argnums=(0, 1), has_aux=True)
    loss, mutated, host_tensors, summaries, grads, act_grads = accumulate(
        grad_fn, model.accumulation_steps, params, acts, (features, labels), state.collections, rng,
        batch_axes,
    )
    tx = found["spec"].train_op
    grads = slice_mean(grads, shards) if whole else shard_mean(grads, shards)
    if shards is not None:
        check_elementwise(tx, grads, state.opt_state, state.params)
    (grads, act_grads), apply, extras = components.gradients(model.components, state.extras, (grads, act_grads))
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    new_state = state.replace(
        params=optax.apply_updates(state.params, updates),
        opt_state=opt_state,
        collections={**state.collections, **replica_mean(dict(mutated))},
        step=state.step + 1,
    )
    extras, updated = components.update(model.components, extras, inputs, act_grads, state.step)
    if apply is not None:  # a component vetoed the update (e.g. float16 gradients overflowed)
        keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(apply, n, o), new, old)  # noqa: E731
        new_state = new_state.replace(
            params=keep(new_state.params, state.params), opt_state=keep(new_state.opt_state, state.opt_state)
        )
        extras = {**extras, **{n: keep(extras[n], state.extras[n]) for n in updated}}
    new_state = components.after_step(model.components, new_state.replace(extras=extras))
    outputs = {"loss": replica_mean(loss), "host_call": host_tensors}
    return new_state, {**outputs, "summaries": replicate_summaries(summaries)}


def scan_program(
    model: BoundModel, view: ViewFn, topology: Topology, placement: Placement = Placement()
) -> Callable[..., Any]:
    """jit(state, stacked batches [k, B, ...]) -> (state, outputs stacked over k steps)."""

    def train_scan(state: TrainState, blocks: Any) -> tuple[TrainState, dict[str, Any]]:
        blocks = placement.constrain(blocks, leading=1)
        shards = placement.param_shards
        state, outs = lax.scan(
            lambda s, b: train_step(model, view, s, b, placement.batch_axes, shards), state, blocks
        )
        return state, {**outs, "host_call": placement.collect(outs["host_call"], leading=1)}

    sharded = over_replicas(
        train_scan,
        topology,
        in_specs=lambda state, _: (placement.replica_specs(state, model.components), placement.in_spec(1)),
        out_specs=lambda state, _: (
            placement.replica_specs(state, model.components),
            {"loss": REPLICATED, "host_call": placement.out_spec(1), "summaries": REPLICATED},
        ),
    )
    return jax.jit(sharded, donate_argnums=0, out_shardings=(placement.state_shardings(topology), None))


def step_program(
    model: BoundModel, view: ViewFn, topology: Topology, placement: Placement = Placement()
) -> Callable[..., Any]:
    """jit(state, batch [B, ...]) -> (state, outputs of this step).

    The returned state keeps the input's `step`: the host advances the counter
    (the feeder places each next step ahead of time; estimator/train_feed.py).
    Measured on XLA:CPU (benchmarks/RESULTS.md): an independent `step + 1` in
    the program moves part of the step's work off the Eigen pool and cost ~3%
    on a CNN step.
    """

    def train_one_step(state: TrainState, batch: Any) -> tuple[TrainState, dict[str, Any]]:
        new, outs = train_step(
            model, view, state, placement.constrain(batch), placement.batch_axes, placement.param_shards
        )
        return new.replace(step=state.step), {**outs, "host_call": placement.collect(outs["host_call"])}

    sharded = over_replicas(
        train_one_step,
        topology,
        in_specs=lambda state, _: (placement.replica_specs(state, model.components), placement.in_spec()),
        out_specs=lambda state, _: (
            placement.replica_specs(state, model.components),
            {"loss": REPLICATED, "host_call": placement.out_spec(), "summaries": REPLICATED},
        ),
    )
    return jax.jit(sharded, donate_argnums=0, out_shardings=(placement.state_shardings(topology), None))


def init_program(
    model: BoundModel,
    view: ViewFn,
    topology: Topology,
    seed: int,
    with_optimizer: bool,
    shardings: Callable[[Any, Any], Any] | None = None,
) -> "InitProgram":
    """(features, labels) -> TrainState at step 0, placed by `shardings`.

    `shardings(abstract_state, metadata_specs)` gives the state's shardings
    (None: replicated); `metadata_specs` are the layers' own partition specs
    (`nn.with_partitioning`), read while tracing.
    """

    def build(features: Any, labels: Any) -> tuple[TrainState, SpecView, Any]:
        base = jax.random.PRNGKey(seed)
        features = components.placeholders(model.components, features)  # e.g. activations, not ids
        spec, variables = model.init(jax.random.fold_in(base, 1 << 20), features, labels)
        sv = view(spec)  # validates the spec
        tx = sv.train_op if with_optimizer else None
        metadata = nn.get_partition_spec(dict(variables)).get("params")
        state = TrainState.create(nn.unbox(dict(variables)), tx, seed)
        state = state.replace(extras=components.init_extras(model.components, state))
        return state, sv, metadata

    return InitProgram(build, topology, shardings)


@dataclasses.dataclass(frozen=True)
class Traced:
    """What tracing model_fn's initialisation tells: the state's shapes (with shardings) and
    the spec model_fn returned (its host-side parts: hooks, metric_fn, host_call_fn, ...)."""

    abstract: Any
    spec: SpecView
    primitives: frozenset[str] = frozenset()  # of the initialisation (model_fn's forward pass)


class InitProgram:
    """The jitted initialisation; `trace()` gives the state's shapes, shardings and the spec."""

    def __init__(self, build: Callable[..., Any], topology: Topology, shardings: Any) -> None:
        self._build, self._topology, self._shardings = build, topology, shardings
        self._jitted: Callable[..., Any] | None = None
        self.state_shardings: Any = None

    def trace(self, *sample: Any) -> Traced:
        """Traces model_fn's initialisation on `sample` (no device work)."""
        found: list[tuple[SpecView, Any]] = []

        def state_only(*args: Any) -> TrainState:
            state, sv, metadata = self._build(*args)
            found.append((sv, metadata))
            return state

        jaxpr, shapes = jax.make_jaxpr(state_only, return_shape=True)(*sample)
        spec, metadata = found[-1]
        if self.state_shardings is None:
            self.state_shardings = (
                self._shardings(shapes, metadata)
                if self._shardings is not None
                else jax.tree.map(lambda _: self._topology.replicated(), shapes)
            )
        abstract = jax.tree.map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shapes, self.state_shardings
        )
        return Traced(abstract, spec, primitives_of(jaxpr))

    def __call__(self, *sample: Any) -> TrainState:
        if self._jitted is None:
            if self.state_shardings is None:
                self.trace(*sample)

            def init_state(*args: Any) -> TrainState:
                return self._build(*args)[0]

            self._jitted = jax.jit(init_state, out_shardings=self.state_shardings)
        return self._jitted(*sample)
