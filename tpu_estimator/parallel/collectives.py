"""Collectives over the replicas ("data" axis) that also work with a single device.

Programs run their step once per replica under `jax.shard_map`. On a single
device the estimator skips `shard_map` (measured on XLA:CPU: a CNN step ran
16% slower inside it) and traces the step in `single_replica()`, where these
helpers are identities and the replica index is 0.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator

import jax
from jax import lax
from jax.sharding import PartitionSpec as P

from tpu_estimator.api.contracts import PyTree
from tpu_estimator.parallel.mesh import DATA

_state = threading.local()


@contextlib.contextmanager
def single_replica() -> Iterator[None]:
    """While tracing inside, there is one replica and no "data" axis to reduce over."""
    previous = getattr(_state, "single", False)
    _state.single = True
    try:
        yield
    finally:
        _state.single = previous


def _single() -> bool:
    return getattr(_state, "single", False)


def replica_mean(tree: PyTree) -> PyTree:
    """Mean over replicas (`lax.pmean` over "data")."""
    return tree if _single() else lax.pmean(tree, DATA)


def replica_gather(x: jax.Array, axis: int = 0) -> jax.Array:
    """Replicas' values concatenated along `axis` (`lax.all_gather(tiled=True)`)."""
    return x if _single() else lax.all_gather(x, DATA, axis=axis, tiled=True)


def replica_index() -> int | jax.Array:
    """This replica's index along "data"."""
    return 0 if _single() else lax.axis_index(DATA)


# --- parameters sharded over the replicas (TPUConfig.parameter_sharding="fsdp") ----------


def data_axis(spec: Any) -> int | None:
    """The dimension a per-replica spec splits over "data" (None: whole on every replica)."""
    for i, entry in enumerate(spec):
        if entry == DATA or (isinstance(entry, tuple) and DATA in entry):
            return i
    return None


def _each(fn: Any, tree: Any, specs: Any) -> Any:
    def one(spec: Any, x: Any) -> Any:
        axis = data_axis(spec)
        return fn(x, axis)

    return jax.tree.map(one, specs, tree, is_leaf=lambda s: isinstance(s, P))


def gather_shards(tree: Any, specs: Any) -> Any:
    """Whole leaves from this replica's shards: each leaf split over "data" (`specs`, per
    leaf) all-gathered on its dimension; the others as they are. Identity without `specs`."""
    if specs is None or _single():
        return tree
    return _each(lambda x, a: x if a is None else lax.all_gather(x, DATA, axis=a, tiled=True), tree, specs)


def reduces_whole_gradients() -> bool:
    """Whether the "fsdp" step gathers the parameters before its loss and all-reduces the
    whole gradients (`slice_mean`), rather than gathering inside the loss and
    reduce-scattering each gradient (`shard_mean`): on XLA:CPU only.

    The fake devices of XLA:CPU share the host's memory, so an all-reduce's extra bytes
    are memory copies, while every collective is a rendezvous of all device threads: XLA
    combines the step's all-reduces into one, but not its ~one reduce-scatter per leaf,
    each met in the middle of the backward pass (benchmarks/RESULTS.md, "fsdp on XLA:CPU: the
    all-reduce form adopted"). On an interconnect a reduce-scatter moves half an
    all-reduce's bytes and each device holds only its shard of a gradient once reduced.
    """
    return jax.default_backend() == "cpu"


def slice_mean(grads: Any, specs: Any) -> Any:
    """The replicas' mean of gradients with respect to the whole parameters (gathered by
    `gather_shards` before the loss), cut to this replica's shards: every leaf averaged
    over replicas (`lax.pmean`: one all-reduce once XLA combines them) and a leaf split over
    "data" sliced to this replica's part of its split dimension."""
    if specs is None or _single():
        return replica_mean(grads)
    mean, i = lax.pmean(grads, DATA), lax.axis_index(DATA)
    n = lax.axis_size(DATA)

    def cut(g: Any, axis: int | None) -> Any:
        if axis is None:
            return g
        size = g.shape[axis] // n
        return lax.dynamic_slice_in_dim(g, i * size, size, axis)

    return _each(cut, mean, specs)


def shard_mean(grads: Any, specs: Any) -> Any:
    """The replicas' mean of gradients with respect to this replica's shards, as
    differentiating through `gather_shards` gives them: a leaf split over "data" already
    holds the sum over replicas (the gather's transpose is a reduce-scatter) and is divided
    by their number; the others are averaged (`replica_mean`)."""
    if specs is None or _single():
        return replica_mean(grads)
    n = lax.psum(1, DATA)
    return _each(lambda g, a: lax.pmean(g, DATA) if a is None else g / n, grads, specs)
