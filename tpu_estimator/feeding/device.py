"""Host numpy batches to global device arrays, sharded on "data" along their batch axis."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from tpu_estimator.parallel.mesh import DATA, Topology


def batch_specs(axes: Any, *, leading: int = 0, replicated: bool = False) -> Any:
    """PartitionSpecs for a batch pytree whose leaves' batch axes are `axes`."""

    def spec(axis: int) -> P:
        if replicated:
            return P()
        return P(*([None] * (leading + axis)), DATA)

    return jax.tree.map(spec, axes)


def to_device(tree: Any, specs: Any, topology: Topology) -> Any:
    """Places host arrays (this host's part of the global batch) on the mesh."""

    def put(x: np.ndarray, spec: P) -> jax.Array:
        sharding = NamedSharding(topology.mesh, spec)
        if jax.process_count() == 1:
            return jax.device_put(x, sharding)
        return jax.make_array_from_process_local_data(sharding, x)

    return jax.tree.map(put, tree, specs, is_leaf=lambda x: isinstance(x, P) or x is None)
