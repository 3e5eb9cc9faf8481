"""The embedding tables as a `StateComponent` (model/components.py): `embedding_config_spec`.

With an `EmbeddingConfigSpec`, input_fn's features hold each embedding
feature's ids (embedding/inputs.py, checked on the feeder thread by
`host_features`); the programs replace them by the looked-up, combined
activations before model_fn sees the features, exactly where the original put
them (`features[name]`). Training differentiates the loss with respect to
those activations too and applies the embedding optimizer to the rows looked
up (`update`, embedding/replica.py); evaluation and prediction only look up.
Each program runs once per replica under `shard_map` manual over "data",
where the tables are the replica's block of rows (`replica_specs`), split over its
cores with `num_cores_per_replica > 1` (embedding/replica.py).

The state is an `EmbeddingState` in `TrainState.extras["embedding"]`
(tables, optimizer slots, the saved row `layout`). A checkpoint written on
another device count or partition strategy is restored through the logical
tables (`restore_plan`, `from_checkpoint`: each device's rows read from the
checkpoint for it alone, embedding/restore.py); warm start reads a checkpoint's tables
the same way (`warm_started`, `TableReader.rows`); exports and the variable reader see
whole logical tables named `embedding/<table>` and `embedding/<table>/<slot>`
(`variable_reader`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from tpu_estimator.api.checks import message
from tpu_estimator.embedding.config import EmbeddingConfigSpec
from tpu_estimator.embedding.inputs import prepare_features
from tpu_estimator.embedding.layout import flat_codes, saved_layouts, storage_keys
from tpu_estimator.embedding.lookup import Collectives
from tpu_estimator.embedding.plan import check_plans, log_plans, pinned
from tpu_estimator.embedding.restore import RowReader, read_sharded, read_stacked
from tpu_estimator.embedding.row_sources import SavedTable, place_rows, place_stack
from tpu_estimator.embedding.replica import (
    lookup_in_replica,
    placeholder_activations,
    replica_collectives,
    replica_tables,
    split_in_step,
    state_specs,
    update_in_replica,
)
from tpu_estimator.embedding.sharded import EmbeddingState, ShardedTables, check_fits, one_device_state, whole_tables
from tpu_estimator.embedding.updates import slot_initial_values
from tpu_estimator.parallel.mesh import Topology

NAME = "embedding"  # the key in TrainState.extras, and the prefix of the variable names


@dataclasses.dataclass(frozen=True)
class EmbeddingTables:
    """An `EmbeddingConfigSpec` on a topology: the per-replica collectives and the placement
    of the tables over every device ("data", and "model" with replicas of several cores), by
    each table's plan (embedding/plan.py: rows, each of N devices holding 1/N of the table;
    columns; or replicated)."""

    spec: EmbeddingConfigSpec
    collectives: Collectives
    tables: ShardedTables
    name: str = NAME
    setting: str = "TPUEstimator(embedding_config_spec=...)"

    @classmethod
    def create(
        cls, spec: EmbeddingConfigSpec, topology: Topology, *, global_batch: int | None = None, log: bool = True
    ) -> "EmbeddingTables":
        """The tables on `topology`, each placed by its plan for a training step of
        `global_batch` examples (None: not known; embedding/plan.py), fixed here: the tables
        run on the spec with every plan pinned (`plan.pinned`). The plans are checked and
        (`log`) logged, one INFO line per table with its reason."""
        num_shards = replica_tables(spec, topology).num_shards
        check_plans(spec, num_shards, global_batch=global_batch)  # raises where a plan cannot place its table
        if log and topology.num_devices > 1:
            log_plans(spec, num_shards, global_batch=global_batch)
        spec = pinned(spec, num_shards, global_batch=global_batch)
        return cls(spec, replica_collectives(topology), replica_tables(spec, topology))

    def on_one_device(self) -> "EmbeddingTables":
        """The tables as an export serves them: whole, looked up on one device."""
        return EmbeddingTables.create(self.spec, Topology.create(use_tpu=False), log=False)

    # --- state and shardings ---------------------------------------------------------

    def init(self, state: Any) -> EmbeddingState:
        """Fresh tables from their initializers (slots when training); tables the state holds
        already (restored, warm-started) are kept."""
        if state.extras is not None and self.name in state.extras:
            return state.extras[self.name]
        key = jax.random.fold_in(state.rng, 1 << 21)
        return self.tables.build(key, with_slots=state.opt_state is not None)

    def specs(self, extra: EmbeddingState, state_specs_: Any) -> EmbeddingState:
        return state_specs(extra, self.tables.stored_plans, self.tables.axes)  # over every device, by plan

    def replica_specs(self, extra: EmbeddingState) -> EmbeddingState:
        return state_specs(extra, self.tables.stored_plans)  # manual over "data" (split over "model" inside)

    def after_step(self, extra: EmbeddingState, state: Any) -> EmbeddingState:
        return extra  # updated in `update`

    def inference_variables(self, extra: EmbeddingState, variables: dict[str, Any]) -> dict[str, Any]:
        return variables  # the tables enter the programs through `activations`

    # --- the programs ------------------------------------------------------------------

    def host_features(self, features: Any) -> dict[str, Any]:
        """input_fn's features with the ids checked, int32 `[batch, width]` (feeder thread)."""
        return prepare_features(self.spec, features)

    def split(self, extra: Any, features: Any) -> tuple[dict[str, Any], tuple[dict[str, Any], dict[str, Any]]]:
        """(model_fn's other features, (ids, weights)) of one replica's features. Ids become
        int32 `[batch, width]` and weights float32 here too (a no-op for batches the host
        prepared; an export's receiver may give other dtypes or `[batch]` ids)."""
        rest, ids, weights = split_in_step(self.spec, features)
        ids = {f: _two_d(x).astype(jnp.int32) for f, x in ids.items()}
        weights = {f: _two_d(x).astype(jnp.float32) for f, x in weights.items()}
        return rest, (ids, weights)

    def activations(self, extra: Any, inputs: tuple[dict[str, Any], dict[str, Any]]) -> dict[str, Any]:
        """This replica's activations (`features[name]`); `extra` may be an export's whole
        tables (name -> array), looked up on one device."""
        ids, weights = inputs
        if not isinstance(extra, EmbeddingState):  # an export's whole tables
            return lookup_in_replica(self.spec, self.collectives, one_device_state(extra), ids, weights)
        return lookup_in_replica(self.tables.stored_spec, self.collectives, extra, self.tables.stored_ids(ids), weights)

    def placeholders(self, features: Any) -> dict[str, Any]:
        """The features with zeros in place of the activations (to initialise model_fn)."""
        rest, (ids, _) = self.split(None, features)
        return {**rest, **placeholder_activations(self.spec, ids)}

    def update(self, extra: EmbeddingState, inputs: Any, act_grads: dict[str, Any], step: Any) -> EmbeddingState:
        """The tables after the embedding optimizer's step on the rows looked up."""
        ids, weights = inputs
        return update_in_replica(
            self.tables.stored_spec, self.collectives, extra, self.tables.stored_ids(ids), weights, act_grads, step
        )

    # --- checkpoints, warm start, export -----------------------------------------------

    def restore_plan(self, saved: Any, read: Callable[[Any], Any]) -> bool:
        """Whether the saved tables (metadata `saved`; `read` reads a part of it) need a raw
        restore: they were sharded over another number of devices or another partition
        strategy (their storage order differs). Raises unless they fit the spec (names,
        vocabulary sizes, dimensions)."""
        layout = saved_layout(saved, read)
        check_fits(self.spec, layout, (saved or {}).get("tables") or {})
        mine, theirs = self.tables.layout_code(), flat_codes(layout)
        if storage_keys(mine) != storage_keys(layout):  # tables stacked otherwise
            return True
        return any(tuple(np.asarray(theirs[t]).tolist()) != tuple(c.tolist()) for t, c in flat_codes(mine).items())

    def from_checkpoint(
        self, saved: Any, read: Callable[[Any], Any], open_rows: Callable[[Any], RowReader], *, with_slots: bool
    ) -> EmbeddingState:
        """The saved tables (metadata `saved`; `read` reads a small part of it as numpy,
        `open_rows(leaf)` a saved array's rows) placed on this topology, from any device
        count or partition strategy: each device's rows are read for it alone
        (embedding/restore.py), no whole table on the host. `with_slots=False`: the
        tables alone (evaluation and prediction).

        Raises:
          ValueError: the saved tables do not fit the spec, or lack an optimizer slot.
        """
        saved = saved or {}
        layout = saved_layout(saved, read)
        check_fits(self.spec, layout, saved.get("tables") or {})
        layouts, keys, mine = saved_layouts(layout), storage_keys(layout), self.tables.layouts
        shardings = self.tables.table_shardings()
        names = slot_initial_values(self.spec.optimization_parameters) if with_slots else {}
        saved_slots = saved.get("slots") or {}
        missing = [
            f"{t}/{n}" for t in self.spec.tables for n in names if n not in (saved_slots.get(keys[t]) or {})
        ]
        if missing:
            raise ValueError(
                message(
                    "The checkpoint's embedding tables lack optimizer slots that this "
                    "embedding_config_spec's optimizer trains with.",
                    f"missing slots {missing} ({type(self.spec.optimization_parameters).__name__})",
                    "Train with the optimization_parameters the checkpoint was written with, or "
                    "start a new model_dir with warm_start_from=<this checkpoint> (slots start fresh).",
                )
            )

        def leaf(table: str, slot: str | None) -> Any:
            return saved["tables"][keys[table]] if slot is None else saved_slots[keys[table]][slot]

        def load(table: str, slot: str | None) -> Any:
            return read_sharded(open_rows(leaf(table, slot)), layouts[table], mine[table], shardings[table])

        def load_stack(stack: Any, slot: str | None) -> Any:  # its tables from wherever they were saved
            sources = [(open_rows(leaf(t, slot)), layouts[t], member) for t, member in stack.members]
            return read_stacked(sources, shardings[stack.name])

        plain, stacks = [t for t in self.spec.tables if t in mine], self.tables.stacks
        tables = {t: load(t, None) for t in plain}
        slots = {t: {n: load(t, n) for n in names} for t in plain}
        for s in stacks:
            tables[s.name] = load_stack(s, None)
            slots[s.name] = {n: load_stack(s, n) for n in names}
        return EmbeddingState(
            tables=tables, slots=slots,
            layout=jax.device_put(self.tables.layout_code(), NamedSharding(self.tables.mesh, P())),
        )

    def warm_start_variables(self, extra: EmbeddingState) -> dict[str, jax.ShapeDtypeStruct]:
        """The tables offered to warm start as `embedding/<table>` (trainable, as TF's were):
        their logical shapes and dtypes (a stacked table's: its stack's); no table is read."""
        keys = storage_keys(self.tables.layout_code())
        return {
            t: jax.ShapeDtypeStruct((c.vocabulary_size, c.dimension), extra.tables[keys[t]].dtype)
            for t, c in self.spec.tables.items()
        }

    def warm_started(self, extra: EmbeddingState, values: Mapping[str, Any]) -> EmbeddingState:
        """`extra` with the warm-started tables placed: a checkpoint's saved table
        (`row_sources.SavedTable`, from `TableReader.rows`, saved plain or stacked) read by
        each block of rows this host's devices hold, a whole array (an export's, a TF
        checkpoint's) through the same blocks. A stack (embedding/tablewise.py) is rebuilt
        block by block from its fresh values with its chosen tables' rows read over them.
        The other tables and the optimizer slots are kept (fresh: as TF's warm start left
        the slots)."""
        mine, shardings = self.tables.layouts, self.tables.table_shardings()
        placed = {}
        for t, value in values.items():
            if t in mine:  # a table of its own (row, column, replicated)
                array = place_rows(value, mine[t], shardings[t])
                placed[t] = array if array.dtype == extra.tables[t].dtype else array.astype(extra.tables[t].dtype)
        for s in self.tables.stacks:
            chosen = [(values[t], member) for t, member in s.members if t in values]
            if chosen:
                array = place_stack(chosen, extra.tables[s.name], shardings[s.name])
                placed[s.name] = array if array.dtype == extra.tables[s.name].dtype else array.astype(
                    extra.tables[s.name].dtype)
        return extra.replace(tables={**extra.tables, **placed})

    def export_state(self, raw: Any) -> dict[str, np.ndarray]:
        """What an export carries: the whole logical tables (an export looks up on one device)."""
        saved = raw or {}
        check_fits(self.spec, saved.get("layout") or {}, saved.get("tables") or {})
        return whole_tables(saved, self.spec.tables)


