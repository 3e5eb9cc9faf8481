"""Helpers shared by the compiled programs: replica RNG keys, shard_map wrapping, outputs.

Programs are manual over "data" only (`jax.shard_map(axis_names={"data"})`):
model_fn sees one replica's batch and whole (logically global) parameters,
while XLA shards the work of a replica over "model" as the parameters'
shardings and the input constraints say.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from tpu_estimator.embedding.replica import state_specs as embedding_specs
from tpu_estimator.embedding.sharded import EmbeddingState
from tpu_estimator.parallel.collectives import replica_gather, replica_index, single_replica
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


def _tables(x: Any) -> bool:
    return isinstance(x, EmbeddingState)


def specs_of(tree: Any) -> Any:
    """The per-replica specs of a state or variables argument: whole on every replica
    (`REPLICATED`), except embedding tables and slots, whose rows are split over "data"."""
    if not any(_tables(x) for x in jax.tree.leaves(tree, is_leaf=_tables)):
        return REPLICATED
    return jax.tree.map(lambda x: embedding_specs(x) if _tables(x) else REPLICATED, tree, is_leaf=_tables)


REPLICATED = P()
