"""Where parameters, optimizer state and inputs live on the ("data", "model") mesh.

Parameters are replicated over "data" and sharded over "model" by, in order:
`TPUConfig.partition_rules` (regex on the path `Dense_0/kernel` ->
PartitionSpec), the layer's own metadata (`nn.with_partitioning`, or
`nn.with_logical_partitioning` mapped by `TPUConfig.logical_axis_rules`),
and a default: a matrix of at least `DEFAULT_MIN_SIZE` elements is split on
its largest dimension that the model axis divides. Optimizer state follows
the parameter it mirrors; everything else is replicated.

With `TPUConfig.parameter_sharding="fsdp"` (`over_data`), every parameter of
at least `DEFAULT_MIN_SIZE` elements is also split over "data", so that each
device holds ~1/N of it over all N devices (ZeRO-3); the training step gathers
it where it is used (loops/replica.py, parallel/collectives.py).
"""

from __future__ import annotations

import logging
import re
from typing import Any, Sequence

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from tpu_estimator.api.checks import message
from tpu_estimator.parallel.mesh import DATA, MODEL, Topology

log = logging.getLogger("tpu_estimator")

# Parameters smaller than this stay replicated by default (sharding them costs more than it saves).
DEFAULT_MIN_SIZE = 4096


def path_name(path: Any) -> str:
    """`Dense_0/kernel` for a key path."""
    return "/".join(str(getattr(p, "key", getattr(p, "idx", getattr(p, "name", p)))) for p in path)


def _translate(spec: Any, topology: Topology, name: str, shape: tuple[int, ...]) -> P:
    """A user spec with "model" meaning all of the replica's axes, checked against `shape`."""
    entries = []
    for e in tuple(spec):
        if e == MODEL:
            e = topology.model_axis
        entries.append(e)
    if len(entries) > len(shape):
        raise ValueError(
            message(
                f"The partition spec of `{name}` has more entries than the parameter has dimensions.",
                f"spec {tuple(spec)} for shape {shape}",
            )
        )
    for dim, e in zip(shape, entries):
        if e is None:
            continue
        axes = e if isinstance(e, tuple) else (e,)
        unknown = [a for a in axes if a not in topology.mesh.axis_names]
        if unknown or DATA in axes:
            raise ValueError(
                message(
                    f"Parameters may only be sharded over the \"model\" axis (`{name}`).",
                    f"spec {tuple(spec)}",
                    "Use PartitionSpec entries 'model' or None.",
                )
            )
        size = int(np.prod([topology.mesh.shape[a] for a in axes]))
        if dim % size:
            raise ValueError(
                message(
                    f"`{name}`: a sharded dimension must be divisible by num_cores_per_replica.",
                    f"dimension of size {dim} over {size} cores (shape {shape}, spec {tuple(spec)})",
                )
            )
    return P(*entries)


def _default(shape: tuple[int, ...], topology: Topology) -> P:
    k = topology.cores_per_replica
    if k == 1 or len(shape) < 2 or int(np.prod(shape)) < DEFAULT_MIN_SIZE:
        return P()
    candidates = [i for i, d in enumerate(shape) if d % k == 0]
    if not candidates:
        return P()
    best = max(candidates, key=lambda i: (shape[i], i))
    return P(*[topology.model_axis if i == best else None for i in range(len(shape))])


def _axes(entry: Any) -> tuple[str, ...]:
    return () if entry is None else tuple(entry) if isinstance(entry, tuple) else (entry,)


