"""Where each table lives: its sharding plan, chosen per table from its size and the device count.

- "row": rows over every device (`partition_strategy` 'div'/'mod'; each holds ~1/N), ids
  routed to the owners or the global batch all-gathered (embedding/lookup.py);
- "column": the dimension split over the devices (each holds `dimension / N` columns of
  every row; `dimension` must be a multiple of N): ids all-gathered, each device combines
  its columns for the global batch, one `all_to_all` gives each replica its rows;
- "replicated": the whole table (and slots) on every device: lookups are local `jnp.take`s
  (no collective); the backward all-reduces a dense [V, dim] gradient (and a count of the
  rows touched, for optimizers that move a row on a zero gradient) and every device
  applies the same update;
- "table": whole tables on one device each (embedding/tablewise.py): the tables of one
  dimension, combiner and learning rate stacked into one array `[N * R, dim]` sharded by
  rows, device d's R rows holding the whole tables packed onto it (greedy, biggest
  first onto the device with the fewest rows, ties by expected lookups); looked up and
  trained as one row-sharded table whose ids are moved to their table's rows, so every id
  is routed to the one device holding its table (one block per device instead of one per
  table: the owner gathers and updates a single block).

`TableConfig(sharding=...)` picks one; None (the default) lets `choose` decide: with more
than one device, a table of at most `REPLICATE_MAX_BYTES` (rows x dimension x 4 bytes:
1 MiB) is replicated, others are row-sharded. The bound is measured, not argued
(`benchmarks/embedding_plans.py`, one table's training step on 8 CPU devices, a global
batch of 1,024 with 4 ids per example, 7 rounds): replicated tables were faster up to
7,500 x 32 (938 KiB; row / replicated 1.17), even at 10,000 x 32 (1.25 MiB: 1.02),
row-sharded ones from 15,000 x 32 (1.9 MiB: 0.87) on: the row scheme's collectives cost
about the same whatever the table, the dense gradient's all-reduce and update grow with
it. The bound grows with the batch (the row scheme's exchange carries the ids, the dense
gradient the table): at a global batch of 4,096 replicating 20,000 x 32 (2.5 MiB) was
still 2x faster; the planner does not see the batch and keeps the bound of 1,024. Then, among the tables it would row-shard:

- column-wise, a table of `dimension >= COLUMN_MIN_DIMENSION` (256) that the device count
  divides: measured (one table, 8 devices) 0.76x row's step time at 20,000 x 256 and
  0.88x at 2,000 x 256, but 1.35x at 20,000 x 64. Its forward all-gathers the global
  batch's ids (4 bytes x N x ids per device: grows with N), where row-wise routing moves
  about 2 x capacity x (1 + dim) x 4 bytes per id (flat): at dimension 256 the all-gather
  stays the smaller up to N ~ 2,000 devices;
- table-wise, the tables of one stack key (dimension, combiner, learning rate) whose
  stack stores at most `TABLE_WISE_MAX_PADDING` (1.25) rows per table row, the biggest
  left out until they do (`tablewise.fitting`): each device then holds about the share
  of rows row-sharding gives it (many tables of similar size; a stack of fewer tables
  than devices stores several times their rows). Measured with 8 tables (one feature
  each, 8 devices): 0.38-0.55x row's step time at 5,000 x 32 and 20,000 x 32, 0.75x at
  100,000 x 32; with 2 tables of 20,000 x 32 (4x padding) 1.64x: not chosen.

With one device every plan is the same (the whole table there): all resolve to "row".
A checkpoint records each table's plan (`PLAN_CODES` in its saved layout) and restores
onto another plan or device count: each device's part read straight from the checkpoint
(embedding/restore.py; a column-sharded device reads its columns of every row, a
replicated one whole rows).
"""

from __future__ import annotations

import logging
from typing import Literal

from tpu_estimator.api.checks import message
from tpu_estimator.embedding import tablewise
from tpu_estimator.embedding.config import EmbeddingConfigSpec, TableConfig

