"""Restores that never hold a whole table: each device's rows read from the checkpoint.

`source_rows` maps every device's storage rows to the saved ones for any pair of
device counts and partition strategies; `SavedRows` reads chosen rows of an Orbax
checkpoint; `read_sharded` and `read_stacked` read each distinct block once per host;
and, in subprocesses (the device count is fixed per process), a 64 MiB table saved on 8
devices is restored onto 4 devices (with its optimizer slot) and onto 2 with the other
strategy, and warm-started onto 4 with the other strategy (row-wise, and table-wise into
a stack): the peak host memory grows by the shards restored plus a bounded buffer, where
reading the arrays whole (as tpu_estimator 0.2 did, and warm start before) grows by
several tables.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from tpu_estimator.checkpoint.manager import Checkpointer
from tpu_estimator.checkpoint.numpy_read import state_metadata
from tpu_estimator.checkpoint.row_reads import opener
from tpu_estimator.embedding.layout import MemberLayout, TableLayout
from tpu_estimator.embedding.restore import read_sharded, read_stacked, source_rows
from tpu_estimator.feeding.device import aligned_empty

WORKER = os.path.join(os.path.dirname(__file__), "restore_memory_worker.py")
ROWS, DIM = 262144, 64  # 64 MiB of float32
MIB = 1 << 20
# What a restore may hold beyond the shards it restores: decoded chunks (at most 2 MiB each:
# checkpoint/row_reads.py CHUNK_BYTES) in flight, and what the allocator keeps of freed ones
# (measured: 11-24 MiB over the shards at this size; benchmarks/RESULTS.md).
BUFFER = 40 * MIB


@pytest.mark.parametrize("saved_shards", [1, 3, 8])
@pytest.mark.parametrize("saved_strategy", ["div", "mod"])
@pytest.mark.parametrize("strategy", ["div", "mod"])
def test_each_devices_rows_are_the_saved_logical_rows(saved_shards, saved_strategy, strategy):
    saved = TableLayout(203, saved_shards, saved_strategy)
    logical = np.arange(203 * 2, dtype=np.float32).reshape(203, 2)
    storage = saved.to_storage(logical)
    for shards in (1, 2, 4, 8):
        target = TableLayout(203, shards, strategy)
        rows = source_rows(saved, target, 0, target.storage_rows)
        got = np.where((rows >= 0)[:, None], storage[np.maximum(rows, 0)], 0)
        np.testing.assert_array_equal(got, target.to_storage(logical))
        per_device = [source_rows(saved, target, d * target.rows_per_shard, (d + 1) * target.rows_per_shard)
                      for d in range(shards)]
        np.testing.assert_array_equal(np.concatenate(per_device), rows)


@pytest.fixture(scope="module")
def saved_table(tmp_path_factory):
    """A [203, 4] table saved 'mod' on 8 devices, in chunks of 13 rows (half a device's 26)."""
    mesh = Mesh(np.array(jax.devices()), ("data",))
    layout = TableLayout(203, 8, "mod")
    logical = np.random.RandomState(0).randn(203, 4).astype(np.float32)
    table = jax.device_put(layout.to_storage(logical), NamedSharding(mesh, P("data")))
    state = {"step": np.int32(1), "extras": {"embedding": {"tables": {"t": table}}}}
    checkpointer = Checkpointer(str(tmp_path_factory.mktemp("table")), chunk_bytes=13 * 4 * 4)
    checkpointer.save(1, state)
    checkpointer.close()
    leaf = state_metadata(checkpointer.path(1))["extras"]["embedding"]["tables"]["t"]
    return checkpointer.path(1), leaf, layout, logical


def test_saved_rows_reads_chosen_rows_a_chunk_at_a_time(saved_table):
    path, leaf, layout, logical = saved_table
    released = []
    reader = opener(path, release=lambda: released.append(1))(leaf)
    storage = layout.to_storage(logical)
    assert reader.shape == storage.shape and reader.dtype == np.float32 and reader.chunk_rows == 13
    rows = np.random.RandomState(1).permutation(storage.shape[0])[:77]
    rows[::5] = -1
    out = np.full((77, 4), 7.0, np.float32)
    reader.read(rows, out)
    np.testing.assert_array_equal(out[rows >= 0], storage[rows[rows >= 0]])
    assert (out[rows < 0] == 7.0).all()  # left as they were
    assert len(released) == len(np.unique(rows[rows >= 0] // 13))  # one read per chunk touched


@pytest.mark.parametrize("shards,strategy", [(8, "div"), (4, "mod"), (2, "div")])
def test_read_sharded_places_each_devices_rows(saved_table, shards, strategy):
    path, leaf, layout, logical = saved_table
    reader = opener(path, empty=aligned_empty)(leaf)
    mesh = Mesh(np.array(jax.devices()[:shards]), ("data",))
    target = TableLayout(203, shards, strategy)
    array = read_sharded(reader, layout, target, NamedSharding(mesh, P("data")))
    assert array.sharding == NamedSharding(mesh, P("data"))
    np.testing.assert_array_equal(np.asarray(array), target.to_storage(logical))
    assert {s.data.shape for s in array.addressable_shards} == {(target.rows_per_shard, 4)}


def test_saved_rows_reads_chosen_columns_of_chosen_rows(saved_table):
    path, leaf, layout, logical = saved_table
    reader = opener(path)(leaf)
    storage = layout.to_storage(logical)
    rows = np.array([5, 6, 7, 150, -1, 3, 201])  # a run, scattered rows, and a padding row
    out = reader.empty(rows.size, (slice(1, 3),))
    assert out.shape == (7, 2) and not out.any()
    reader.read(rows, out, (slice(1, 3),))
    np.testing.assert_array_equal(out[rows >= 0], storage[rows[rows >= 0], 1:3])
    assert not out[rows < 0].any()


@pytest.mark.parametrize("shards", [4, 2])
def test_read_sharded_reads_only_each_devices_columns(saved_table, shards):
    """A column-sharded table restored from a row-sharded checkpoint: each device's buffer
    (and read) is its columns of every row, not whole rows."""
    path, leaf, layout, logical = saved_table
    buffers = []

    def empty(shape, dtype):
        buffers.append(tuple(shape))
        return aligned_empty(shape, dtype)

    reader = opener(path, empty=empty)(leaf)
    mesh = Mesh(np.array(jax.devices()[:shards]), ("data",))
    target = TableLayout(203, 1, "div")  # "column" plans keep the logical order
    array = read_sharded(reader, layout, target, NamedSharding(mesh, P(None, "data")))
    np.testing.assert_array_equal(np.asarray(array), logical)
    assert buffers == [(203, 4 // shards)] * shards
    assert {s.data.shape for s in array.addressable_shards} == {(203, 4 // shards)}


def _worker(devices, *args):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, WORKER, *map(str, args)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def big_model(tmp_path_factory):
    """A model_dir whose checkpoint holds a 64 MiB table (and its Adagrad slot) saved 'div'
    on 8 devices."""
    model_dir = tmp_path_factory.mktemp("big") / "model"
    _worker(8, "save", model_dir, ROWS, DIM, "div")
    return model_dir


@pytest.fixture(scope="module")
def restored(big_model):
    """The 64 MiB table restored onto 4 devices with its Adagrad slot (training), and onto 2
    with 'mod' (evaluation), then read whole there (0.2's way).
    One measured restore per process but the last: memory a restore frees is partly
    reused by the next, which makes the whole read's growth smaller, never larger."""
    model_dir = big_model
    got = _worker(4, "restore", model_dir, ROWS, DIM, "div:1:rows")
    got += _worker(2, "restore", model_dir, ROWS, DIM, "mod:0:rows", "mod:0:whole")
    return {(r["devices"], r["strategy"], r["slots"], r["how"]): r for r in got}


@pytest.mark.parametrize("case", [(4, "div", 1), (2, "mod", 0)])
def test_restore_holds_its_shards_and_a_bounded_buffer(restored, case):
    """Onto another device count (and strategy): the peak grows by the restored shards
    (the table, and its slot in training) plus less than BUFFER."""
    got = restored[(*case, "rows")]
    assert got["own"] >= ROWS * DIM * 4 * (1 + case[2])
    assert got["own"] <= got["peak_growth"] <= got["own"] + BUFFER, got


def test_reading_whole_arrays_exceeds_that_bound(restored):
    """The bound above is one a restore through whole numpy tables breaks (what
    tpu_estimator 0.2 did for evaluation, another device count or strategy)."""
    got = restored[(2, "mod", 0, "whole")]
    assert got["peak_growth"] > got["own"] + BUFFER + 32 * MIB, got


class CountingRows:
    """The real reader underneath, each `read` (one block's rows) recorded."""

    def __init__(self, reader):
        self.reader, self.shape, self.dtype, self.reads = reader, reader.shape, reader.dtype, []

    def empty(self, rows, columns=()):
        return self.reader.empty(rows, columns)

    def read(self, rows, out, columns=()):
        self.reads.append((tuple(np.asarray(rows).tolist()), tuple((c.start, c.stop) for c in columns)))
        return self.reader.read(rows, out, columns)


@pytest.mark.parametrize(
    "mesh_shape,spec,blocks",
    [
        ((8,), P(), 1),  # replicated: one read for the 8 devices
        ((4, 2), P("data"), 4),  # rows over "data", replicated over "model": 4 blocks, 2 devices each
        ((2, 4), P(None, "model"), 4),  # columns over "model", replicated over "data"
    ],
)
def test_read_sharded_reads_each_distinct_block_once(saved_table, mesh_shape, spec, blocks):
    path, leaf, layout, logical = saved_table
    reader = CountingRows(opener(path, empty=aligned_empty)(leaf))
    mesh = Mesh(np.array(jax.devices()).reshape(mesh_shape), ("data", "model")[: len(mesh_shape)])
    shards = mesh.shape["data"] if spec == P("data") else 1
    target = TableLayout(203, shards, "div")
    array = read_sharded(reader, layout, target, NamedSharding(mesh, spec))
    assert len(reader.reads) == len(set(reader.reads)) == blocks  # each block read once
    assert len(array.addressable_shards) == 8
    for shard in array.addressable_shards:  # every device has its block's values
        np.testing.assert_array_equal(np.asarray(shard.data), target.to_storage(logical)[shard.index])
    np.testing.assert_array_equal(np.asarray(array), target.to_storage(logical))


@pytest.fixture(scope="module")
def warm_started(big_model):
    """The 64 MiB table warm-started onto 4 devices with 'mod' (fresh tables there first):
    by rows as the estimator does, then whole (its way before)."""
    got = _worker(4, "restore", big_model, ROWS, DIM, "mod:0:warm", "mod:0:warm:table", "mod:0:warmwhole")
    return {r["how"] + (":table" if r["plan"] == "table" else ""): r for r in got}


def test_warm_start_holds_its_shards_and_a_bounded_buffer(warm_started):
    """Warm starting a table from a checkpoint (another device count and strategy) grows the
    peak by the warm-started shards plus less than BUFFER, reading each row once."""
    got = warm_started["warm"]
    assert got["own"] == ROWS * DIM * 4 and got["read_bytes"] == ROWS * DIM * 4, got
    assert got["own"] <= got["peak_growth"] <= got["own"] + BUFFER, got


def test_warm_start_into_a_stack_holds_its_shards_and_a_bounded_buffer(warm_started):
    """The same table warm-started table-wise (`sharding="table"`: into a stack, over its
    fresh values, embedding/tablewise.py) grows the peak by the stack plus less than BUFFER."""
    got = warm_started["warm:table"]
    assert got["read_bytes"] == ROWS * DIM * 4, got
    assert got["own"] <= got["peak_growth"] <= got["own"] + BUFFER, got


def test_warm_starting_whole_tables_exceeds_that_bound(warm_started):
    """The bound above is one the whole-table warm start (before) breaks."""
    got = warm_started["warmwhole"]
    assert got["peak_growth"] > got["own"] + BUFFER + 32 * MIB, got


@pytest.mark.parametrize("fresh", [False, True])
def test_read_stacked_reads_each_distinct_block_once(saved_table, fresh):
    """A stack over "data" of a 4 x 2 mesh (rows replicated over "model", as with
    num_cores_per_replica=2): the saved table, stacked on device 1 of 4 at offset 3, is read
    once per distinct block holding its rows; with `fresh`, the stack's other rows keep it."""
    path, leaf, layout, logical = saved_table
    reader = CountingRows(opener(path, empty=aligned_empty)(leaf))
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    sharding = NamedSharding(mesh, P("data"))
    member = MemberLayout(203, 4, 1, 3, 210)  # rows 213..415 of a [840, 4] stack
    base = np.full((840, 4), -1.0, np.float32) if fresh else np.zeros((840, 4), np.float32)
    array = read_stacked([(reader, layout, member)], sharding, jax.device_put(base, sharding) if fresh else None)
    assert len(reader.reads) == len(set(reader.reads)) == 1  # one block holds the table: read once, not twice
    want = base.copy()
    want[213:416] = logical
    assert len(array.addressable_shards) == 8
    np.testing.assert_array_equal(np.asarray(array), want)
    for shard in array.addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), want[shard.index])
