"""Warm starting embedding tables reads each block of rows from the checkpoint, not whole tables.

A checkpoint of two tables saved 'mod' on 8 devices (with an Adagrad slot and a dense
layer) warm-starts tables on other device counts, strategies and plans
(`apply_warm_start` + `EmbeddingTables.warm_started`, as `Runtime._after_init` calls
them): every device holds the saved logical rows, each distinct block is read once through
the checkpoint's row reader (no other read of the tables), the slots and the tables not
chosen stay as they were, a rename reads the renamed table. Table-wise tables (stacked,
embedding/tablewise.py) warm-start by rows too, from a row-wise or a stacked checkpoint,
and a stacked checkpoint warm-starts row, column and replicated tables. The peak host memory of such
a warm start (a 64 MiB table) is measured in subprocesses by tests/embedding/test_restore.py's
worker.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from tpu_estimator.checkpoint.manager import Checkpointer
from tpu_estimator.checkpoint.row_reads import opener
from tpu_estimator.checkpoint.warm_start import WarmStartSettings, apply_warm_start
from tpu_estimator.embedding import AdagradParameters, EmbeddingConfigSpec, FeatureConfig, TableConfig
from tpu_estimator.embedding.component import EmbeddingTables, TableReader
from tpu_estimator.embedding.lookup import Collectives
from tpu_estimator.embedding.sharded import ShardedTables
from tpu_estimator.feeding.device import aligned_empty
from tpu_estimator.model.state import TrainState

DIM = 4
READERS = {"embedding": TableReader}


def make_spec(tables, strategy="div", sharding=None):
    return EmbeddingConfigSpec(
        feature_to_config_dict={f"f_{t}": FeatureConfig(t) for t in tables},
        table_to_config_dict={t: TableConfig(rows, DIM, sharding=sharding) for t, rows in tables.items()},
        optimization_parameters=AdagradParameters(0.1),
        partition_strategy=strategy,
    )


def component(spec, devices):
    mesh = Mesh(np.array(jax.devices()[:devices]), ("data",))
    return EmbeddingTables(spec, Collectives(), ShardedTables(spec, mesh))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Tables items [203, 4] and users [50, 4] saved 'mod' on 8 devices, chunks of 13 rows."""
    saver = component(make_spec({"items": 203, "users": 50}, "mod", "row"), 8)
    rng = np.random.RandomState(3)
    logical = {t: rng.randn(rows, DIM).astype(np.float32) for t, rows in (("items", 203), ("users", 50))}
    logical.update({f"{t}/accumulator": np.full((len(v), DIM), 0.7, np.float32) for t, v in list(logical.items())})
    extra = saver.tables.place(logical)
    state = {"params": {"Dense_0": {"kernel": np.ones((3, 1), np.float32)}}, "step": np.int32(5),
             "extras": {"embedding": extra}}
    checkpointer = Checkpointer(str(tmp_path_factory.mktemp("warm") / "model"), chunk_bytes=13 * DIM * 4)
    checkpointer.save(5, state)
    checkpointer.close()
    return checkpointer.path(5), logical


class Counting:
    """`open_rows` for warm start: the real checkpoint reader, each block's read recorded."""

    def __init__(self):
        self.reads = []

    def __call__(self, path):
        real = opener(path, empty=aligned_empty)
        return lambda leaf: _Counted(real(leaf), self.reads, leaf.name)


class _Counted:
    def __init__(self, reader, reads, name):
        self.reader, self.reads, self.name = reader, reads, name
        self.shape, self.dtype = reader.shape, reader.dtype

    def empty(self, rows, columns=()):
        return self.reader.empty(rows, columns)

    def read(self, rows, out, columns=()):
        self.reads.append((self.name, tuple(np.asarray(rows).tolist()), tuple((c.start, c.stop) for c in columns)))
        return self.reader.read(rows, out, columns)


def fresh_state(comp):
    """A fresh state (tables -1, Adagrad slots 0.1), placed without a compiled program."""
    values = {}
    for t, c in comp.spec.tables.items():
        values[t] = np.full((c.vocabulary_size, DIM), -1.0, np.float32)
        values[f"{t}/accumulator"] = np.full((c.vocabulary_size, DIM), 0.1, np.float32)
    return comp.tables.place(values)


