"""Host numpy batches to global device arrays, sharded on "data" along their batch axis."""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec as P

from tpu_estimator.parallel.mesh import DATA, Topology


def batch_specs(axes: Any, *, leading: int = 0, replicated: bool = False) -> Any:
    """PartitionSpecs for a batch pytree whose leaves' batch axes are `axes`."""

    def spec(axis: int) -> P:
        if replicated:
            return P()
        return P(*([None] * (leading + axis)), DATA)

    return jax.tree.map(spec, axes)


class Placer:
    """Places host arrays (this host's part of the global batch) on the mesh as `specs` say.

    The shardings are built once: placing a batch is one `device_put` call per
    batch on one host (the feeder's per-step cost), one call per array on several.
    """

    def __init__(self, specs: Any, topology: Topology) -> None:
        self._shardings = jax.tree.map(
            lambda spec: NamedSharding(topology.mesh, spec), specs, is_leaf=lambda x: isinstance(x, P)
        )

    def __call__(self, tree: Any) -> Any:
        if jax.process_count() == 1:
            return jax.device_put(tree, self._shardings)
        return jax.tree.map(
            lambda x, sharding: jax.make_array_from_process_local_data(sharding, x), tree, self._shardings
        )
