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

`TableConfig(sharding=...)` picks one; None (the default) lets the planner decide (`choices`),
with more than one device, from the table's bytes (rows x dimension x 4) and the rows a
training step looks up in it (`lookups_per_step`: the estimator's `train_batch_size` x
per feature `FeatureConfig.ids_per_example`: `max_sequence_length` for a sequence feature,
`max_ids_per_example` for a bag whose width was given, else one id):

- replicated when its bytes are at most `replicate_bound`: `REPLICATE_BASE_BYTES` (384 KiB)
  + `REPLICATE_PER_LOOKED_UP` (1.25) x the bytes of the rows a step looks up (lookups x
  dimension x 4); without a batch (`train_batch_size` None) `REPLICATE_MAX_BYTES` (1 MiB).
  A replicated table's step grows with the table (the dense gradient's all-reduce and the
  whole-table update), a routed one's with the lookups (ids and rows exchanged). Measured
  (`benchmarks/embedding_plans.py --batch B --width W`, one table, 8 CPU devices, 5
  interleaved rounds; benchmarks/RESULTS.md): replicated and routed steps cost the same at
  about 500 KiB (B 256, W 1), 470-650 KiB (1,024, 1), 1.3 MiB (1,024, 4), 3.2 MiB (4,096, 1,
  dimension 128), 5.3 MiB (4,096, 4) and 10.4 MiB (16,384, 4), dimension 32 unless said
  (30% of the W ids -1; the bound counts all W): the bound lies under each, at the last.
  The plan is made before any batch, so a bag feature's width is not read from one: it is
  `FeatureConfig(max_ids_per_example=W)` (wider batches are an error), else one id (a bag
  of 4 then plans with the bound of 1,024 x 1 id, not 4: replicated less often than would
  pay). Why not from the first batch: the tables (and the state's shapes and shardings)
  are built when the estimator builds its programs, once for train, evaluate, predict and
  export alike; an estimator that only evaluates or predicts (train_and_evaluate's
  evaluator) never sees a training batch, and the first batches of several hosts may
  differ in width, so plans made from them would differ between the estimator that
  trains, the one that evaluates, and the hosts. A plan that differs (another
  `max_ids_per_example`, `train_batch_size` or device count) still restores: the
  checkpoint records its plans and each device reads its part of the saved layout
  (embedding/restore.py), at the cost of that conversion at every restore;
- tables replicable one by one that stack table-wise (below) are stacked instead when
  together they hold more than 1.25 x the bytes of the rows a step looks up in them (one
  stack routes all their ids in one exchange, so the fixed part of routing is not paid
  per table; measured, 8 tables of one feature, global batch 1,024: 8 x 2,500 x 32
  replicated 0.84x row vs stacked 0.45x; 8 x 1,250 x 32: 0.54x vs 0.42x; 8 x 625 x 32:
  0.28x vs 0.52x; at 4,096, 8 x 2,500 x 32: 0.26x vs 0.51x);
- the planner's replicated tables and their optimizer slots stay within
  `EmbeddingConfigSpec(replicate_budget_bytes=...)` per device (default
  `REPLICATE_BUDGET_BYTES`, 256 MiB: 1/64 of a 16 GiB TPU v5e chip, the smallest in use,
  so the model keeps its memory; the device's memory is not read, so the plan is the same
  on every host; the tables asked to be replicated counted first): the
  tables looked up most per row (looked-up bytes per table byte) are kept first, ties by
  name; the others are sharded as below.

Then, among the tables it would row-shard:

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

import dataclasses
import logging
from typing import Literal

from tpu_estimator.api.checks import message
from tpu_estimator.embedding import tablewise
from tpu_estimator.embedding.config import REPLICATE_BUDGET_BYTES as REPLICATE_BUDGET_BYTES  # the default budget
from tpu_estimator.embedding.config import EmbeddingConfigSpec, TableConfig
from tpu_estimator.embedding.updates import slot_initial_values

Plan = Literal["row", "column", "replicated", "table"]
PLAN_CODES = ("row", "replicated", "column", "table")  # the plan codes of a saved layout (layout.TABLE_PLAN)
REPLICATE_MAX_BYTES = 1 << 20  # float32 table bytes replicated at most without a batch (see above)
REPLICATE_BASE_BYTES = 3 << 17  # with a batch: replicated at most this ...
REPLICATE_PER_LOOKED_UP = 1.25  # ... plus this many times the bytes of the rows a step looks up
TABLE_WISE_MAX_PADDING = 1.25  # stored rows / table rows of the planner's table-wise stacks (see above)
COLUMN_MIN_DIMENSION = 256  # the narrowest table the planner splits by columns (see above)

log = logging.getLogger("tpu_estimator.embedding")


@dataclasses.dataclass(frozen=True)
class Choice:
    """One table's plan and why it got it (the plan log line's reason)."""

    plan: Plan
    why: str


def replicate_bound(config: TableConfig, lookups_per_step: int | None) -> int:
    """The most bytes (`vocabulary_size x dimension x 4`) of a table the planner replicates:
    `REPLICATE_MAX_BYTES` when the lookups are not known, else `REPLICATE_BASE_BYTES` plus
    `REPLICATE_PER_LOOKED_UP` times the bytes of the rows one step looks up (global batch x
    ids per example x dimension x 4)."""
    if lookups_per_step is None:
        return REPLICATE_MAX_BYTES
    return REPLICATE_BASE_BYTES + int(REPLICATE_PER_LOOKED_UP * lookups_per_step * config.dimension * 4)


def choose(config: TableConfig, num_shards: int, *, lookups_per_step: int | None = None) -> Plan:
    """The plan of one table over `num_shards` devices: its override, else the default rule
    (`lookups_per_step`: rows a training step looks up in it, None: not known)."""
    if num_shards <= 1:
        return "row"
    if config.sharding is not None:
        return config.sharding  # type: ignore[return-value]
    if table_bytes(config) <= replicate_bound(config, lookups_per_step):
        return "replicated"
    return _sharded(config, num_shards)


def _sharded(config: TableConfig, num_shards: int) -> Plan:
    return "column" if config.dimension >= COLUMN_MIN_DIMENSION and config.dimension % num_shards == 0 else "row"


def table_bytes(config: TableConfig) -> int:
    return config.vocabulary_size * config.dimension * 4


def lookups_per_step(spec: EmbeddingConfigSpec, table: str, global_batch: int | None) -> int | None:
    """Rows a training step of `global_batch` examples looks up in `table` (per example and
    feature its `ids_per_example`: `tablewise.expected_lookups`); None without a batch."""
    return None if global_batch is None else global_batch * tablewise.expected_lookups(spec, table)


def choices(
    spec: EmbeddingConfigSpec,
    num_shards: int,
    *,
    global_batch: int | None = None,
) -> dict[str, Choice]:
    """table name -> its plan over `num_shards` devices and why (sorted by name, as
    `spec.tables`): `choose`'s with the lookups of a step of `global_batch` examples; of
    the tables it replicates, those that stack table-wise and hold more together than
    `replicate_bound` of their lookups together sharded (`_stacked_instead`); the
    replicated tables held within `spec.replicate_budget_bytes` per device (tables and
    optimizer slots, the asked-for ones counted first; then the planner's, most lookups per
    row first; the others sharded); then the tables the planner would shard by rows that stack with at most
    `TABLE_WISE_MAX_PADDING` (embedding/tablewise.py `fitting`) are table-wise."""
    tables = spec.tables
    if num_shards <= 1:
        return {t: Choice("row", "one device holds every table whole") for t in tables}
    lookups = {t: lookups_per_step(spec, t, global_batch) for t in tables}
    out = {t: Choice(choose(c, num_shards, lookups_per_step=lookups[t]), "TableConfig(sharding=...)")
           for t, c in tables.items()}
    planned = [t for t, c in tables.items() if c.sharding is None]
    for t in planned:
        out[t] = Choice(out[t].plan, _bound_reason(tables[t], lookups[t], global_batch))
    grouped: set[str] = set()  # replicable alone, but not together: stacked table-wise below
    if global_batch is not None:
        for t, why in _stacked_instead(spec, [t for t in planned if out[t].plan == "replicated"], num_shards,
                                       lookups).items():
            out[t], grouped = Choice("row", why), grouped | {t}
    copies, budget = 1 + len(slot_initial_values(spec.optimization_parameters)), spec.replicate_budget_bytes
    held = sum(table_bytes(c) * copies for t, c in tables.items() if c.sharding == "replicated")
    wanted = [t for t in planned if out[t].plan == "replicated"]
    for t in sorted(wanted, key=lambda t: (-tablewise.expected_lookups(spec, t) / tables[t].vocabulary_size, t)):
        if held + table_bytes(tables[t]) * copies <= budget:
            held += table_bytes(tables[t]) * copies
            continue
        out[t] = Choice(
            _sharded(tables[t], num_shards),
            f"{out[t].why}, but the replicated tables with their {copies - 1} optimizer slot(s) "
            f"would pass {_mib(budget)} per device (EmbeddingConfigSpec(replicate_budget_bytes=...); "
            f"{_mib(held)} held)",
        )
    rows = [t for t in planned if out[t].plan == "row"]
    fit = tablewise.fitting(spec, rows, num_shards, TABLE_WISE_MAX_PADDING) if len(rows) > 1 else []
    for t in fit:
        out[t] = Choice("table", out[t].why if t in grouped else
                        f"{out[t].why}; its stack holds <= {TABLE_WISE_MAX_PADDING} stored rows per row")
    for t in grouped.difference(fit):  # left out of the stack beside other tables: routed alone
        out[t] = Choice("row", f"{out[t].why} (left out of it beside the others: row-sharded)")
    return out


def _stacked_instead(
    spec: EmbeddingConfigSpec, wanted: list[str], num_shards: int, lookups: dict[str, int | None]
) -> dict[str, str]:
    """table -> why, of the tables `wanted` replicated that stack table-wise (`tablewise.fitting`)
    and together hold more than `REPLICATE_PER_LOOKED_UP` x the bytes of the rows a step
    looks up in them: one stack routes their ids in one exchange, so the routed step's fixed
    cost (`REPLICATE_BASE_BYTES` per table) is not paid per table (measured, 8 tables of one
    feature at a global batch of 1,024: replicated and stacked cost the same at ~1.0 MiB
    together for 1 MiB looked up)."""
    groups: dict[tuple, list[str]] = {}
    for t in tablewise.fitting(spec, wanted, num_shards, TABLE_WISE_MAX_PADDING):
        groups.setdefault(tablewise.stack_key(spec.tables[t]), []).append(t)
    out = {}
    for group in groups.values():
        size = sum(table_bytes(spec.tables[t]) for t in group)
        looked = sum(lookups[t] * spec.tables[t].dimension * 4 for t in group)  # type: ignore[operator]
        bound = int(REPLICATE_PER_LOOKED_UP * looked)
        if size > bound:
            why = (f"planner: the {len(group)} tables of its stack hold {_mib(size)} > {_mib(bound)}, replicated at "
                   f"most together: {REPLICATE_PER_LOOKED_UP:g} x the {_mib(looked)} of rows a step looks up in "
                   f"them; one stack routes them in one exchange")
            out.update({t: why for t in group})
    return out


def _bound_reason(config: TableConfig, lookups: int | None, global_batch: int | None) -> str:
    size, bound = table_bytes(config), replicate_bound(config, lookups)
    said = f"planner: {_mib(size)} {'<=' if size <= bound else '>'} {_mib(bound)}, replicated at most"
    if lookups is None:
        return f"{said} without a train_batch_size"
    looked = lookups * config.dimension * 4
    per_example = lookups // global_batch  # type: ignore[operator]
    return (f"{said} at global batch {global_batch:,}: {_mib(REPLICATE_BASE_BYTES)} + "
            f"{REPLICATE_PER_LOOKED_UP:g} x the {_mib(looked)} of rows a step looks up "
            f"({per_example} per example)")


def _mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB"


def table_plans(spec: EmbeddingConfigSpec, num_shards: int, *, global_batch: int | None = None) -> dict[str, Plan]:
    """table name -> its plan over `num_shards` devices (`choices`' plans)."""
    return {t: c.plan for t, c in choices(spec, num_shards, global_batch=global_batch).items()}


def pinned(spec: EmbeddingConfigSpec, num_shards: int, *, global_batch: int | None = None) -> EmbeddingConfigSpec:
    """`spec` with each table's plan over `num_shards` devices (for a step of `global_batch`
    examples) as its `TableConfig(sharding=...)`: the spec the tables are placed, looked up
    and trained by, whose plans no longer depend on the batch. `spec` itself on one device."""
    if num_shards <= 1:
        return spec
    plans = table_plans(spec, num_shards, global_batch=global_batch)
    tables = {t: dataclasses.replace(c, sharding=plans[t]) for t, c in spec.tables.items()}
    features = {
        f: dataclasses.replace(spec.features[f], table=t, table_id=None) for f, t in spec.feature_tables.items()
    }
    return dataclasses.replace(spec, feature_to_config_dict=features, table_to_config_dict=tables)


def check_plans(
    spec: EmbeddingConfigSpec, num_shards: int, *, columns_ok: bool = True, global_batch: int | None = None
) -> dict[str, Plan]:
    """`table_plans`, raising where a plan cannot place its table: "column" needs a dimension
    that `num_shards` divides, and tables sharded over the batch axis (`columns_ok`)."""
    plans = table_plans(spec, num_shards, global_batch=global_batch)
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


def describe(spec: EmbeddingConfigSpec, num_shards: int, *, global_batch: int | None = None) -> list[str]:
    """One line per table: its name, shape, plan (a table-wise table's device) and why."""
    chosen = choices(spec, num_shards, global_batch=global_batch)
    plans = {t: c.plan for t, c in chosen.items()}
    placed = {t: layout for s in tablewise.stacks(spec, plans, num_shards) for t, layout in s.members}
    lines = []
    for name, choice in chosen.items():
        config = spec.tables[name]
        where = f"on device {placed[name].device} of {num_shards}" if name in placed else f"over {num_shards} device(s)"
        lines.append(
            f"embedding table {name!r} ({config.vocabulary_size:,} x {config.dimension}, "
            f"{_mib(table_bytes(config))}): {choice.plan} {where} ({choice.why})"
        )
    return lines


def log_plans(spec: EmbeddingConfigSpec, num_shards: int, *, global_batch: int | None = None) -> None:
    """Logs `describe` at INFO, one line per table."""
    for line in describe(spec, num_shards, global_batch=global_batch):
        log.info(line)
