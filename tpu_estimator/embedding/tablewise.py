"""Table-wise tables ("table" plan): whole tables on one device each, stacked into one array.

A program over the mesh cannot take an array that lives on one of its devices, so the
tables of plan "table" that can share an array (one dimension, combiner and learning
rate: what a row-sharded table's lookup and update read from its `TableConfig`) are
STACKED: a `Stack` is one storage array `[N * R, dim]` sharded by rows over the N
devices, whose device d holds, one after another, the whole tables `pack` put on d (R:
the largest device's rows). Table t on device d_t at local offset o_t has its id i at
storage row `d_t * R + o_t + i`; a stack is looked up and trained as one row-sharded table
of `N * R` rows (`storage_spec`: the features of its tables point at it, their ids moved
by `storage_ids`), so the routed all-to-all (embedding/fused.py, embedding/routing.py)
sends every id to the one device holding its table; each device answers from and updates
only its own tables, whatever N.

The state keys a stack as `_tablewise_<k>` (tables and slots), and its saved layout is
`{stack: {table: code}}` (embedding/layout.py `MemberLayout`: each table's device, offset
and R), so checkpoints, `load_variable` and exports still see each whole logical table by
its name, and a checkpoint restores across plans and device counts (embedding/restore.py).
Each device draws only the tables packed onto it (embedding/initial.py `stack_in_place`).

`pack`: greedy, biggest table first, each onto the device holding the fewest of the
stack's rows so far (the stack's R, its memory on every device, is the largest device's
rows), ties broken by what the devices hold of the other stacks (values, then expected
lookups), then by the stack's lookups, then the lowest device; a table's expected
lookups are its features (times `max_sequence_length` for sequence features) per
example. Every device holds R rows of a stack, so a stack of fewer tables than devices,
or of very unequal ones, holds empty rows: table-wise pays where many tables of similar
size share a dimension.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax.numpy as jnp
import numpy as np

from tpu_estimator.api.checks import message
from tpu_estimator.embedding.config import EmbeddingConfigSpec, TableConfig
from tpu_estimator.embedding.layout import MemberLayout

PREFIX = "_tablewise_"  # a stack's key in the state: PREFIX + its index
MAX_ROWS = 2**31 - 2  # a stack's storage rows fit the int32 ids


@dataclasses.dataclass(frozen=True)
class Stack:
    """Whole tables stacked into one row-sharded array of `num_shards * rows_per_shard` rows.

    Attributes:
      name: the state key (`PREFIX` + index).
      members: each table's placement (`MemberLayout`: device, offset, rows), by name.
      config: the stack as one row-sharded table (its tables' dimension, combiner and
        learning rate).
    """

    name: str
    members: tuple[tuple[str, MemberLayout], ...]
    config: TableConfig

    @property
    def layouts(self) -> dict[str, MemberLayout]:
        return dict(self.members)

    @property
    def num_shards(self) -> int:
        return self.members[0][1].num_shards

    @property
    def rows_per_shard(self) -> int:
        return self.members[0][1].rows_per_shard

    @property
    def storage_rows(self) -> int:
        return self.num_shards * self.rows_per_shard

    def to_storage(self, logical: Mapping[str, Any]) -> np.ndarray:
        """The stack's storage array `[N * R, ...]` from its tables' logical arrays (zeros
        between them)."""
        first = np.asarray(logical[self.members[0][0]])
        out = np.zeros((self.storage_rows, *first.shape[1:]), first.dtype)
        for table, layout in self.members:
            out[layout.start : layout.start + layout.vocabulary_size] = np.asarray(logical[table])
        return out


def expected_lookups(spec: EmbeddingConfigSpec, table: str) -> int:
    """Rows looked up per example (a static estimate): per feature `max_sequence_length` (a
    sequence feature), `max_ids_per_example` (a bag whose width was given), else one."""
    return sum(spec.features[f].ids_per_example for f in spec.features_of(table))


def pack(
    sizes: Mapping[str, tuple[int, int]], num_shards: int, loads: list[list[int]] | None = None
) -> dict[str, tuple[int, int]]:
    """table -> (device, offset) of whole tables over `num_shards` devices, from each table's
    (rows, expected lookups): biggest first, each onto the device with the fewest rows so far
    (ties: the fewest of the `loads` already there, [rows x dimension, lookups] per device
    from other stacks, updated in place; then the fewest lookups; then the lowest index);
    offsets in placing order."""
    rows = [0] * num_shards
    loads = [[0, 0] for _ in range(num_shards)] if loads is None else loads
    out = {}
    for name in sorted(sizes, key=lambda t: (-sizes[t][0], -sizes[t][1], t)):
        device = min(range(num_shards), key=lambda d: (rows[d], loads[d][0], loads[d][1], d))
        out[name] = (device, rows[device])
        rows[device] += sizes[name][0]
        loads[device][1] += sizes[name][1]
    return out


def stack_key(config: TableConfig) -> tuple[Any, ...]:
    """What the tables of one stack share: what a row table's lookup and update read."""
    return (config.dimension, config.combiner, config.learning_rate, id(config.learning_rate_fn))


