"""The embedding ops as a training step running once per replica calls them.

The estimator's programs run `train_step` per replica under `shard_map`
manual over "data" (loops/replica.py), or directly on one device. There the
tables are the local blocks of arrays sharded on rows over every device of the
mesh (`P(("data", "model"))` with replicas of several cores, else `P("data")`),
so each of the N devices holds 1/N of every row table and slot:

    acts = lookup_in_replica(spec, coll, emb, ids, weights)   # features[name]
    (loss, ...), (grads, act_grads) = value_and_grad(loss_fn, argnums=(0, 1))(params, acts)
    emb = update_in_replica(spec, coll, emb, ids, weights, act_grads, step)

`act_grads` are gradients of this replica's loss; `update_in_replica` scales
them by 1/R (R replicas), as train_step averages the dense gradients over replicas
(and as the original's CrossShardOptimizer scaled the embedding gradients).

A replica of M > 1 cores (`num_cores_per_replica`) runs the lookup and the update in
a `shard_map` over its "model" axes: its M cores hold the same examples, so core j
takes the j-th 1/M of them (padded to a multiple of M) and the N = R*M devices
then act as a data mesh of N devices with b/M examples each (embedding/lookup.py,
`Collectives.batch_axis` = every table axis): ids routed to their owners over
("data", "model") jointly, the rows combined for the core's examples, and one
`all_gather` over "model" rebuilds the replica's activations. The update takes
each core's slice of the same activation gradients, so no cotangent is counted
twice. Bytes per device: the routing of b/M examples plus the all-gather of the
replica's b activations, flat in R.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from tpu_estimator.api.checks import message
from tpu_estimator.embedding.config import EmbeddingConfigSpec
from tpu_estimator.embedding.lookup import Collectives, apply_local, lookup_local
from tpu_estimator.embedding.plan import table_plans
from tpu_estimator.embedding.sharded import EmbeddingState, ShardedTables
from tpu_estimator.parallel.mesh import DATA, Topology


def table_axes(topology: Topology) -> tuple[str, ...]:
    """The mesh axes tables are sharded over: "data" and the "model" axes of replicas of
    several cores (those of size > 1), so every device holds 1/N of a row table."""
    return (DATA, *(a for a in topology.model_axes if topology.mesh.shape[a] > 1))


def _entry(axes: tuple[str, ...]) -> Any:
    return axes[0] if len(axes) == 1 else tuple(axes)


def replica_tables(spec: EmbeddingConfigSpec, topology: Topology) -> ShardedTables:
    """The tables placed as the per-replica step expects them: over every device (each table
    by its plan), the batch split over the same axes (each core its slice of its replica's)."""
    axes = table_axes(topology)
    return ShardedTables(spec, topology.mesh, batch_axis=_entry(axes), table_axes=axes)


def replica_collectives(topology: Topology) -> Collectives:
    """The collectives of the per-replica step (none on a single device)."""
    if topology.num_devices == 1:
        return Collectives()
    axes = table_axes(topology)
    return Collectives(_entry(axes), axes, topology.num_devices, topology.num_replicas)


def state_specs(
    state: EmbeddingState, plans: Mapping[str, str] | None = None, axes: tuple[str, ...] = (DATA,)
) -> EmbeddingState:
    """PartitionSpecs of an EmbeddingState by each table's plan (`ShardedTables.stored_plans`;
    None: every table "row"): rows over `axes`, columns over them, or whole ("replicated").
    `axes`: ("data",) for the per-replica programs' `shard_map` specs (manual over "data";
    a replica's block is split over "model" inside, `lookup_in_replica`), the table axes
    (`table_axes`) for the state's shardings on the mesh."""
    row = _entry(axes)
    by_plan = {"row": P(row), "column": P(None, row), "replicated": P()}
    spec = {t: by_plan[(plans or {}).get(t, "row")] for t in state.tables}
    return EmbeddingState(
        tables=spec,
        slots={t: {k: spec[t] for k in s} for t, s in state.slots.items()},
        layout=None if state.layout is None else jax.tree.map(lambda _: P(), state.layout),
    )


def split_in_step(
    spec: EmbeddingConfigSpec, features: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(features without ids and weights, ids, weights) of a batch `prepare_features` made;
    a dict operation, the same inside a trace."""
    rest = dict(features)
    ids = {f: rest.pop(f) for f in spec.feature_tables}
    weights = {}
    for f, config in spec.features.items():
        if config.weight_key is not None:
            weights[f] = features[config.weight_key]
            rest.pop(config.weight_key, None)
    return rest, ids, weights


def placeholder_activations(spec: EmbeddingConfigSpec, ids: dict[str, Any], dtype: Any = jnp.float32) -> dict[str, Any]:
    """Zeros shaped like each feature's activations for `ids` (to trace or init model_fn)."""
    out = {}
    for f, config in spec.features.items():
        dim = spec.table_of(f).dimension
        batch = ids[f].shape[0]
        shape = (batch, config.max_sequence_length, dim) if config.max_sequence_length else (batch, dim)
        out[f] = jnp.zeros(shape, dtype)
    return out


def _cores(coll: Collectives) -> tuple[tuple[str, ...], int]:
    """(a replica's own table axes: its "model" axes, none with one core; its cores M).

    Raises:
      ValueError: the batch is not split over those axes too (each core must take its own
        slice of the replica's examples, as `replica_collectives` says).
    """
    inner = tuple(a for a in coll.table_axes if a != DATA)
    if any(a not in coll.batch_axes for a in inner):
        raise ValueError(
            message(
                "Tables sharded over a replica's cores need the batch split over the same axes "
                "(each core looks up its own slice of the replica's examples).",
                f"Collectives(batch_axis={coll.batch_axis!r}, table_axes={coll.table_axes!r})",
                "Use replica_collectives(topology), or batch_axis=table_axes.",
            )
        )
    return inner, coll.num_shards // max(coll.num_replicas, 1)


def _block_specs(spec: EmbeddingConfigSpec, coll: Collectives, tables: Mapping[str, Any]) -> dict[str, P]:
    """The specs of a replica's blocks over its cores: rows or columns split, replicated whole."""
    inner, _ = _cores(coll)
    by_plan = {"row": P(_entry(inner)), "column": P(None, _entry(inner)), "replicated": P()}
    plans = table_plans(spec, coll.num_shards)
    return {t: by_plan[plans[t]] for t in tables}


def _my_examples(x: Any, cores: int, core: Any, fill: Any) -> Any:
    """This core's slice of the replica's examples `x` [b, ...]: ceil(b / M) of them (the
    last core's padded with `fill`)."""
    per = -(-x.shape[0] // cores)
    extra = per * cores - x.shape[0]
    if extra:
        x = jnp.concatenate([x, jnp.full((extra, *x.shape[1:]), fill, x.dtype)])
    return lax.dynamic_slice_in_dim(x, core * per, per, axis=0)


def _over_cores(coll: Collectives, body: Callable[..., Any], in_specs: Any, out_specs: Any) -> Callable[..., Any]:
    """`body` run on each core of a replica (a `shard_map` over its "model" axes)."""
    inner, _ = _cores(coll)
    return jax.shard_map(body, in_specs=in_specs, out_specs=out_specs, axis_names=set(inner), check_vma=False)


def _sliced(
    coll: Collectives, ids: Mapping[str, Any], weights: Mapping[str, Any], grads: Mapping[str, Any] | None = None
) -> tuple[Any, ...]:
    """This core's slices of a replica's ids (padding -1), weights and gradients (padding 0)."""
    inner, cores = _cores(coll)
    core = lax.axis_index(_entry(inner))
    cut = lambda tree, fill: {f: _my_examples(x, cores, core, fill) for f, x in tree.items()}  # noqa: E731
    return (cut(ids, -1), cut(weights, 0), *(() if grads is None else (cut(grads, 0),)))


def lookup_in_replica(
    spec: EmbeddingConfigSpec, coll: Collectives, state: EmbeddingState, ids: dict[str, Any], weights: dict[str, Any]
) -> dict[str, Any]:
    """This replica's activations, `features[name]` for model_fn. A replica of several cores:
    each core looks up its slice of the examples, then one all-gather over its cores."""
    inner, _ = _cores(coll)
    if not inner:
        return lookup_local(spec, coll, state.tables, ids, weights)
    batch = {f: x.shape[0] for f, x in ids.items()}

    def body(tables: Any, ids: Any, weights: Any) -> Any:
        acts = lookup_local(spec, coll, tables, *_sliced(coll, ids, weights))
        return {f: lax.all_gather(a, _entry(inner), axis=0, tiled=True)[: batch[f]] for f, a in acts.items()}

    specs = _block_specs(spec, coll, state.tables)
    return _over_cores(coll, body, (specs, P(), P()), P())(state.tables, ids, weights)


def update_in_replica(
    spec: EmbeddingConfigSpec,
    coll: Collectives,
    state: EmbeddingState,
    ids: dict[str, Any],
    weights: dict[str, Any],
    activation_grads: dict[str, Any],
    step: Any,
) -> EmbeddingState:
    """The state after one embedding-optimizer step from this replica's loss gradients (a
    replica of several cores: each core sends its slice of the examples' gradients)."""
    inner, _ = _cores(coll)
    scale = 1.0 / coll.num_replicas

    def body(tables: Any, slots: Any, ids: Any, weights: Any, grads: Any, step: Any) -> Any:
        if inner:
            ids, weights, grads = _sliced(coll, ids, weights, grads)
        return apply_local(spec, coll, tables, slots, ids, weights, grads, step, grad_scale=scale)

    args = (state.tables, state.slots, ids, weights, activation_grads, step)
    if not inner:
        tables, slots = body(*args)
    else:
        specs = _block_specs(spec, coll, state.tables)
        slot_specs = {t: {k: specs[t] for k in v} for t, v in state.slots.items()}
        tables, slots = _over_cores(
            coll, body, (specs, slot_specs, P(), P(), P(), P()), (specs, slot_specs))(*args)
    return state.replace(tables=tables, slots=slots)