def warm(path, comp, settings=None, **kwargs):
    fresh = fresh_state(comp)
    state = TrainState.create({"params": {"Dense_0": {"kernel": np.zeros((3, 1), np.float32)}}}, None, 0)
    state = state.replace(extras={"embedding": fresh})
    counting = Counting()
    settings = settings or WarmStartSettings(path, **kwargs)
    offered = {"embedding": comp.warm_start_variables(fresh)}
    sharding = NamedSharding(comp.tables.mesh, P())
    new, started = apply_warm_start(state, settings, sharding, offered, READERS, counting)
    return fresh, new, comp.warm_started(fresh, started["embedding"]), counting.reads


@pytest.mark.parametrize(
    "devices,strategy,plan,blocks",
    [(4, "div", "row", 4), (8, "mod", "row", 8), (2, "div", "column", 2), (8, "div", "replicated", 1)],
)
def test_warm_start_reads_each_block_of_the_saved_tables(saved, devices, strategy, plan, blocks):
    path, logical = saved
    comp = component(make_spec({"items": 203, "users": 50}, strategy, plan), devices)
    fresh, state, extra, reads = warm(path, comp)
    np.testing.assert_array_equal(state.params["Dense_0"]["kernel"], np.ones((3, 1)))  # a regex: params too
    got = comp.tables.logical(jax.device_get(extra))
    for t in ("items", "users"):
        np.testing.assert_array_equal(got[t], logical[t])  # the saved rows
        array = extra.tables[t]
        assert array.sharding == comp.tables.table_shardings()[t]
        np.testing.assert_array_equal(
            np.asarray(extra.slots[t]["accumulator"]), np.asarray(fresh.slots[t]["accumulator"])
        )  # slots start fresh
    tables = {name for name, _, _ in reads}
    assert tables == {"extras.embedding.tables.items", "extras.embedding.tables.users"}  # no slot read
    assert len(reads) == len(set(reads)) == 2 * blocks  # each distinct block of each table read once
    for name, vocabulary in (("items", 203), ("users", 50)):  # each saved row (columns) read once
        pairs = [(row, c) for n, r, c in reads if n.endswith(name) for row in r if row >= 0]
        assert len(pairs) == len(set(pairs)) == vocabulary * (blocks if plan == "column" else 1)


def test_warm_start_reads_only_the_chosen_table_and_its_renamed_source(saved):
    path, logical = saved
    comp = component(make_spec({"goods": 203, "users": 50}, "div", "row"), 4)
    settings = WarmStartSettings(path, ["embedding/goods"], {"embedding/goods": "embedding/items"})
    fresh, state, extra, reads = warm(path, comp, settings)
    np.testing.assert_array_equal(comp.tables.logical(jax.device_get(extra))["goods"], logical["items"])
    assert extra.tables["users"] is fresh.tables["users"]  # not chosen: kept, not read
    np.testing.assert_array_equal(state.params["Dense_0"]["kernel"], np.zeros((3, 1)))  # not chosen
    assert {name for name, _, _ in reads} == {"extras.embedding.tables.items"}
    assert len(reads) == 4


@pytest.mark.parametrize("devices,strategy,plan", [(8, "mod", "row"), (4, "div", "column"), (8, "div", "replicated")])
def test_warm_started_places_whole_arrays(saved, devices, strategy, plan):
    """A source holding a table whole (an export, a TF checkpoint, a dense variable renamed
    onto a table) is placed through the same blocks."""
    _, logical = saved
    comp = component(make_spec({"items": 203, "users": 50}, strategy, plan), devices)
    fresh = fresh_state(comp)
    extra = comp.warm_started(fresh, {"items": logical["items"].astype(np.float64)})
    assert extra.tables["items"].dtype == np.float32
    assert extra.tables["items"].sharding == comp.tables.table_shardings()["items"]
    got = comp.tables.logical(jax.device_get(extra))
    np.testing.assert_array_equal(got["items"], logical["items"])
    assert extra.tables["users"] is fresh.tables["users"]


