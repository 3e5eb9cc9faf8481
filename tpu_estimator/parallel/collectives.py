"""Collectives over the replicas ("data" axis) that also work with a single device.

Programs run their step once per replica under `jax.shard_map`. On a single
device the estimator skips `shard_map` (measured on XLA:CPU: a CNN step ran
16% slower inside it) and traces the step in `single_replica()`, where these
helpers are identities and the replica index is 0.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import numpy as np
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


# Most bytes one bucket's all-gather returns per device. One collective per bucket instead of
# per leaf: the transformer `--size cpu` step (26 leaves split over "data", 1.6 MB gathered)
# gathers in one bucket. The cap bounds the extra temporaries a bucket costs (its flat
# shards and its gathered [n, total] buffer live beside the leaves cut out of it).
BUCKET_BYTES = 64 * 2**20


def gather_shards(tree: Any, specs: Any) -> Any:
    """Whole leaves from this replica's shards: each leaf split over "data" (`specs`, per
    leaf) all-gathered on its dimension; the others as they are. Identity without `specs`.

    The split leaves are gathered in buckets (tree order, one dtype each, at most
    `BUCKET_BYTES` gathered): one all-gather per bucket, so differentiating gives one
    reduce-scatter per bucket, not one per leaf."""
    if specs is None or _single():
        return tree
    leaves, treedef = jax.tree.flatten(tree)
    axes = [data_axis(s) for s in treedef.flatten_up_to(specs)]
    out = list(leaves)
    for bucket in buckets(leaves, axes, lax.axis_size(DATA)):
        for i, x in zip(bucket, _gather_bucket([leaves[i] for i in bucket], [axes[i] for i in bucket])):
            out[i] = x
    return jax.tree.unflatten(treedef, out)


def buckets(leaves: list, axes: list, n: int) -> list[list[int]]:
    """Indices of the split leaves grouped in tree order, per dtype, each group's gathered
    bytes at most `BUCKET_BYTES` (a leaf larger than that alone)."""
    done: list[list[int]] = []
    open_: dict[Any, tuple[list[int], int]] = {}
    for i, (x, a) in enumerate(zip(leaves, axes)):
        if a is None:
            continue
        size = n * x.size * np.dtype(x.dtype).itemsize
        bucket, total = open_.get(x.dtype, ([], 0))
        if bucket and total + size > BUCKET_BYTES:
            done.append(bucket)
            bucket, total = [], 0
        open_[x.dtype] = (bucket + [i], total + size)
    return done + [b for b, _ in open_.values()]


def _gather_bucket(shards: list, axes: list) -> list:
    """Each shard all-gathered (tiled) on its axis, by one all-gather of their flat
    concatenation: [n, total] rows are the replicas, each leaf's columns cut back out."""
    if len(shards) == 1:
        return [lax.all_gather(shards[0], DATA, axis=axes[0], tiled=True)]
    fronts = [jnp.moveaxis(x, a, 0) for x, a in zip(shards, axes)]
    flat = jnp.concatenate([f.reshape(-1) for f in fronts])
    rows = lax.all_gather(flat, DATA, axis=0, tiled=False)  # [n, total]
    n = rows.shape[0]
    out, start = [], 0
    for f, a in zip(fronts, axes):
        part = rows[:, start : start + f.size].reshape((n * f.shape[0],) + f.shape[1:])
        out.append(jnp.moveaxis(part, 0, a))
        start += f.size
    return out


def shard_mean(grads: Any, specs: Any) -> Any:
    """The replicas' mean of gradients with respect to this replica's shards, as
    differentiating through `gather_shards` gives them: a leaf split over "data" already
    holds the sum over replicas (the gather's transpose is a reduce-scatter) and is divided
    by their number; the others are averaged (`replica_mean`)."""
    if specs is None or _single():
        return replica_mean(grads)
    n = lax.psum(1, DATA)
    return _each(lambda g, a: lax.pmean(g, DATA) if a is None else g / n, grads, specs)
