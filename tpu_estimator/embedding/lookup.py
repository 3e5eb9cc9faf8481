"""Lookups and lazy updates on one device's shard of the tables (inside `shard_map`).

The scheme (each of N devices holds `rows_per_shard` rows of every table and
`b` examples of the global batch B = R*b, R replicas):

forward, per feature
  1. all-gather the ids (and weights) of the global batch over the batch axis:
     [B, width] ints, small next to the activations;
  2. each device gathers the rows it owns (others masked to 0) and combines
     them per example with the combiner's coefficients (sum / mean / sqrtn of
     the weights, which every device knows): a partial [B, dim];
  3. `psum_scatter` over the batch axis sums the partials and leaves each
     replica its own b examples: [b, dim] ([b, max_sequence_length, dim] for
     sequence features). Per device this moves about B*dim values each way,
     like an all-to-all of activations, with no capacity to guess.

backward, per table (all features looking it up together)
  1. all-gather the activation gradients ([B, dim]);
  2. each device forms the gradient of every (example, position) id it owns
     (coefficient x gradient), drops the others, and sums duplicate ids with
     `jnp.unique(size=...)` + `segment_sum`: at most B*width*features rows;
  3. gathers those rows and their slots, applies the optimizer
     (embedding/updates.py) and scatters them back: untouched rows are not
     read or written (lazy; non-lazy Adam updates the whole shard).

On one device (`Collectives()` with no axes) the same code runs without
collectives and with one shard.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from tpu_estimator.embedding.config import EmbeddingConfigSpec
from tpu_estimator.embedding.layout import TableLayout
from tpu_estimator.embedding import updates
from tpu_estimator.embedding.optimizers import AdamParameters


@dataclasses.dataclass(frozen=True)
class Collectives:
    """The manual mesh axes of the surrounding `shard_map`.

    Attributes:
      batch_axis: the axis splitting the global batch into replicas (None: one replica).
      table_axes: the axes table rows are sharded over, in the order of their
        PartitionSpec (empty: the whole table on this device).
      num_shards: the product of the table axes' sizes.
      num_replicas: the size of the batch axis.
    """

    batch_axis: str | None = None
    table_axes: tuple[str, ...] = ()
    num_shards: int = 1
    num_replicas: int = 1

    def gather_batch(self, x: Any) -> Any:
        return x if self.batch_axis is None else lax.all_gather(x, self.batch_axis, axis=0, tiled=True)

    def scatter_batch(self, x: Any) -> Any:
        """Sum of every device's partial for the global batch, this replica's rows of it."""
        if self.batch_axis is not None:
            x = lax.psum_scatter(x, self.batch_axis, scatter_dimension=0, tiled=True)
        rest = tuple(a for a in self.table_axes if a != self.batch_axis)
        return lax.psum(x, rest) if rest else x

    def shard_index(self) -> Any:
        if not self.table_axes:
            return 0
        return lax.axis_index(self.table_axes if len(self.table_axes) > 1 else self.table_axes[0])


def table_layouts(spec: EmbeddingConfigSpec, num_shards: int) -> dict[str, TableLayout]:
    return {
        name: TableLayout(t.vocabulary_size, num_shards, spec.partition_strategy)
        for name, t in spec.tables.items()
    }


def _coefficients(spec: EmbeddingConfigSpec, feature: str, ids: Any, weights: Any) -> Any:
    """[B, width] weight of each id in its example's activation (0 for padding)."""
    valid = ids >= 0
    w = jnp.where(valid, 1.0 if weights is None else weights.astype(jnp.float32), 0.0)
    if spec.features[feature].max_sequence_length:
        return w
    combiner = spec.table_of(feature).combiner
    if combiner == "mean":
        total = w.sum(axis=1, keepdims=True)
        return w / jnp.where(total == 0, 1.0, total)
    if combiner == "sqrtn":
        norm = jnp.sqrt((w * w).sum(axis=1, keepdims=True))
        return w / jnp.where(norm == 0, 1.0, norm)
    return w


def _owned(layout: TableLayout, ids: Any, shard: Any) -> tuple[Any, Any]:
    """(mask of the ids this shard owns, their local rows; 0 where not owned)."""
    owner, row = layout.place(jnp.maximum(ids, 0))
    mine = (ids >= 0) & (owner == shard)
    return mine, jnp.where(mine, row, 0)


