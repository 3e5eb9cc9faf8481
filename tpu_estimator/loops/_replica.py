"""Helpers shared by the compiled programs: replica RNG keys and shard_map wrapping."""

from __future__ import annotations

from typing import Any, Callable

import jax
from jax import lax
from jax.sharding import PartitionSpec as P

from tpu_estimator.parallel.mesh import DATA, Topology


def replica_key(base: jax.Array, step: jax.Array) -> jax.Array:
    """A key distinct per step and per replica, reproducible from `base`."""
    return jax.random.fold_in(jax.random.fold_in(base, step), lax.axis_index(DATA))


def over_replicas(
    fn: Callable[..., Any], topology: Topology, in_specs: Any, out_specs: Any
) -> Callable[..., Any]:
    """`fn` run once per replica on its shard of the batch (model_fn sees the per-replica batch)."""
    return jax.shard_map(
        fn, mesh=topology.mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False
    )


BATCH = P(DATA)
STACKED_BATCH = P(None, DATA)
REPLICATED = P()