def over_data(spec: P, shape: tuple[int, ...], topology: Topology) -> P | None:
    """`spec` with the "data" axis added ("fsdp"), so the leaf is split ~1/N over all N
    devices; `spec` itself when the leaf is small or there is one device; None when no
    dimension is divisible (the leaf stays replicated over "data").

    A leaf not split over "model" takes the whole mesh on one dimension
    (("data", "model") when the device count divides it, else "data"); one split over
    "model" takes "data" on another dimension, or on the same one ("data" major).
    """
    n_data, n = topology.num_replicas, topology.num_devices
    if n == 1 or int(np.prod(shape)) < DEFAULT_MIN_SIZE:
        return spec
    entries = list(spec) + [None] * (len(shape) - len(spec))
    free = [i for i, e in enumerate(entries) if e is None]

    def largest(dims: list[int]) -> int:
        return max(dims, key=lambda i: (shape[i], i))

    if len(free) == len(shape):  # not split over "model": the whole mesh if it can
        whole = [i for i in free if shape[i] % n == 0]
        if whole and n > n_data:
            entries[largest(whole)] = (DATA, *topology.model_axes)
            return P(*entries)
    fits = [i for i in free if shape[i] % n_data == 0]
    if fits:
        entries[largest(fits)] = DATA
        return P(*entries)
    shared = [
        i for i, e in enumerate(entries)
        if e is not None and shape[i] % (n_data * int(np.prod([topology.mesh.shape[a] for a in _axes(e)]))) == 0
    ]
    if shared:
        i = largest(shared)
        entries[i] = (DATA, *_axes(entries[i]))
        return P(*entries)
    return None


def _over_data_tree(params: Any, specs: Any, topology: Topology) -> Any:
    """`over_data` on every parameter; logs the bytes left whole on every replica."""
    kept: list[tuple[str, int, bool]] = []

    def one(path: Any, leaf: Any, spec: P) -> P:
        out = over_data(spec, tuple(leaf.shape), topology)
        if out is None or DATA not in [a for e in out for a in _axes(e)]:
            size = int(np.prod(leaf.shape))
            kept.append((path_name(path), size * np.dtype(leaf.dtype).itemsize, out is None))
        return spec if out is None else out

    out = jax.tree_util.tree_map_with_path(one, params, specs)
    if topology.num_replicas > 1:
        total = sum(b for _, b, _ in kept)
        odd = [name for name, _, indivisible in kept if indivisible]
        log.info(
            "parameter_sharding='fsdp': %d parameters (%d bytes) stay whole on every replica "
            "(fewer than %d elements, or no dimension divisible by the device count%s).",
            len(kept), total, DEFAULT_MIN_SIZE, f": {odd}" if odd else "",
        )
    return out


def _from_metadata(meta: Any, logical_rules: Sequence[Any] | None) -> Any:
    """A metadata spec (mesh or logical names) as mesh names; None when there is none."""
    if not isinstance(meta, P) or len(meta) == 0:
        return None
    if logical_rules:
        rules = dict(logical_rules)
        return P(*[rules.get(e, e) if isinstance(e, str) else e for e in meta])
    return meta


def param_specs(
    params: Any,
    topology: Topology,
    *,
    rules: Sequence[tuple[str, Any]] | None = None,
    metadata: Any = None,
    logical_rules: Sequence[Any] | None = None,
    fsdp: bool = False,
) -> Any:
    """A PartitionSpec per parameter (see the module docstring for the order); `fsdp` adds
    the "data" axis (`over_data`)."""
    metas = {}
    if metadata is not None:
        for path, m in jax.tree_util.tree_flatten_with_path(
            metadata, is_leaf=lambda x: isinstance(x, P)
        )[0]:
            metas[path_name(path)] = m
    compiled = [(re.compile(pattern), spec) for pattern, spec in (rules or ())]

    def one(path: Any, leaf: Any) -> P:
        name, shape = path_name(path), tuple(leaf.shape)
        for pattern, spec in compiled:
            if pattern.search(name):
                return _translate(spec, topology, name, shape)
        meta = _from_metadata(metas.get(name), logical_rules)
        if meta is not None:
            return _translate(meta, topology, name, shape)
        return _default(shape, topology)

    specs = jax.tree_util.tree_map_with_path(one, params)
    return _over_data_tree(params, specs, topology) if fsdp else specs


def state_specs(state: Any, topology: Topology, **kw: Any) -> Any:
    """PartitionSpecs for a TrainState: params by `param_specs` (`kw` are its options),
    optimizer state by the parameter whose path ends its own path (same shape), the rest
    replicated."""
    pspecs = param_specs(state.params, topology, **kw)
    by_path = {}
    for (path, leaf), spec in zip(
        jax.tree_util.tree_flatten_with_path(state.params)[0], jax.tree.leaves(pspecs, is_leaf=lambda x: isinstance(x, P))
    ):
        by_path[path_name(path)] = (tuple(leaf.shape), spec)

    def opt(path: Any, leaf: Any) -> P:
        name = path_name(path)
        for pname, (shape, spec) in by_path.items():
            if (name == pname or name.endswith("/" + pname)) and tuple(leaf.shape) == shape:
                return spec
        return P()

    return state.replace(
        params=pspecs,
        opt_state=None if state.opt_state is None else jax.tree_util.tree_map_with_path(opt, state.opt_state),
        collections=jax.tree.map(lambda _: P(), state.collections),
        step=P(),
        rng=P(),
    )