def lookup_local(
    spec: EmbeddingConfigSpec,
    coll: Collectives,
    tables: dict[str, Any],
    ids: dict[str, Any],
    weights: dict[str, Any],
) -> dict[str, Any]:
    """This replica's activations of every feature, from this device's table shards.

    `tables[name]` is the local block [rows_per_shard, dim]; `ids[f]` [b, width]
    (−1 = padding) and `weights[f]` (or absent) are this replica's examples.
    """
    layouts = table_layouts(spec, coll.num_shards)
    shard = coll.shard_index()
    out = {}
    for feature, table in spec.feature_tables.items():
        all_ids = coll.gather_batch(ids[feature])
        w = weights.get(feature)
        all_w = None if w is None else coll.gather_batch(w)
        coef = _coefficients(spec, feature, all_ids, all_w)
        mine, rows = _owned(layouts[table], all_ids, shard)
        local = tables[table]
        gathered = jnp.take(local, rows, axis=0).astype(jnp.float32)  # [B, width, dim]
        scaled = gathered * jnp.where(mine, coef, 0.0)[..., None]
        partial = scaled if spec.features[feature].max_sequence_length else scaled.sum(axis=1)
        out[feature] = coll.scatter_batch(partial).astype(local.dtype)
    return out


def row_gradients_local(
    spec: EmbeddingConfigSpec,
    coll: Collectives,
    table: str,
    ids: dict[str, Any],
    weights: dict[str, Any],
    activation_grads: dict[str, Any],
    grad_scale: float = 1.0,
) -> tuple[Any, Any]:
    """(unique local rows [M] (the out-of-range `rows_per_shard` pads), their summed gradients [M, dim]).

    M = global batch x width summed over the table's features (a static bound).
    """
    layout = table_layouts(spec, coll.num_shards)[table]
    shard = coll.shard_index()
    rows_all, grads_all = [], []
    for feature in spec.features_of(table):
        all_ids = coll.gather_batch(ids[feature])
        w = weights.get(feature)
        all_w = None if w is None else coll.gather_batch(w)
        g = coll.gather_batch(activation_grads[feature]).astype(jnp.float32) * grad_scale
        coef = _coefficients(spec, feature, all_ids, all_w)
        if not spec.features[feature].max_sequence_length:
            g = g[:, None, :]
        per_id = coef[..., None] * g  # [B, width, dim]
        mine, rows = _owned(layout, all_ids, shard)
        rows_all.append(jnp.where(mine, rows, layout.rows_per_shard).reshape(-1))
        grads_all.append(per_id.reshape(-1, per_id.shape[-1]))
    rows = jnp.concatenate(rows_all)
    grads = jnp.concatenate(grads_all)
    size = rows.shape[0]
    unique, inverse = jnp.unique(
        rows, size=size, fill_value=layout.rows_per_shard, return_inverse=True
    )
    summed = jax.ops.segment_sum(grads, inverse.reshape(-1), num_segments=size)
    return unique, summed


def apply_local(
    spec: EmbeddingConfigSpec,
    coll: Collectives,
    tables: dict[str, Any],
    slots: dict[str, dict[str, Any]],
    ids: dict[str, Any],
    weights: dict[str, Any],
    activation_grads: dict[str, Any],
    step: Any,
    grad_scale: float = 1.0,
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """New local table and slot blocks after one step of the embedding optimizer.

    `activation_grads[f]` has the shape of feature f's activations on this
    replica; `grad_scale` multiplies them (1/replicas when they are gradients of
    one replica's loss, as train_step's dense gradients are averaged).
    """
    opt = spec.optimization_parameters
    new_tables, new_slots = {}, {}
    for table in spec.tables:
        local, local_slots = tables[table], slots.get(table, {})
        lr = spec.tables[table].learning_rate_at(step)  # None: the optimizer's
        unique, grads = row_gradients_local(spec, coll, table, ids, weights, activation_grads, grad_scale)
        grads = updates.prepare_gradients(
            opt, grads, step, clipping_limit=spec.clipping_limit,
            multiplier_fn=spec.experimental_gradient_multiplier_fn,
        )
        if isinstance(opt, AdamParameters) and not opt.lazy_adam:
            dense = jnp.zeros(local.shape, jnp.float32).at[unique].add(grads, mode="drop")
            new_rows, new_s = updates.update(opt, local.astype(jnp.float32), local_slots, dense, step, lr)
            new_tables[table] = new_rows.astype(local.dtype)
            new_slots[table] = new_s
            continue
        # the pads (index rows_per_shard) read as 0 (slots as 1, so no rule divides by 0) and are
        # never written back
        def take(a: Any, fill: float) -> Any:
            return a.at[unique].get(mode="fill", fill_value=fill).astype(jnp.float32)

        rows, row_slots = take(local, 0.0), {k: take(v, 1.0) for k, v in local_slots.items()}
        new_rows, new_s = updates.update(opt, rows, row_slots, grads, step, lr)
        new_tables[table] = local.at[unique].set(new_rows.astype(local.dtype), mode="drop")
        new_slots[table] = {
            k: local_slots[k].at[unique].set(v.astype(local_slots[k].dtype), mode="drop") for k, v in new_s.items()
        }
    return new_tables, new_slots