Plan = Literal["row", "column", "replicated", "table"]
PLAN_CODES = ("row", "replicated", "column", "table")  # the plan codes of a saved layout (layout.TABLE_PLAN)
REPLICATE_MAX_BYTES = 1 << 20  # float32 table bytes replicated at most (benchmarks/embedding_plans.py)
TABLE_WISE_MAX_PADDING = 1.25  # stored rows / table rows of the planner's table-wise stacks (see above)
COLUMN_MIN_DIMENSION = 256  # the narrowest table the planner splits by columns (see above)

log = logging.getLogger("tpu_estimator.embedding")


def choose(config: TableConfig, num_shards: int) -> Plan:
    """The plan of one table over `num_shards` devices: its override, else the default rule."""
    if num_shards <= 1:
        return "row"
    if config.sharding is not None:
        return config.sharding  # type: ignore[return-value]
    if config.vocabulary_size * config.dimension * 4 <= REPLICATE_MAX_BYTES:
        return "replicated"
    if config.dimension >= COLUMN_MIN_DIMENSION and config.dimension % num_shards == 0:
        return "column"
    return "row"


def table_plans(spec: EmbeddingConfigSpec, num_shards: int) -> dict[str, Plan]:
    """table name -> its plan over `num_shards` devices (sorted by name, as `spec.tables`):
    `choose`'s, then the tables the planner would shard by rows that stack with at most
    `TABLE_WISE_MAX_PADDING` (embedding/tablewise.py `fitting`) are table-wise."""
    plans: dict[str, Plan] = {name: choose(config, num_shards) for name, config in spec.tables.items()}
    rows = [t for t, plan in plans.items() if plan == "row" and spec.tables[t].sharding is None]
    if num_shards > 1 and len(rows) > 1:
        plans.update({t: "table" for t in tablewise.fitting(spec, rows, num_shards, TABLE_WISE_MAX_PADDING)})
    return plans


def check_plans(spec: EmbeddingConfigSpec, num_shards: int, *, columns_ok: bool = True) -> dict[str, Plan]:
    """`table_plans`, raising where a plan cannot place its table: "column" needs a dimension
    that `num_shards` divides, and tables sharded over the batch axis (`columns_ok`)."""
    plans = table_plans(spec, num_shards)
    for name, plan in plans.items():
        if plan != "column":
            continue
        dim = spec.tables[name].dimension
        if not columns_ok:
            asked = "sharding='column'" if spec.tables[name].sharding else f"the planner's 'column' (dimension {dim})"
            raise ValueError(
                message(
                    f"Table {name!r}: `TableConfig(sharding='column')` needs the table sharded over "
                    "the batch axis only.",
                    f"{asked} with table axes other than the batch axis",
                    "Use sharding='row' or 'replicated' for this placement.",
                )
            )
        if dim % num_shards:
            raise ValueError(
                message(
                    f"Table {name!r}: `TableConfig(sharding='column')` splits the dimension over the "
                    f"{num_shards} devices, so it must be a multiple of {num_shards}.",
                    f"dimension={dim}, sharding='column'",
                    f"Use a dimension divisible by {num_shards}, or sharding='row' / None.",
                )
            )
    return plans


def describe(spec: EmbeddingConfigSpec, num_shards: int) -> list[str]:
    """One line per table: its name, shape, plan (a table-wise table's device) and whether it
    was chosen or asked for."""
    plans = table_plans(spec, num_shards)
    placed = {t: layout for s in tablewise.stacks(spec, plans, num_shards) for t, layout in s.members}
    lines = []
    for name, plan in plans.items():
        config = spec.tables[name]
        why = "TableConfig(sharding=...)" if config.sharding is not None else "planner"
        mib = config.vocabulary_size * config.dimension * 4 / 2**20
        where = f"on device {placed[name].device} of {num_shards}" if name in placed else f"over {num_shards} device(s)"
        lines.append(
            f"embedding table {name!r} ({config.vocabulary_size:,} x {config.dimension}, {mib:.2f} MiB): "
            f"{plan} {where} ({why})"
        )
    return lines


def log_plans(spec: EmbeddingConfigSpec, num_shards: int) -> None:
    """Logs `describe` at INFO, one line per table."""
    for line in describe(spec, num_shards):
        log.info(line)
