"""The embedding ops as a training step running once per replica calls them.

The estimator's programs run `train_step` per replica under `shard_map`
manual over "data" (loops/replica.py), or directly on one device. There the
tables are the local blocks of arrays sharded `P("data")` on rows, so each
of the R replicas' devices holds 1/R of every table and slot:

    acts = lookup_in_replica(spec, coll, emb, ids, weights)   # features[name]
    (loss, ...), (grads, act_grads) = value_and_grad(loss_fn, argnums=(0, 1))(params, acts)
    emb = update_in_replica(spec, coll, emb, ids, weights, act_grads, step)

`act_grads` are gradients of this replica's loss; `update_in_replica` scales
them by 1/R, as train_step averages the dense gradients over replicas (and as
the original's CrossShardOptimizer scaled the embedding gradients).
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from tpu_estimator.embedding.config import EmbeddingConfigSpec
from tpu_estimator.embedding.lookup import Collectives, apply_local, lookup_local
from tpu_estimator.embedding.sharded import EmbeddingState, ShardedTables
from tpu_estimator.parallel.mesh import DATA, Topology


def replica_tables(spec: EmbeddingConfigSpec, topology: Topology) -> ShardedTables:
    """The tables placed as the per-replica step expects them: over "data" (each table by its plan)."""
    return ShardedTables(spec, topology.mesh, batch_axis=DATA, table_axes=(DATA,))


def replica_collectives(topology: Topology) -> Collectives:
    """The collectives of the per-replica step (none on a single device)."""
    if topology.num_devices == 1:
        return Collectives()
    return Collectives(DATA, (DATA,), topology.num_replicas, topology.num_replicas)


def state_specs(state: EmbeddingState, plans: Mapping[str, str] | None = None) -> EmbeddingState:
    """`shard_map` in/out specs of an EmbeddingState in the per-replica step: by each table's
    plan (`ShardedTables.plans`; None: every table "row"): rows over "data", columns over
    "data", or whole ("replicated")."""
    by_plan = {"row": P(DATA), "column": P(None, DATA), "replicated": P()}
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


def lookup_in_replica(
    spec: EmbeddingConfigSpec, coll: Collectives, state: EmbeddingState, ids: dict[str, Any], weights: dict[str, Any]
) -> dict[str, Any]:
    """This replica's activations, `features[name]` for model_fn."""
    return lookup_local(spec, coll, state.tables, ids, weights)


def update_in_replica(
    spec: EmbeddingConfigSpec,
    coll: Collectives,
    state: EmbeddingState,
    ids: dict[str, Any],
    weights: dict[str, Any],
    activation_grads: dict[str, Any],
    step: Any,
) -> EmbeddingState:
    """The state after one embedding-optimizer step from this replica's loss gradients."""
    tables, slots = apply_local(
        spec, coll, state.tables, state.slots, ids, weights, activation_grads, step,
        grad_scale=1.0 / coll.num_replicas,
    )
    return state.replace(tables=tables, slots=slots)