def saved_layout(saved: Any, read: Callable[[Any], Any]) -> dict[str, np.ndarray]:
    """The saved `EmbeddingState.layout` (table -> int32 `[vocabulary_size, shards, strategy]`)
    of tables whose saved metadata is `saved`, read by `read`; empty without one. Reads only
    these small arrays."""
    layout = (saved or {}).get("layout")
    if not layout:
        return {}
    return dict(read({"layout": layout})["layout"])


class TableReader:
    """The variables of saved tables without the model: `embedding/<table>` and
    `embedding/<table>/<slot>`, whole logical tables from any device count (a reader of
    checkpoint/variables.py; `saved` is the metadata of `extras/embedding`)."""

    def names(self, saved: Any) -> dict[str, tuple[Any, tuple[str, ...]]]:
        """name -> (saved metadata, path inside the state) of each table and slot (a stacked
        table's: its stack's array, embedding/tablewise.py)."""
        return {name: (leaf, path) for name, (leaf, path, _) in _variables(saved).items()}

    def shapes(self, saved: Any, read: Callable[[Any], Any]) -> dict[str, tuple[int, ...]]:
        """name -> logical shape (reads only the small layout arrays)."""
        layouts = saved_layouts(saved_layout(saved, read))
        return {
            name: (layouts[table].vocabulary_size, *tuple(leaf.shape)[1:])
            for name, (leaf, _, table) in _variables(saved).items()
        }

    def logical(self, saved: Any, read: Callable[[Any], Any], stored: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """`stored` (name -> the array as saved, in storage order) as whole logical tables."""
        layouts, tables = saved_layouts(saved_layout(saved, read)), _variables(saved)
        return {name: layouts[tables[name][2]].to_logical(value) for name, value in stored.items()}

    def rows(
        self, saved: Any, read: Callable[[Any], Any], open_rows: Callable[[Any], RowReader], names: Any
    ) -> dict[str, SavedTable]:
        """name -> the saved table (or slot) `names` to read by rows (warm start): the
        checkpoint's reader of the stored array (`open_rows(leaf)`: a stacked table's, its
        stack's) and the table's saved storage order in it (a `MemberLayout` for a stacked
        table; reads only the small layout arrays)."""
        layouts, tables = saved_layouts(saved_layout(saved, read)), _variables(saved)
        return {name: SavedTable(open_rows(tables[name][0]), layouts[tables[name][2]]) for name in names}


def _variables(saved: Any) -> dict[str, tuple[Any, tuple[str, ...], str]]:
    """name -> (saved metadata, path inside the state, table) of each table and slot; a
    stacked table's path is its stack's array (its layout's metadata names its tables)."""
    saved = saved or {}
    out: dict[str, tuple[Any, tuple[str, ...], str]] = {}
    layout = saved.get("layout") or {}
    for key, leaf in (saved.get("tables") or {}).items():
        stacked = layout.get(key)
        for table in stacked if isinstance(stacked, Mapping) else [key]:
            out[f"{NAME}/{table}"] = (leaf, ("tables", key), table)
            for slot, slot_leaf in ((saved.get("slots") or {}).get(key) or {}).items():
                out[f"{NAME}/{table}/{slot}"] = (slot_leaf, ("slots", key, slot), table)
    return out


def _two_d(x: Any) -> Any:
    x = jnp.asarray(x)
    return x[:, None] if x.ndim == 1 else x