def padding(spec: EmbeddingConfigSpec, names: list[str], num_shards: int) -> float:
    """Stored rows / table rows of the tables `names` (of one stack) packed over `num_shards`
    devices: 1.0 when every device holds as many rows."""
    sizes = {t: (spec.tables[t].vocabulary_size, expected_lookups(spec, t)) for t in names}
    rows = max(o + sizes[t][0] for t, (_, o) in pack(sizes, num_shards).items())
    return num_shards * rows / sum(v for v, _ in sizes.values())


def fitting(spec: EmbeddingConfigSpec, names: list[str], num_shards: int, max_padding: float) -> list[str]:
    """Of the tables `names`, those a stack holds with at most `max_padding` stored rows per
    table row: per stack key, the smallest tables, the biggest left out until they fit
    (the planner's table-wise rule, embedding/plan.py)."""
    groups: dict[tuple[Any, ...], list[str]] = {}
    for name in sorted(names, key=lambda t: (spec.tables[t].vocabulary_size, t)):
        groups.setdefault(stack_key(spec.tables[name]), []).append(name)
    out = []
    for group in groups.values():
        while len(group) > 1 and padding(spec, group, num_shards) > max_padding:
            group = group[:-1]
        if len(group) > 1 and padding(spec, group, num_shards) <= max_padding:
            out.extend(group)
    return out


def stacks(spec: EmbeddingConfigSpec, plans: Mapping[str, str], num_shards: int) -> tuple[Stack, ...]:
    """The stacks of the tables whose plan is "table" over `num_shards` devices (none on one
    device), in the order of their first table's name."""
    names = [t for t in spec.tables if plans[t] == "table"]
    if num_shards <= 1 or not names:
        return ()
    clash = [t for t in spec.tables if t.startswith(PREFIX)]
    if clash:
        raise ValueError(
            message(
                f"Table names starting with {PREFIX!r} are kept for the stacks of table-wise tables.",
                f"table names={clash} with sharding='table' tables",
                "Rename those tables.",
            )
        )
    groups: dict[tuple[Any, ...], list[str]] = {}
    for name in names:
        groups.setdefault(stack_key(spec.tables[name]), []).append(name)
    out, loads = [], [[0, 0] for _ in range(num_shards)]
    for k, members in enumerate(groups.values()):
        sizes = {t: (spec.tables[t].vocabulary_size, expected_lookups(spec, t)) for t in members}
        placed = pack(sizes, num_shards, loads)
        for t, (device, _) in placed.items():
            loads[device][0] += sizes[t][0] * spec.tables[t].dimension
        rows = max(max(o + sizes[t][0] for t, (_, o) in placed.items()), 1)
        if num_shards * rows > MAX_ROWS:
            raise ValueError(
                message(
                    "The table-wise tables of one dimension need more rows on one device than int32 ids reach.",
                    f"tables={members}, {num_shards} x {rows} stacked rows",
                    "Use sharding='row' for the biggest of them.",
                )
            )
        first = spec.tables[members[0]]
        config = TableConfig(
            num_shards * rows, first.dimension, combiner=first.combiner, learning_rate=first.learning_rate,
            learning_rate_fn=first.learning_rate_fn, sharding="row",
        )
        layouts = tuple(
            (t, MemberLayout(spec.tables[t].vocabulary_size, num_shards, placed[t][0], placed[t][1], rows))
            for t in members
        )
        out.append(Stack(f"{PREFIX}{k}", layouts, config))
    return tuple(out)


def storage_spec(
    spec: EmbeddingConfigSpec, stacked: tuple[Stack, ...], plans: Mapping[str, str]
) -> EmbeddingConfigSpec:
    """`spec` with each stack as one row-sharded table in place of its tables (their features
    looking it up), each other table's plan pinned (`plans`: the planner's, on `spec`): what
    the lookups and updates run on. `spec` itself without stacks."""
    if not stacked:
        return spec
    where = {t: s.name for s in stacked for t, _ in s.members}
    tables = {t: dataclasses.replace(c, sharding=plans[t]) for t, c in spec.tables.items() if t not in where}
    tables.update({s.name: s.config for s in stacked})
    features = {
        f: dataclasses.replace(spec.features[f], table=where.get(t, t), table_id=None)
        for f, t in spec.feature_tables.items()
    }
    return dataclasses.replace(spec, feature_to_config_dict=features, table_to_config_dict=tables)


def storage_ids(spec: EmbeddingConfigSpec, stacked: tuple[Stack, ...], ids: Mapping[str, Any]) -> dict[str, Any]:
    """The ids of `storage_spec`'s features: a stacked table's id i becomes the stack's id
    that the partition strategy places at (device, offset + i) (-1 padding kept)."""
    if not stacked:
        return dict(ids)
    where = {t: layout for s in stacked for t, layout in s.members}
    out = {}
    for f, x in ids.items():
        layout = where.get(spec.feature_tables.get(f, ""))
        if layout is None:
            out[f] = x
            continue
        if spec.partition_strategy == "mod":  # row x lives on device x % N, local row x // N
            moved = (layout.offset + x) * layout.num_shards + layout.device
        else:
            moved = layout.start + x
        out[f] = jnp.where(x >= 0, moved, -1).astype(x.dtype)
    return out
