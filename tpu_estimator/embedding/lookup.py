"""Lookups and lazy updates on one device's shard of the tables (inside `shard_map`).

Each of N devices holds `rows_per_shard` rows of every table and, in the
per-replica step, `b` examples of the global batch B = N*b. Two schemes:

Which one a table uses (`Collectives.routing`): "auto" (the default) routes a
table when every device both takes its own slice of the batch and holds one
shard (table axes == batch axes: ("data",), or ("data", "model") in replicas of
several cores, embedding/replica.py) and routing is estimated to move fewer
bytes per device than the all-gather (`bytes_per_device`: routing's bytes are
flat in N, the all-gather's grow with N, so small meshes and wide tables with
few ids keep the all-gather); "owners" routes every table it can, "all_gather"
none.

routed to owners
  forward, per group of routed tables of one dimension (embedding/fused.py: one
  exchange for the group, the tables' ids tagged by their offset in it), the
  device deduplicates its own examples' ids (all the group's features: at most
  M = b x ids per example), sends each unique id to
  the device owning its row and gets the row back (two `all_to_all`s of
  `[N, C]` ids and `[N, C, dim]` rows, C ~ capacity_factor*M/N: about
  capacity_factor*M ids and rows per device at any N), and combines the rows
  per example locally with the combiner's coefficients;
  backward: the per-id gradients summed per unique id travel to the owners
  the same way (one exchange per group); the owner sums them per row and
  updates those rows lazily, each table by its own rule.
  Exact: when one owner gets more than C of a device's ids, more rounds run
  (agreed over the devices); see embedding/routing.py for the rounds and the
  worst case (about the all-gather scheme's bytes, N/capacity_factor rounds).
  Bytes and ids processed per device do not grow with N at a fixed b.

all-gathered batch (`routing="all_gather"`, and tables sharded over more axes
than the batch, e.g. a ("data", "model") mesh)
  forward, per feature
    1. all-gather the ids (and weights) of the global batch over the batch axis:
       [B, width] ints;
    2. each device gathers the rows it owns (others masked to 0) and combines
       them per example with the combiner's coefficients: a partial [B, dim];
    3. `psum_scatter` over the batch axis sums the partials and leaves each
       replica its own b examples: [b, dim] ([b, max_sequence_length, dim] for
       sequence features). Per device about B*dim values: grows with N.
  backward, per table (all features looking it up together)
    1. all-gather the activation gradients ([B, dim]);
    2. each device forms the gradient of every (example, position) id it owns
       (coefficient x gradient), drops the others, and sums duplicate ids with
       `jnp.unique(size=...)` + `segment_sum`: at most B*width*features rows;
    3. gathers those rows and their slots, applies the optimizer
       (embedding/updates.py) and scatters them back: untouched rows are not
       read or written (lazy; non-lazy Adam updates the whole shard).

Tables whose plan (embedding/plan.py) is not "row" hold every row on each device
(one-shard layouts): "replicated" ones run the all-gather code on this replica's
examples alone (no collective forward); the backward adds the replica's id
gradients into a dense [V, dim] gradient, all-reduced with the rows touched (one
all-reduce for every replicated table, embedding/fused.py), and
every device applies the same lazy update (as data parallelism with dense table
gradients; bytes flat in N); with SGD or Adagrad, which leave a row with a zero
gradient as it is (`updates.zero_gradient_keeps_rows`), the update is dense and the
rows touched are neither counted nor all-reduced (the hand-written `jnp.take` step).
"Column" ones gather the global batch, combine this device's columns and
`all_to_all` the [B, dim/N] partials into each replica's [b, dim] (the gradients
travel back the same way).

On one device (`Collectives()` with no axes) the all-gather code runs without
collectives and with one shard.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import jax
import jax.numpy as jnp
from jax import lax

from tpu_estimator.api.checks import message
from tpu_estimator.embedding import fused, routing, updates
from tpu_estimator.embedding.coefficients import coefficients
from tpu_estimator.embedding.config import EmbeddingConfigSpec
from tpu_estimator.embedding.layout import TableLayout
from tpu_estimator.embedding.plan import table_plans


@dataclasses.dataclass(frozen=True)
class Collectives:
    """The manual mesh axes of the surrounding `shard_map`.

    Attributes:
      batch_axis: the axis (or axes, jointly) splitting the global batch among the devices
        (None: one replica). In a replica of several cores (embedding/replica.py) every
        device of the mesh takes its own slice of the examples: ("data", "model").
      table_axes: the axes table rows are sharded over, in the order of their
        PartitionSpec (empty: the whole table on this device).
      num_shards: the product of the table axes' sizes.
      num_replicas: the replicas (the size of "data"): a replica's activation gradients
        are scaled by 1/num_replicas (embedding/replica.py).
      routing: "auto": per table, whichever of the two schemes moves fewer bytes
        per device (`bytes_per_device`); "owners": ids sent to the devices owning
        their rows (all-to-all; where the table axes are the batch axes); "all_gather":
        every device sees the global batch's ids.
      capacity_factor: C = ceil(capacity_factor * M / N) requests per owner and
        round (M: a device's id slots of a table); more rounds when exceeded.
      fuse_tables: routed tables of one dimension share one exchange per direction,
        replicated tables one all-reduce (embedding/fused.py); False: each table its
        own (the results are the same; for comparisons).
    """

    batch_axis: str | tuple[str, ...] | None = None
    table_axes: tuple[str, ...] = ()
    num_shards: int = 1
    num_replicas: int = 1
    routing: Literal["auto", "owners", "all_gather"] = "auto"
    capacity_factor: float = 2.0
    fuse_tables: bool = True

    def __post_init__(self) -> None:
        if self.routing not in ("auto", "owners", "all_gather"):
            raise ValueError(
                message(
                    "Collectives.routing must be 'auto', 'owners' or 'all_gather'.",
                    f"routing={self.routing!r}",
                    "Use routing='auto' (the default).",
                )
            )
        if not self.capacity_factor > 0:
            raise ValueError(
                message(
                    "Collectives.capacity_factor must be positive.",
                    f"capacity_factor={self.capacity_factor!r}",
                    "Use capacity_factor=2.0 (the default).",
                )
            )

    @property
    def batch_axes(self) -> tuple[str, ...]:
        """The axes the global batch is split over (`batch_axis` as a tuple)."""
        if self.batch_axis is None:
            return ()
        return (self.batch_axis,) if isinstance(self.batch_axis, str) else tuple(self.batch_axis)

    @property
    def routed(self) -> bool:
        """Whether ids may go to their owners (else the global batch is all-gathered)."""
        return (
            self.routing != "all_gather"
            and self.batch_axis is not None
            and self.table_axes == self.batch_axes
            and self.num_shards > 1
        )

    def gather_batch(self, x: Any) -> Any:
        return x if self.batch_axis is None else lax.all_gather(x, self.batch_axis, axis=0, tiled=True)

    def scatter_batch(self, x: Any) -> Any:
        """Sum of every device's partial for the global batch, this replica's rows of it."""
        if self.batch_axis is not None:
            x = lax.psum_scatter(x, self.batch_axis, scatter_dimension=0, tiled=True)
        rest = tuple(a for a in self.table_axes if a not in self.batch_axes)
        return lax.psum(x, rest) if rest else x

    def batch_of_columns(self, x: Any) -> Any:
        """[B, ..., dim / N] (the global batch, this device's columns) -> [b, ..., dim] (this
        replica's examples, every column): a "column" table's activations."""
        return lax.all_to_all(x, self.batch_axis, 0, x.ndim - 1, tiled=True)

    def columns_of_batch(self, x: Any) -> Any:
        """The inverse of `batch_of_columns`: this replica's [b, ..., dim] gradients -> the
        global batch's [B, ..., dim / N] of this device's columns."""
        return lax.all_to_all(x, self.batch_axis, x.ndim - 1, 0, tiled=True)

    def shard_index(self) -> Any:
        if not self.table_axes:
            return 0
        return lax.axis_index(self.table_axes if len(self.table_axes) > 1 else self.table_axes[0])


def table_layouts(spec: EmbeddingConfigSpec, num_shards: int) -> dict[str, TableLayout]:
    """Each table's row placement: over the `num_shards` devices for "row" plans, one shard
    (the logical order: whole on each device, or split by columns) for the others."""
    plans = table_plans(spec, num_shards)
    return {
        name: TableLayout(t.vocabulary_size, num_shards if plans[name] == "row" else 1, spec.partition_strategy)
        for name, t in spec.tables.items()
    }


def _owned(layout: TableLayout, ids: Any, shard: Any) -> tuple[Any, Any]:
    """(mask of the ids this shard owns, their local rows; 0 where not owned). One shard (a
    replicated or column table, one device): every valid id, its row the id itself."""
    if layout.num_shards == 1:
        return ids >= 0, jnp.maximum(ids, 0)
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
    routed = [t for t in spec.tables if routes(spec, coll, t, ids)]
    out = _lookup_routed(spec, coll, tables, ids, weights, routed)
    layouts, plans = table_layouts(spec, coll.num_shards), table_plans(spec, coll.num_shards)
    for feature, table in spec.feature_tables.items():
        if table in routed:
            continue
        plan = plans[table]
        gather = _same if plan == "replicated" else coll.gather_batch  # replicated: own examples
        all_ids = gather(ids[feature])
        w = weights.get(feature)
        all_w = None if w is None else gather(w)
        coef = coefficients(spec, feature, all_ids, all_w)
        mine, rows = _owned(layouts[table], all_ids, coll.shard_index() if plan == "row" else 0)
        local = tables[table]
        gathered = jnp.take(local, rows, axis=0).astype(jnp.float32)  # [B, width, dim]
        # coef is 0 for padding: with one shard every other id is this device's
        scaled = gathered * (coef if layouts[table].num_shards == 1 else jnp.where(mine, coef, 0.0))[..., None]
        partial = scaled if spec.features[feature].max_sequence_length else scaled.sum(axis=1)
        if plan == "row":
            partial = coll.scatter_batch(partial)
        elif plan == "column":
            partial = coll.batch_of_columns(partial)
        out[feature] = partial.astype(local.dtype)
    return {f: out[f] for f in spec.feature_tables}


def _same(x: Any) -> Any:
    return x


def bytes_per_device(spec: EmbeddingConfigSpec, coll: Collectives, table: str, ids: dict[str, Any]) -> dict[str, int]:
    """Estimated bytes one device sends and receives per training step for `table`'s
    lookup and gradients, by scheme (static: from the shapes of this replica's `ids`).

    all_gather: the global batch's ids (and weights) in, the partial activations
    reduce-scattered out and their gradients all-gathered in: N x (4 M [+4 M] + 8 A)
    (M: this replica's id slots of the table, A: its activation values).
    owners: one round of C = capacity(M, N) requests per owner: ids out and back,
    rows back, gradients out: N x C x (8 + 8 dim), about 2 capacity_factor x M x
    (1 + dim) x 4, whatever N is.
    """
    features = spec.features_of(table)
    n, dim = coll.num_shards, spec.tables[table].dimension
    m = sum(int(ids[f].size) for f in features)
    acts = sum(
        int(ids[f].size if spec.features[f].max_sequence_length else ids[f].shape[0]) * dim for f in features
    )
    weighted = sum(int(ids[f].size) for f in features if spec.features[f].weight_key)
    cap = routing.capacity(m, n, coll.capacity_factor)
    return {"all_gather": n * (4 * (m + weighted) + 8 * acts), "owners": n * cap * (8 + 8 * dim)}


def routes(spec: EmbeddingConfigSpec, coll: Collectives, table: str, ids: dict[str, Any]) -> bool:
    """Whether `table`'s ids go to their owners in this step (see `Collectives.routing`)."""
    if not coll.routed or not spec.features_of(table) or table_plans(spec, coll.num_shards)[table] != "row":
        return False
    if coll.routing == "owners":
        return True
    estimate = bytes_per_device(spec, coll, table, ids)
    return estimate["owners"] < estimate["all_gather"]


def _lookup_routed(
    spec: EmbeddingConfigSpec, coll: Collectives, tables: dict[str, Any], ids: dict[str, Any],
    weights: dict[str, Any], routed: list[str],
) -> dict[str, Any]:
    """The activations of the features of the `routed` tables: one routing per group of
    tables of one dimension (embedding/fused.py)."""
    out = {}
    for group in fused.groups(spec, table_layouts(spec, coll.num_shards), tables, routed, coll.fuse_tables):
        out.update(fused.lookup(spec, group, tables, ids, weights, coll.batch_axis, coll.capacity_factor))
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
    layout, plan = table_layouts(spec, coll.num_shards)[table], table_plans(spec, coll.num_shards)[table]
    shard = coll.shard_index() if plan == "row" else 0  # the others: every row on this device
    to_global = coll.columns_of_batch if plan == "column" else coll.gather_batch
    rows_all, grads_all = [], []
    for feature in spec.features_of(table):
        all_ids = coll.gather_batch(ids[feature])
        w = weights.get(feature)
        all_w = None if w is None else coll.gather_batch(w)
        g = to_global(activation_grads[feature]).astype(jnp.float32) * grad_scale
        coef = coefficients(spec, feature, all_ids, all_w)
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
    new_tables, new_slots = {}, {}
    routed = [t for t in spec.tables if routes(spec, coll, t, ids)]
    for group in fused.groups(spec, table_layouts(spec, coll.num_shards), tables, routed, coll.fuse_tables):
        group_tables, group_slots = fused.apply(
            spec, group, tables, slots, ids, weights, activation_grads, step, coll.batch_axis,
            coll.capacity_factor, grad_scale,
        )
        new_tables.update(group_tables)
        new_slots.update(group_slots)
    plans = table_plans(spec, coll.num_shards)
    replicated = [t for t in spec.tables if coll.batch_axis is not None and plans[t] == "replicated"]
    dense = {}
    for names in [replicated] if coll.fuse_tables else [[t] for t in replicated]:
        dense.update(fused.replicated_gradients(spec, names, ids, weights, activation_grads, grad_scale,
                                                coll.batch_axis))
    for table in spec.tables:
        if table in new_tables:
            continue
        rule = updates.TableRule(spec, table, step)
        local, local_slots = tables[table], slots.get(table, {})
        if table in dense:
            new_tables[table], new_slots[table] = rule.dense(local, local_slots, *dense[table])
            continue
        unique, grads = row_gradients_local(spec, coll, table, ids, weights, activation_grads, grad_scale)
        new_tables[table], new_slots[table] = rule.rows(local, local_slots, unique, grads)
    return {t: new_tables[t] for t in spec.tables}, {t: new_slots[t] for t in spec.tables}
