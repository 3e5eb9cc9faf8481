"""Helpers shared by the compiled programs: replica RNG keys, shard_map wrapping, outputs.

Programs are manual over "data" only (`jax.shard_map(axis_names={"data"})`):
model_fn sees one replica's batch and whole (logically global) parameters,
while XLA shards the work of a replica over "model" as the parameters'
shardings and the input constraints say.

With `parameter_sharding="fsdp"` the state's large leaves are split over
"data" too: they enter the per-replica program as this replica's shards
(`Placement.replica_specs`), the training step gathers the parameters where it
uses them and reduce-scatters their gradients (on XLA:CPU: all-reduces and slices
them; `Placement.param_shards`, parallel/collectives.py), and the optimizer updates the shards.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from tpu_estimator.api.checks import message
from tpu_estimator.loops.strategy import equations
from tpu_estimator.model import components as comp
from tpu_estimator.model.state import TrainState
from tpu_estimator.parallel.collectives import data_axis, replica_gather, replica_index, single_replica
from tpu_estimator.parallel.mesh import DATA, Topology


def replica_key(base: jax.Array, step: jax.Array) -> jax.Array:
    """A key distinct per step and per replica, reproducible from `base`."""
    return jax.random.fold_in(jax.random.fold_in(base, step), replica_index())


@dataclasses.dataclass(frozen=True)
class Placement:
    """How a program's per-replica values meet the mesh.

    Attributes:
      outputs: "concat" (batch-major outputs concatenated over replicas),
        "first" (replica 0's copy: BROADCAST input), or "gather" (concatenated
        and replicated on every device, so every host can read them).
      inputs: per-replica PartitionSpecs of (features, labels) leaves over the
        model axes (input_partition_dims), or None.
      state: PartitionSpecs of the TrainState (None: replicated).
      batch_axes: the batch axis of each (features, labels) leaf (`batch_axis`);
        None: axis 0 everywhere.
    """

    outputs: str = "concat"
    inputs: Any = None
    state: Any = None
    batch_axes: Any = None

    def in_spec(self, leading: int = 0, part: int | None = None) -> Any:
        """The batch's spec(s): split over "data" on each leaf's batch axis, or whole on every
        replica (BROADCAST). `part` 0 selects the features' specs (predict takes no labels)."""
        if self.outputs == "first":
            return P()
        if self.batch_axes is None:
            return P(*([None] * leading), DATA)
        axes = self.batch_axes if part is None else self.batch_axes[part]
        return jax.tree.map(lambda a: P(*([None] * (leading + a)), DATA), axes)

    def out_spec(self, leading: int = 0) -> P:
        return P(*([None] * leading), DATA) if self.outputs == "concat" else P()

    def collect(self, tree: Any, leading: int = 0) -> Any:
        """Batch-major per-replica outputs, as `out_spec` expects them."""
        if self.outputs != "gather":
            return tree
        return jax.tree.map(lambda x: replica_gather(x, axis=leading), tree)

    def constrain(self, batch: Any, leading: int = 0) -> Any:
        """Applies the input partitioning to one replica's (features, labels)."""
        if self.inputs is None:
            return batch

        def apply(x: Any, spec: Any) -> Any:
            if x is None or spec is None:
                return x
            if isinstance(x, dict):
                return {k: apply(v, spec.get(k)) for k, v in x.items()}
            return lax.with_sharding_constraint(x, P(*([None] * leading), *spec))

        return tuple(apply(x, spec) for x, spec in zip(batch, self.inputs))

    @property
    def param_shards(self) -> Any:
        """The parameters' specs when some are split over "data" ("fsdp"), else None."""
        if self.state is None:
            return None
        specs = self.state.params
        if all(data_axis(s) is None for s in jax.tree.leaves(specs, is_leaf=_is_spec)):
            return None
        return specs

    def replica_specs(self, state: Any, components: comp.Components = ()) -> Any:
        """The `shard_map` specs of a TrainState argument: its "data" entries ("fsdp"
        parameters and optimizer slots, the components' `replica_specs`: embedding rows);
        whole on every replica otherwise."""
        if self.param_shards is None:
            return specs_of(state, components)
        return jax.tree.map(_data_only, self.state, is_leaf=_is_spec)

    def state_shardings(self, topology: Topology) -> Any:
        if self.state is None:
            return topology.replicated()
        return jax.tree.map(
            lambda s: NamedSharding(topology.mesh, s), self.state, is_leaf=lambda x: isinstance(x, P)
        )


