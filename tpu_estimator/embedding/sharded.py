"""The tables as global arrays sharded by rows over a mesh, and jit-able ops on them.

`EmbeddingState` holds every table and optimizer slot in storage order
(embedding/layout.py), each placed by its table's plan (embedding/plan.py):
`PartitionSpec(table_axes)` on rows ("row": a device holds 1/N of each), on columns
("column") or replicated; the "table" plan's tables stacked into row-sharded arrays
(embedding/tablewise.py). `lookup` and `apply_gradients` take global arrays
(ids split over `batch_axis`) and run the per-device maths of
embedding/lookup.py under `jax.shard_map` over the mesh; on a one-device mesh
they run it directly.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from tpu_estimator.api.checks import message
from tpu_estimator.embedding.config import EmbeddingConfigSpec
from tpu_estimator.embedding.initial import stack_in_place, storage_order
from tpu_estimator.embedding import tablewise
from tpu_estimator.embedding.layout import STRATEGIES, code_of, saved_layouts, storage_keys
from tpu_estimator.embedding.lookup import Collectives, apply_local, lookup_local, table_layouts
from tpu_estimator.embedding.plan import PLAN_CODES, Plan, check_plans, table_plans
from tpu_estimator.embedding.updates import slot_initial_values


@struct.dataclass
class EmbeddingState:
    """Tables and optimizer slots, each `[N * rows_per_shard, dim]` in storage order.

    Attributes:
      tables: table name (or stack name: table-wise tables, embedding/tablewise.py) ->
        storage array.
      slots: table (or stack) name -> {slot name -> storage array} (Adagrad: accumulator;
        Adam: m, v; FTRL: accumulator, linear; SGD: none).
      layout: table name -> int32 `[vocabulary_size, N, strategy, plan]` (strategy 0
        'div', 1 'mod'; plan: `plan.PLAN_CODES`, N = 1 for plans other than "row"), and
        stack name -> {table name -> `layout.code_of`} for the stacked tables:
        the storage order and plan, saved with the tables, so a checkpoint
        read without the model (`tpu_estimator.load_variable`) or restored onto
        another device count or strategy converts through the logical tables
        (`saved_layouts`); None in states built by hand.
    """

    tables: dict[str, Any]
    slots: dict[str, dict[str, Any]]
    layout: Any = None


@dataclasses.dataclass(frozen=True)
class ShardedTables:
    """An `EmbeddingConfigSpec` placed on `mesh`: rows over `table_axes`, the batch over `batch_axis`.

    Attributes:
      spec: the tables and features.
      mesh: the devices.
      batch_axis: the mesh axis (or axes, jointly) the global batch is split over (None:
        not split).
      table_axes: the mesh axes table rows are split over (default: all of them).
    """

    spec: EmbeddingConfigSpec
    mesh: Mesh
    batch_axis: str | tuple[str, ...] | None = "data"
    table_axes: tuple[str, ...] | None = None

    @property
    def axes(self) -> tuple[str, ...]:
        return tuple(self.mesh.axis_names) if self.table_axes is None else tuple(self.table_axes)

    @property
    def batch_axes(self) -> tuple[str, ...]:
        if self.batch_axis is None:
            return ()
        return (self.batch_axis,) if isinstance(self.batch_axis, str) else tuple(self.batch_axis)

    @property
    def num_shards(self) -> int:
        return int(np.prod([self.mesh.shape[a] for a in self.axes])) if self.axes else 1

    @property
    def plans(self) -> dict[str, Plan]:
        """table name -> its plan (embedding/plan.py) on this placement."""
        return check_plans(self.spec, self.num_shards, columns_ok=self.axes == self.batch_axes)

    @property
    def stacks(self) -> tuple[tablewise.Stack, ...]:
        """The arrays of the table-wise tables (embedding/tablewise.py)."""
        return tablewise.stacks(self.spec, self.plans, self.num_shards)

    @property
    def stored_spec(self) -> EmbeddingConfigSpec:
        """The spec the lookups and updates run on: each stack one row-sharded table."""
        plans = self.plans
        return tablewise.storage_spec(self.spec, tablewise.stacks(self.spec, plans, self.num_shards), plans)

    def stored_ids(self, ids: Mapping[str, Any]) -> dict[str, Any]:
        """`ids` as `stored_spec`'s: a stacked table's ids moved to its rows of the stack."""
        return tablewise.storage_ids(self.spec, self.stacks, ids)

    @property
    def layouts(self) -> dict[str, Any]:
        """State key (table or stack) -> its row placement."""
        return table_layouts(self.stored_spec, self.num_shards)

    @property
    def stored_plans(self) -> dict[str, Plan]:
        """State key (table or stack) -> its plan (a stack's: "row")."""
        return table_plans(self.stored_spec, self.num_shards)

    def table_specs(self) -> dict[str, P]:
        """state key -> the PartitionSpec of its table and slots: rows over the table axes
        ("row", and the stacks), columns ("column"), or none ("replicated")."""
        axes = self.axes or None
        return {
            t: {"row": P(axes), "column": P(None, axes), "replicated": P()}[plan]
            for t, plan in self.stored_plans.items()
        }

    def collectives(self) -> Collectives:
        if self.mesh.size == 1:
            return Collectives()
        replicas = int(np.prod([self.mesh.shape[a] for a in self.batch_axes]))
        return Collectives(self.batch_axis, self.axes, self.num_shards, replicas)

    def row_sharding(self) -> NamedSharding:
        return NamedSharding(self.mesh, P(self.axes or None))

    def table_shardings(self) -> dict[str, NamedSharding]:
        return {t: NamedSharding(self.mesh, spec) for t, spec in self.table_specs().items()}

    def state_shardings(self, with_slots: bool = True) -> EmbeddingState:
        s = self.table_shardings()
        names = slot_initial_values(self.spec.optimization_parameters) if with_slots else {}
        return EmbeddingState(
            tables=dict(s),
            slots={t: {k: s[t] for k in names} for t in s},
            layout=jax.tree.map(lambda _: NamedSharding(self.mesh, P()), self.layout_code()),
        )

    def build(self, key: jax.Array, dtype: Any = jnp.float32, *, with_slots: bool = True) -> EmbeddingState:
        """The initial state as `init` makes it, to call inside a jitted init whose
        out_shardings are `state_shardings(with_slots)`: each device computes only its shards."""
        layouts, shardings, stacks = self.layouts, self.table_shardings(), self.stacks
        stacked = {t for s in stacks for t, _ in s.members}
        names = slot_initial_values(self.spec.optimization_parameters) if with_slots else {}
        tables, index = {}, {t: i for i, t in enumerate(self.spec.tables)}

        def drawn(name: str, k: Any) -> Any:  # the table's whole initial value (its key: its index)
            config = self.spec.tables[name]
            shape = (config.vocabulary_size, config.dimension)
            return jnp.asarray(config.init_fn()(jax.random.fold_in(k, index[name]), shape, dtype), dtype)

        for name in self.spec.tables:
            if name in stacked:
                continue
            logical = drawn(name, key)
            # each device draws and orders only its part (embedding/initial.py)
            tables[name] = storage_order(logical, layouts[name], shardings[name])
        for stack in stacks:  # each device draws the tables packed onto it alone
            tables[stack.name] = stack_in_place(stack, drawn, key, self.mesh, self.axes, dtype)
        slots = {
            t: {k: jnp.full((layouts[t].storage_rows, self.stored_spec.tables[t].dimension), v, jnp.float32)
                for k, v in names.items()}
            for t in tables
        }
        return EmbeddingState(tables, slots, layout=jax.tree.map(jnp.asarray, self.layout_code()))

    def init(self, key: jax.Array, dtype: Any = jnp.float32, *, with_slots: bool = True) -> EmbeddingState:
        """Tables from their initializers (the same values on any device count), slots at
        their initial values; each created sharded (no device holds a whole table)."""
        build = lambda k: self.build(k, dtype, with_slots=with_slots)  # noqa: E731
        return jax.jit(build, out_shardings=self.state_shardings(with_slots))(key)

    def layout_code(self) -> dict[str, Any]:
        """This placement's `EmbeddingState.layout`."""
        code, layouts, plans = STRATEGIES.index(self.spec.partition_strategy), self.layouts, self.plans
        out: dict[str, Any] = {
            t: np.asarray([c.vocabulary_size, layouts[t].num_shards, code, PLAN_CODES.index(plans[t])], np.int32)
            for t, c in self.spec.tables.items() if t in layouts
        }
        out.update({s.name: {t: code_of(m, code) for t, m in s.members} for s in self.stacks})
        return out

    def logical(self, state: EmbeddingState) -> dict[str, np.ndarray]:
        """table name (and `name/slot`) -> whole logical table on the host.

        `state` may come from another device count or strategy (a checkpoint): its
        storage order is read from its `layout` (None: this placement's).
        """
        code = self.layout_code() if state.layout is None else state.layout
        layouts, keys = saved_layouts(code), storage_keys(code)
        out = {t: layouts[t].to_logical(state.tables[keys[t]]) for t in keys}
        for t in keys:
            slots = (state.slots or {}).get(keys[t]) or {}
            out.update({f"{t}/{k}": layouts[t].to_logical(v) for k, v in slots.items()})
        return out

    def place(self, logical: Mapping[str, Any], *, with_slots: bool = True) -> EmbeddingState:
        """The state from whole logical tables and slots (named as `logical()` names them):
        how a checkpoint or warm start written on any device count is put on this mesh.
        `with_slots=False`: the tables alone (evaluation and prediction)."""
        layouts, sharding = self.layouts, self.table_shardings()
        names = slot_initial_values(self.spec.optimization_parameters) if with_slots else {}
        missing = [
            k for t in self.spec.tables for k in (t, *(f"{t}/{n}" for n in names)) if k not in logical
        ]
        if missing:
            raise KeyError(
                message(
                    "The embedding tables and slots to place are incomplete.",
                    f"missing={missing}",
                    "Pass what ShardedTables.logical() returned (tables and optimizer slots).",
                )
            )
        put = lambda t, key: jax.device_put(layouts[t].to_storage(np.asarray(logical[key])), sharding[t])  # noqa: E731
        plain = [t for t in self.spec.tables if t in layouts]
        tables = {t: put(t, t) for t in plain}
        slots = {t: {n: put(t, f"{t}/{n}") for n in names} for t in plain}
        for s in self.stacks:
            stacked = lambda suffix: jax.device_put(  # noqa: E731
                s.to_storage({t: logical[t + suffix] for t, _ in s.members}), sharding[s.name])
            tables[s.name] = stacked("")
            slots[s.name] = {n: stacked(f"/{n}") for n in names}
        return EmbeddingState(
            tables=tables, slots=slots, layout=jax.device_put(self.layout_code(), NamedSharding(self.mesh, P())),
        )

    # --- ops on global arrays (call inside or outside jit) ---

    def _batch_spec(self) -> P:
        return P(self.batch_axis) if self.batch_axis else P()

    def lookup(self, tables: dict[str, Any], ids: dict[str, Any], weights: dict[str, Any] | None = None) -> dict[str, Any]:
        """Activations of every feature for the global batch: `[B, dim]` or `[B, L, dim]`."""
        weights, ids, spec = dict(weights or {}), self.stored_ids(ids), self.stored_spec
        coll = self.collectives()
        body = lambda t, i, w: lookup_local(spec, coll, t, i, w)  # noqa: E731
        if self.mesh.size == 1:
            return body(tables, ids, weights)
        specs, batch = self.table_specs(), self._batch_spec()
        return jax.shard_map(
            body,
            mesh=self.mesh,
            in_specs=({t: specs[t] for t in tables}, {f: batch for f in ids}, {f: batch for f in weights}),
            out_specs={f: batch for f in spec.feature_tables},
            check_vma=False,
        )(tables, ids, weights)

    def apply_gradients(
        self,
        state: EmbeddingState,
        ids: dict[str, Any],
        weights: dict[str, Any] | None,
        activation_grads: dict[str, Any],
        step: Any,
    ) -> EmbeddingState:
        """One lazy optimizer step from the gradients of the loss w.r.t. the global
        batch's activations (`activation_grads[f]` shaped like `lookup`'s output)."""
        weights, ids, spec = dict(weights or {}), self.stored_ids(ids), self.stored_spec
        coll = self.collectives()

        def body(tables: Any, slots: Any, i: Any, w: Any, g: Any, s: Any) -> Any:
            return apply_local(spec, coll, tables, slots, i, w, g, s)

        if self.mesh.size == 1:
            tables, slots = body(state.tables, state.slots, ids, weights, activation_grads, step)
            return state.replace(tables=tables, slots=slots)
        specs, batch = self.table_specs(), self._batch_spec()
        slot_specs = {t: {k: specs[t] for k in v} for t, v in state.slots.items()}
        table_specs = {t: specs[t] for t in state.tables}
        tables, slots = jax.shard_map(
            body,
            mesh=self.mesh,
            in_specs=(
                table_specs, slot_specs, {f: batch for f in ids}, {f: batch for f in weights},
                {f: batch for f in activation_grads}, P(),
            ),
            out_specs=(table_specs, slot_specs),
            check_vma=False,
        )(state.tables, state.slots, ids, weights, activation_grads, jnp.asarray(step))
        return state.replace(tables=tables, slots=slots)


def whole_tables(saved: Mapping[str, Any], names: Any = None) -> dict[str, np.ndarray]:
    """table name -> the whole logical table, from a checkpoint's raw embedding state (nested
    dicts of numpy arrays, from any device count or strategy: its `layout` says the storage
    order); `names`: only those tables."""
    layouts, keys = saved_layouts(saved["layout"]), storage_keys(saved["layout"])
    names = list(keys) if names is None else list(names)
    return {t: layouts[t].to_logical(saved["tables"][keys[t]]) for t in names}


def check_fits(spec: EmbeddingConfigSpec, layout: Mapping[str, Any], tables: Mapping[str, Any]) -> None:
    """Raises unless every table of `spec` is in a saved `layout` (its arrays) with its
    vocabulary_size, and in the saved `tables` (arrays or metadata with a shape) with its
    dimension."""
    vocabularies = {t: layout.vocabulary_size for t, layout in saved_layouts(layout).items()}
    keys = storage_keys(layout)
    for name, config in spec.tables.items():
        if vocabularies.get(name) != config.vocabulary_size:
            raise ValueError(
                message(
                    f"The checkpoint has no embedding table {name!r} of vocabulary_size "
                    f"{config.vocabulary_size}.",
                    f"saved tables (vocabulary sizes): {vocabularies}",
                    "Use the embedding_config_spec the checkpoint was trained with, or a new model_dir.",
                )
            )
        saved = tables.get(keys.get(name, name))
        if saved is not None and tuple(saved.shape)[-1] != config.dimension:
            raise ValueError(
                message(
                    f"The checkpoint's embedding table {name!r} has dimension {tuple(saved.shape)[-1]}, "
                    f"not {config.dimension}.",
                    f"TableConfig({config.vocabulary_size}, {config.dimension}) for a saved table of "
                    f"dimension {tuple(saved.shape)[-1]}",
                    "Use the embedding_config_spec the checkpoint was trained with, or a new model_dir.",
                )
            )


def one_device_state(tables: Mapping[str, Any]) -> EmbeddingState:
    """An EmbeddingState of whole logical tables, as a one-device lookup reads them (one shard:
    the storage order is the logical order); no optimizer slots."""
    return EmbeddingState(tables=dict(tables), slots={t: {} for t in tables}, layout=None)