@pytest.fixture(scope="module")
def saved_stacked(tmp_path_factory):
    """Tables items [203, 4] and users [50, 4] saved table-wise (one stack) on 4 devices."""
    saver = component(make_spec({"items": 203, "users": 50}, "div", "table"), 4)
    assert saver.tables.stacks  # stacked: the checkpoint holds `_tablewise_0`, not the tables
    rng = np.random.RandomState(5)
    logical = {t: rng.randn(rows, DIM).astype(np.float32) for t, rows in (("items", 203), ("users", 50))}
    logical.update({f"{t}/accumulator": np.full((len(v), DIM), 0.3, np.float32) for t, v in list(logical.items())})
    state = {"params": {"Dense_0": {"kernel": np.ones((3, 1), np.float32)}}, "step": np.int32(5),
             "extras": {"embedding": saver.tables.place(logical)}}
    checkpointer = Checkpointer(str(tmp_path_factory.mktemp("warm_stacked") / "model"), chunk_bytes=13 * DIM * 4)
    checkpointer.save(5, state)
    checkpointer.close()
    return checkpointer.path(5), logical


def _rows_read(reads):
    return sorted(row for _, rows, _ in reads for row in rows if row >= 0)


@pytest.mark.parametrize("source", ["row", "table"])
@pytest.mark.parametrize("devices", [2, 8])
def test_warm_start_into_stacks_reads_the_chosen_tables_rows(saved, saved_stacked, source, devices):
    """A table-wise target (tables stacked) warm-started from a row-wise or a stacked
    checkpoint: the chosen table's saved rows land in its place of the stack, each once;
    the other stacked table keeps its fresh values, the slots stay fresh."""
    path, logical = saved if source == "row" else saved_stacked
    comp = component(make_spec({"items": 203, "users": 50}, "div", "table"), devices)
    (stack,) = comp.tables.stacks
    fresh, state, extra, reads = warm(path, comp, WarmStartSettings(path, ["embedding/items"]))
    got = comp.tables.logical(jax.device_get(extra))
    np.testing.assert_array_equal(got["items"], logical["items"])
    np.testing.assert_array_equal(got["users"], np.full((50, DIM), -1.0, np.float32))  # not chosen: fresh
    assert extra.tables[stack.name].sharding == comp.tables.table_shardings()[stack.name]
    assert extra.slots[stack.name]["accumulator"] is fresh.slots[stack.name]["accumulator"]
    saved_name = "extras.embedding.tables." + ("items" if source == "row" else "_tablewise_0")
    assert {name for name, _, _ in reads} == {saved_name}  # the chosen table's array alone, no slot
    assert len(reads) == len(set(reads)) <= devices  # each distinct block at most once
    saved_rows = _rows_read(reads)
    assert len(saved_rows) == len(set(saved_rows)) == 203  # each of its saved rows once, no other


@pytest.mark.parametrize("devices,strategy,plan", [(4, "mod", "row"), (2, "div", "column"), (8, "div", "replicated")])
def test_warm_start_from_stacks_into_plain_tables(saved_stacked, devices, strategy, plan):
    """A stacked checkpoint's tables warm-start row, column and replicated tables by rows."""
    path, logical = saved_stacked
    comp = component(make_spec({"items": 203, "users": 50}, strategy, plan), devices)
    fresh, _, extra, reads = warm(path, comp)
    got = comp.tables.logical(jax.device_get(extra))
    for t in ("items", "users"):
        np.testing.assert_array_equal(got[t], logical[t])
        assert extra.tables[t].sharding == comp.tables.table_shardings()[t]
    assert {name for name, _, _ in reads} == {"extras.embedding.tables._tablewise_0"}


def test_warm_started_places_whole_arrays_into_stacks(saved):
    """A whole source (an export, a TF checkpoint) placed into a stack over its fresh values."""
    _, logical = saved
    comp = component(make_spec({"items": 203, "users": 50}, "div", "table"), 4)
    (stack,) = comp.tables.stacks
    fresh = fresh_state(comp)
    extra = comp.warm_started(fresh, {"users": logical["users"].astype(np.float64)})
    assert extra.tables[stack.name].dtype == np.float32
    got = comp.tables.logical(jax.device_get(extra))
    np.testing.assert_array_equal(got["users"], logical["users"])
    np.testing.assert_array_equal(got["items"], np.full((203, DIM), -1.0, np.float32))
