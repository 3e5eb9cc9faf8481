"""The tables as global arrays sharded by rows over a mesh, and jit-able ops on them.

`EmbeddingState` holds every table and optimizer slot in storage order
(embedding/layout.py), each placed by its table's plan (embedding/plan.py):
`PartitionSpec(table_axes)` on rows ("row": a device holds 1/N of each), on columns
("column") or replicated. `lookup` and `apply_gradients` take global arrays
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
from tpu_estimator.embedding.initial import storage_order
from tpu_estimator.embedding.layout import STRATEGIES, saved_layouts
from tpu_estimator.embedding.lookup import Collectives, apply_local, lookup_local, table_layouts
from tpu_estimator.embedding.plan import PLAN_CODES, Plan, check_plans
from tpu_estimator.embedding.updates import slot_initial_values


@struct.dataclass
class EmbeddingState:
    """Tables and optimizer slots, each `[N * rows_per_shard, dim]` in storage order.

    Attributes:
      tables: table name -> storage array.
      slots: table name -> {slot name -> storage array} (Adagrad: accumulator;
        Adam: m, v; FTRL: accumulator, linear; SGD: none).
      layout: table name -> int32 `[vocabulary_size, N, strategy, plan]` (strategy 0
        'div', 1 'mod'; plan: `plan.PLAN_CODES`, N = 1 for plans other than "row"):
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
      batch_axis: the mesh axis the global batch is split over (None: not split).
      table_axes: the mesh axes table rows are split over (default: all of them).
    """

    spec: EmbeddingConfigSpec
    mesh: Mesh
    batch_axis: str | None = "data"
    table_axes: tuple[str, ...] | None = None

    @property
    def axes(self) -> tuple[str, ...]:
        return tuple(self.mesh.axis_names) if self.table_axes is None else tuple(self.table_axes)

    @property
    def num_shards(self) -> int:
        return int(np.prod([self.mesh.shape[a] for a in self.axes])) if self.axes else 1

    @property
    def layouts(self) -> dict[str, Any]:
        return table_layouts(self.spec, self.num_shards)

    @property
    def plans(self) -> dict[str, Plan]:
        """table name -> its plan (embedding/plan.py) on this placement."""
        return check_plans(self.spec, self.num_shards, columns_ok=self.axes == (self.batch_axis,))

    def table_specs(self) -> dict[str, P]:
        """table name -> the PartitionSpec of its table and slots: rows over the table axes
        ("row"), columns ("column"), or none ("replicated")."""
        axes = self.axes or None
        return {
            t: {"row": P(axes), "column": P(None, axes), "replicated": P()}[plan] for t, plan in self.plans.items()
        }

    def collectives(self) -> Collectives:
        if self.mesh.size == 1:
            return Collectives()
        replicas = self.mesh.shape[self.batch_axis] if self.batch_axis else 1
        return Collectives(self.batch_axis, self.axes, self.num_shards, replicas)

    def row_sharding(self) -> NamedSharding:
        return NamedSharding(self.mesh, P(self.axes or None))

    def table_shardings(self) -> dict[str, NamedSharding]:
        return {t: NamedSharding(self.mesh, spec) for t, spec in self.table_specs().items()}

    def state_shardings(self, with_slots: bool = True) -> EmbeddingState:
        s = self.table_shardings()
        names = slot_initial_values(self.spec.optimization_parameters) if with_slots else {}
        return EmbeddingState(
            tables={t: s[t] for t in self.spec.tables},
            slots={t: {k: s[t] for k in names} for t in self.spec.tables},
            layout={t: NamedSharding(self.mesh, P()) for t in self.spec.tables},
        )

    def build(self, key: jax.Array, dtype: Any = jnp.float32, *, with_slots: bool = True) -> EmbeddingState:
        """The initial state as `init` makes it, to call inside a jitted init whose
        out_shardings are `state_shardings(with_slots)`: each device computes only its shards."""
        layouts, shardings = self.layouts, self.table_shardings()
        names = slot_initial_values(self.spec.optimization_parameters) if with_slots else {}
        tables, slots = {}, {}
        for i, (name, config) in enumerate(self.spec.tables.items()):
            shape = (config.vocabulary_size, config.dimension)
            logical = config.init_fn()(jax.random.fold_in(key, i), shape, dtype)
            # each device draws and orders only its part (embedding/initial.py)
            tables[name] = storage_order(jnp.asarray(logical, dtype), layouts[name], shardings[name])
            rows = (layouts[name].storage_rows, config.dimension)
            slots[name] = {k: jnp.full(rows, v, jnp.float32) for k, v in names.items()}
        return EmbeddingState(tables, slots, layout={t: jnp.asarray(c) for t, c in self.layout_code().items()})

    def init(self, key: jax.Array, dtype: Any = jnp.float32, *, with_slots: bool = True) -> EmbeddingState:
        """Tables from their initializers (the same values on any device count), slots at
        their initial values; each created sharded (no device holds a whole table)."""
        build = lambda k: self.build(k, dtype, with_slots=with_slots)  # noqa: E731
        return jax.jit(build, out_shardings=self.state_shardings(with_slots))(key)

    def layout_code(self) -> dict[str, np.ndarray]:
        """This placement's `EmbeddingState.layout`."""
        code, layouts, plans = STRATEGIES.index(self.spec.partition_strategy), self.layouts, self.plans
        return {
            t: np.asarray([c.vocabulary_size, layouts[t].num_shards, code, PLAN_CODES.index(plans[t])], np.int32)
            for t, c in self.spec.tables.items()
        }

    def logical(self, state: EmbeddingState) -> dict[str, np.ndarray]:
        """table name (and `name/slot`) -> whole logical table on the host.

        `state` may come from another device count or strategy (a checkpoint): its
        storage order is read from its `layout` (None: this placement's).
        """
        layouts = self.layouts if state.layout is None else saved_layouts(state.layout)
        out = {t: layouts[t].to_logical(v) for t, v in state.tables.items()}
        for t, slots in (state.slots or {}).items():
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
        return EmbeddingState(
            tables={t: put(t, t) for t in self.spec.tables},
            slots={t: {n: put(t, f"{t}/{n}") for n in names} for t in self.spec.tables},
            layout=jax.device_put(self.layout_code(), NamedSharding(self.mesh, P())),
        )

    # --- ops on global arrays (call inside or outside jit) ---

    def _batch_spec(self) -> P:
        return P(self.batch_axis) if self.batch_axis else P()

    def lookup(self, tables: dict[str, Any], ids: dict[str, Any], weights: dict[str, Any] | None = None) -> dict[str, Any]:
        """Activations of every feature for the global batch: `[B, dim]` or `[B, L, dim]`."""
        weights = dict(weights or {})
        coll = self.collectives()
        body = lambda t, i, w: lookup_local(self.spec, coll, t, i, w)  # noqa: E731
        if self.mesh.size == 1:
            return body(tables, ids, weights)
        specs, batch = self.table_specs(), self._batch_spec()
        return jax.shard_map(
            body,
            mesh=self.mesh,
            in_specs=({t: specs[t] for t in tables}, {f: batch for f in ids}, {f: batch for f in weights}),
            out_specs={f: batch for f in self.spec.feature_tables},
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
        weights = dict(weights or {})
        coll = self.collectives()

        def body(tables: Any, slots: Any, i: Any, w: Any, g: Any, s: Any) -> Any:
            return apply_local(self.spec, coll, tables, slots, i, w, g, s)

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
    layouts = saved_layouts(saved["layout"])
    names = list(saved["tables"]) if names is None else list(names)
    return {t: layouts[t].to_logical(saved["tables"][t]) for t in names}


def check_fits(spec: EmbeddingConfigSpec, layout: Mapping[str, Any], tables: Mapping[str, Any]) -> None:
    """Raises unless every table of `spec` is in a saved `layout` (its arrays) with its
    vocabulary_size, and in the saved `tables` (arrays or metadata with a shape) with its
    dimension."""
    vocabularies = {t: layout.vocabulary_size for t, layout in saved_layouts(layout).items()}
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
        saved = tables.get(name)
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
