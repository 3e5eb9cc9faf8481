"""Row-sharded tables looked up together: one exchange per direction for a group of tables.

Tables routed to their owners (embedding/routing.py) that share an embedding
dimension and dtype (and, as every table of a spec, the partition strategy and
device count) form a `TableGroup`. On each device the group is seen as one block
of `rows_per_shard = sum of its tables' rows_per_shard` rows: table t's local rows
follow the tables before it (`offsets`), so an id's storage index in the group
is `owner * rows_per_shard + offset_t + local row`. The tables' arrays are not
concatenated (the state keeps one array per table, `embedding/<table>`): only the
ids are. Per step and group, a device

- deduplicates the ids of all the group's features at once, and runs ONE routing:
  one `pmax` of the rounds, per round one `all_to_all` of `[N, C]` local rows out
  and one of `[N, C, dim]` rows back, C from the group's id slots (the sum of its
  tables'); the owner answers each request from its table's block (`read`);
- sends the per-unique-id gradients back the same way, once for the group, and
  applies each table's own update rule (learning rate, slots) to its rows of what
  arrived: the same rows and summed gradients as routing that table alone, so the
  results equal the per-table exchange's (and 1 device's) to float rounding.

A group of one table is exactly the per-table exchange. Replicated tables get the
same treatment for their one collective (`replicated_gradients`): one all-reduce of
every replicated table's dense gradient (and touched rows, where the optimizer needs
them), not one per table.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from tpu_estimator.embedding import routing, updates
from tpu_estimator.embedding.coefficients import combine, id_gradients
from tpu_estimator.embedding.config import EmbeddingConfigSpec
from tpu_estimator.embedding.layout import TableLayout


MAX_ROWS = 2**31 - 2  # a group's storage rows, and its padding index, fit the int32 ids


@dataclasses.dataclass(frozen=True)
class TableGroup:
    """Tables whose blocks sit one after another on each of `num_shards` devices.

    Attributes:
      tables: the table names, in the spec's order.
      layouts: each table's row placement (the same `num_shards` and strategy).
    """

    tables: tuple[str, ...]
    layouts: tuple[TableLayout, ...]

    @property
    def num_shards(self) -> int:
        return self.layouts[0].num_shards

    @property
    def offsets(self) -> tuple[int, ...]:
        """Where each table's local rows start in the group's block."""
        return tuple(itertools.accumulate((t.rows_per_shard for t in self.layouts[:-1]), initial=0))

    @property
    def rows_per_shard(self) -> int:
        return sum(t.rows_per_shard for t in self.layouts)

    @property
    def storage_rows(self) -> int:
        return self.num_shards * self.rows_per_shard

    def keys(self, ids: list[Any]) -> Any:
        """The group's storage index of each of `ids[i]` (table i's flat ids, -1 padding),
        concatenated in table order; `storage_rows` for padding."""
        parts = []
        for layout, offset, flat in zip(self.layouts, self.offsets, ids):
            owner, row = layout.place(jnp.maximum(flat, 0))
            parts.append(jnp.where(flat >= 0, owner * self.rows_per_shard + offset + row, self.storage_rows))
        return jnp.concatenate(parts)

    def local(self, rows: Any, i: int) -> Any:
        """Table i's local rows of the group's local rows `rows` (its `rows_per_shard`, out of
        range, where a row is another table's or padding)."""
        start, size = self.offsets[i], self.layouts[i].rows_per_shard
        inside = (rows >= start) & (rows < start + size)
        return jnp.where(inside, rows - start, size)

    def reader(self, blocks: list[Any]) -> Any:
        """`routing.fetch_rows`' `read`: each asked row from its table's block (0 for padding)."""
        if len(blocks) == 1:
            return routing.local_rows(blocks[0])

        def read(asked: Any) -> Any:
            out = None
            for i, block in enumerate(blocks):
                rows = self.local(asked, i)
                got = block.at[rows].get(mode="fill", fill_value=0)
                out = got if out is None else jnp.where((rows < block.shape[0])[..., None], got, out)
            return out

        return read


def groups(spec: EmbeddingConfigSpec, layouts: dict[str, TableLayout], tables: dict[str, Any],
           routed: list[str], fuse: bool = True) -> list[TableGroup]:
    """The `routed` tables grouped by (dimension, dtype of their block in `tables`), in the
    spec's order (`fuse=False`: one group per table); a group holds at most `MAX_ROWS`
    storage rows (its int32 ids), the next table of its key starting another."""
    keyed: dict[Any, list[list[str]]] = {}
    for name in routed:
        key = (spec.tables[name].dimension, jnp.dtype(tables[name].dtype)) if fuse else name
        runs = keyed.setdefault(key, [[]])
        if runs[-1] and sum(layouts[n].storage_rows for n in runs[-1]) + layouts[name].storage_rows > MAX_ROWS:
            runs.append([])
        runs[-1].append(name)
    return [TableGroup(tuple(names), tuple(layouts[n] for n in names)) for runs in keyed.values() for names in runs]


def _route(spec: EmbeddingConfigSpec, group: TableGroup, ids: dict[str, Any], axis: str,
           factor: float) -> tuple[int, routing.Route]:
    """(capacity, route) of this device's ids of the group's features (flattened feature by
    feature, table by table, as `keys` concatenates them)."""
    flat = [jnp.concatenate([ids[f].reshape(-1) for f in spec.features_of(t)]) for t in group.tables]
    keys = group.keys(flat)
    cap = routing.capacity(keys.shape[0], group.num_shards, factor)
    return cap, routing.plan_keys(group, keys, axis, cap)


def lookup(spec: EmbeddingConfigSpec, group: TableGroup, tables: dict[str, Any], ids: dict[str, Any],
           weights: dict[str, Any], axis: str, factor: float) -> dict[str, Any]:
    """The activations of the group's features on this replica: one routing for the group."""
    cap, route = _route(spec, group, ids, axis, factor)
    read = group.reader([tables[t] for t in group.tables])
    rows = routing.fetch_rows(route, group, read, axis, cap)  # [M, dim]
    out, start = {}, 0
    for table in group.tables:
        for feature in spec.features_of(table):
            shape = ids[feature].shape
            inverse = route.inverse[start : start + ids[feature].size].reshape(shape)
            start += ids[feature].size
            combined = combine(spec, feature, rows[inverse].astype(jnp.float32), ids[feature], weights.get(feature))
            out[feature] = combined.astype(tables[table].dtype)
    return out


def apply(spec: EmbeddingConfigSpec, group: TableGroup, tables: dict[str, Any], slots: dict[str, Any],
          ids: dict[str, Any], weights: dict[str, Any], activation_grads: dict[str, Any], step: Any,
          axis: str, factor: float, grad_scale: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """(new blocks, new slots) of the group's tables: the row gradients sent to their owners
    once for the group, each table's rule applied to its rows."""
    cap, route = _route(spec, group, ids, axis, factor)
    per_id = jnp.concatenate([
        id_gradients(spec, f, ids, weights, activation_grads, grad_scale)
        for t in group.tables for f in spec.features_of(t)
    ])
    summed = jax.ops.segment_sum(per_id, route.inverse, num_segments=route.unique.shape[0])
    rules = [updates.TableRule(spec, t, step) for t in group.tables]
    state = ([tables[t] for t in group.tables], [slots.get(t, {}) for t in group.tables])

    def once(blocks: list[Any], block_slots: list[Any]) -> Any:
        unique, grads = routing.send_gradients_once(route, group, summed, axis, cap)
        new = [rule.rows(b, s, group.local(unique, i), grads) for i, (rule, b, s) in
               enumerate(zip(rules, blocks, block_slots))]
        return [n[0] for n in new], [n[1] for n in new]

    def rounds(blocks: list[Any], block_slots: list[Any]) -> Any:
        dense, touched = routing.send_gradients_dense(route, group, summed, axis, cap)
        new = []
        for rule, b, s, start, layout in zip(rules, blocks, block_slots, group.offsets, group.layouts):
            part = slice(start, start + layout.rows_per_shard)
            new.append(rule.dense(b, s, dense[part], touched[part]))
        return [n[0] for n in new], [n[1] for n in new]

    new_tables, new_slots = lax.cond(route.rounds <= 1, once, rounds, *state)
    return dict(zip(group.tables, new_tables)), dict(zip(group.tables, new_slots))


def replicated_gradients(
    spec: EmbeddingConfigSpec, names: list[str], ids: dict[str, Any], weights: dict[str, Any],
    activation_grads: dict[str, Any], grad_scale: float, axis: str,
) -> dict[str, tuple[Any, Any]]:
    """table -> (its dense [V, dim] gradient summed over the replicas, the rows any replica
    looked up), for the replicated tables `names`: each replica's id gradients added into
    dense tables, then ONE all-reduce of them all (bytes flat in the device count: the
    tables' size, whatever the batch). The rows looked up are None where the optimizer
    leaves a row alone on a zero gradient (`updates.zero_gradient_keeps_rows`: the dense
    update then equals the lazy one, so no mask is counted, all-reduced or applied)."""
    counted = not updates.zero_gradient_keeps_rows(spec)
    local = {}
    for table in names:
        features = spec.features_of(table)
        vocabulary, dim = spec.tables[table].vocabulary_size, spec.tables[table].dimension
        per_id = jnp.concatenate([id_gradients(spec, f, ids, weights, activation_grads, grad_scale) for f in features])
        flat = jnp.concatenate([ids[f].reshape(-1) for f in features])
        rows = jnp.where(flat >= 0, flat, vocabulary)  # padding: out of range, dropped
        dense = jnp.zeros((vocabulary, dim), jnp.float32).at[rows].add(per_id, mode="drop")
        count = jnp.zeros((vocabulary,), jnp.float32).at[rows].add(1.0, mode="drop") if counted else None
        local[table] = (dense, count)
    summed = lax.psum(local, axis)
    return {t: (dense, None if count is None else count > 0) for t, (dense, count) in summed.items()}