def named(specs: Any, topology: Topology) -> Any:
    return jax.tree.map(
        lambda s: NamedSharding(topology.mesh, s), specs, is_leaf=lambda x: isinstance(x, P)
    )


# --- inputs (input_partition_dims) -------------------------------------------------


def input_specs(dims: Any, tree: Any, axes: Any, topology: Topology) -> Any:
    """Per-replica PartitionSpecs of (features, labels) from `input_partition_dims`.

    Each dims list has one entry per dimension (>= 1, product num_cores_per_replica);
    a dimension split in 2^a takes the next a of the replica's size-2 axes. None
    (or a missing labels entry) leaves a tensor whole on each core.

    Raises:
      ValueError: keys or ranks that do not match the input, or bad products.
    """
    dims = list(dims) + [None] * (2 - len(dims))
    out = []
    for part, (what, sub, sub_axes) in zip(dims, (("features", tree[0], axes[0]), ("labels", tree[1], axes[1]))):
        if sub is None or part is None:
            out.append(jax.tree.map(lambda _: None, sub))
            continue
        if isinstance(sub, dict):
            if not isinstance(part, dict) or not set(part) <= set(sub):
                raise ValueError(
                    message(
                        f"input_partition_dims for dict {what} must be a dict whose keys are {what} keys.",
                        f"input_partition_dims {what} entry {part!r}; {what} keys {sorted(sub)}",
                        "Give e.g. {'image': [1, 2, 2, 1]} (keys left out are not partitioned).",
                    )
                )
            out.append({k: _one_input(f"{what}/{k}", part.get(k), sub[k], sub_axes[k], topology) for k in sub})
        else:
            if isinstance(part, dict):
                raise ValueError(
                    message(
                        f"input_partition_dims gives a dict for {what} that are a single array.",
                        f"input_partition_dims {what} entry {part!r}",
                    )
                )
            out.append(_one_input(what, part, sub, sub_axes, topology))
    return tuple(out)


def _one_input(name: str, dims: Any, x: np.ndarray, batch_axis: int, topology: Topology) -> P | None:
    if dims is None:
        return None
    dims = list(dims)
    k = topology.cores_per_replica
    if len(dims) != x.ndim or any(not isinstance(d, int) or d < 1 for d in dims) or int(np.prod(dims)) != k:
        raise ValueError(
            message(
                f"input_partition_dims for `{name}` must have one int >= 1 per dimension, with "
                "product num_cores_per_replica.",
                f"dims {dims} for shape {list(x.shape)} with num_cores_per_replica={k}",
            )
        )
    if dims[batch_axis] != 1:
        raise ValueError(
            message(
                f"input_partition_dims may not split the batch dimension of `{name}`.",
                f"dims {dims} with batch axis {batch_axis}",
                "Use 1 for the batch dimension.",
            )
        )
    free = list(topology.model_axes)
    entries: list[Any] = []
    for d in dims:
        if d == 1:
            entries.append(None)
            continue
        n = d.bit_length() - 1
        if 1 << n != d or n > len(free):
            raise ValueError(
                message(
                    f"input_partition_dims for `{name}` must be powers of 2.", f"dims {dims}"
                )
            )
        take, free = free[:n], free[n:]
        entries.append(take[0] if n == 1 else tuple(take))
    return P(*entries)


def device_spec(inner: P | None, ndim: int, batch_axis: int, leading: int) -> P:
    """The device placement of a host array: "data" on its batch axis, plus the model axes of
    `inner` (the per-replica spec) on the dimensions it partitions."""
    entries: list[Any] = [None] * (leading + ndim)
    if inner is not None:
        entries[leading : leading + len(inner)] = list(inner)
    entries[leading + batch_axis] = DATA
    return P(*entries)