def over_replicas(
    fn: Callable[..., Any], topology: Topology, in_specs: Any, out_specs: Any
) -> Callable[..., Any]:
    """`fn` run once per replica on its shard of the batch (model_fn sees the per-replica batch).

    `in_specs`/`out_specs` may be functions of the arguments, for specs that
    depend on their structure (see `specs_of`). On a single device `fn` runs
    as it is (see parallel/collectives.py).
    """
    if topology.num_devices == 1:

        def one(*args: Any) -> Any:
            with single_replica():
                return fn(*args)

        return one

    @functools.wraps(fn)  # (programs are named after fn: see loops/compiles.py)
    def per_replica(*args: Any) -> Any:
        return jax.shard_map(
            fn,
            mesh=topology.mesh,
            in_specs=in_specs(*args) if callable(in_specs) else in_specs,
            out_specs=out_specs(*args) if callable(out_specs) else out_specs,
            axis_names={DATA},
            check_vma=False,
        )(*args)

    return per_replica


# Primitives that combine the elements of an array: on a shard they see only part of it.
_REDUCTIONS = frozenset(
    "reduce_sum reduce_max reduce_min reduce_prod reduce_and reduce_or argmax argmin cumsum "
    "cumprod cummax cummin cumlogsumexp sort dot_general".split()
)


def check_elementwise(tx: Any, grads: Any, opt_state: Any, params: Any) -> None:
    """Refuses an optimizer whose update reduces over a parameter (global-norm clipping, LAMB,
    Adafactor): with "fsdp" it updates this replica's shards, and would see only part of it.

    Raises:
      ValueError: naming `parameter_sharding` and the reduction found.
    """
    shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), (grads, opt_state, params))
    found = sorted(_reductions(jax.make_jaxpr(tx.update)(*shapes)))
    if found:
        raise ValueError(
            message(
                "TPUConfig(parameter_sharding='fsdp') needs an elementwise optimizer (train_op): "
                "each device updates its shard of a parameter, so an update that reduces over a "
                "parameter (a norm, a mean over rows) would see only that shard.",
                f"parameter_sharding='fsdp' with a train_op whose update uses {found}",
                "Use parameter_sharding='replicated' with this optimizer, or an elementwise one "
                "(optax.adam, adamw, sgd, rmsprop, ...).",
            )
        )


def _reductions(jaxpr: Any) -> set[str]:
    """The reducing primitives of `jaxpr` (nested ones included) applied to arrays, not scalars."""
    return {
        eqn.primitive.name for eqn in equations(jaxpr)
        if eqn.primitive.name in _REDUCTIONS and any(getattr(getattr(v, "aval", None), "ndim", 0) > 0 for v in eqn.invars)
    }


def _is_spec(x: Any) -> bool:
    return isinstance(x, P)


def _data_only(spec: P) -> P:
    """A spec with only its "data" entries (the manual axis of the per-replica programs)."""
    axis = data_axis(spec)
    return P(*[DATA if i == axis else None for i in range(len(spec))])


def specs_of(tree: Any, components: comp.Components = ()) -> Any:
    """The per-replica specs of a state or variables argument: whole on every replica
    (`REPLICATED`), except the state of components with `replica_specs` (embedding rows,
    split over "data")."""
    if isinstance(tree, TrainState):
        if tree.extras is None:
            return REPLICATED
        rest = jax.tree.map(lambda _: REPLICATED, tree.replace(extras=None))
        return rest.replace(extras=comp.replica_specs(components, tree.extras))
    return comp.variables_replica_specs(components, tree)


REPLICATED = P()
