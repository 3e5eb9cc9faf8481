"""One process of the restore-memory test (and benchmarks/embedding_restore.py): the peak
host memory of restoring one large embedding table (Adagrad: a slot as large) from a
checkpoint, on the devices XLA_FLAGS gives this process.

    python restore_memory_worker.py save MODEL_DIR ROWS DIM STRATEGY
    python restore_memory_worker.py restore MODEL_DIR ROWS DIM STRATEGY:SLOTS:HOW[:PLAN] ...

`save` trains the model one step with the real estimator (checkpoints of the table sharded
over this process's devices with STRATEGY). `restore` measures each case in turn: it
reads the newest checkpoint's tables (and slots if SLOTS is 1) onto this process's
devices with STRATEGY as the estimator's restore does: HOW `rows`, each device's rows
read for it alone (the component's `from_checkpoint`); or `whole`, as tpu_estimator 0.2
did, the saved arrays read whole into numpy, then placed (`ShardedTables.place` of the
logical tables); or `perdevice`, each device's block read for it alone even where devices
hold the same block (the restore before blocks were read once per host). PLAN is the
table's `TableConfig(sharding=...)` on restore (default: the planner's). HOW `warm` and
`warmwhole` warm-start fresh tables from the checkpoint instead (`warm_start`). First a 64-row table is restored the same ways (imports and thread pools
paid); before each case freed memory is handed back (malloc_trim) and the peak resident
memory reset (/proc/self/clear_refs). It prints one JSON line per case: the peak's
growth during the restore (VmHWM), the resident growth after it (VmRSS), the bytes
this process's devices hold, the bytes read from the checkpoint and the restore's seconds.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import tempfile
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

import tpu_estimator as te
from tpu_estimator.checkpoint.numpy_read import restore_state_numpy, state_metadata
from tpu_estimator.checkpoint.reader import variable_source
from tpu_estimator.checkpoint.row_reads import opener
from tpu_estimator.checkpoint.variables import reader_at, saved_state
from tpu_estimator.checkpoint.warm_start import apply_warm_start, source_variables
from tpu_estimator.embedding import AdagradParameters, EmbeddingConfigSpec, FeatureConfig, TableConfig
from tpu_estimator.embedding.component import EmbeddingTables, TableReader, saved_layout
from tpu_estimator.embedding.layout import saved_layouts
from tpu_estimator.embedding.restore import source_rows
from tpu_estimator.embedding.sharded import EmbeddingState
from tpu_estimator.feeding.device import aligned_empty
from tpu_estimator.feeding.host_memory import trim
from tpu_estimator.model.state import TrainState
from tpu_estimator.parallel.mesh import Topology

BATCH = 16


def status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def make_spec(rows: int, dim: int, strategy: str, plan: str | None = None) -> EmbeddingConfigSpec:
    return EmbeddingConfigSpec(
        feature_to_config_dict={"ids": FeatureConfig("t")},
        table_to_config_dict={"t": TableConfig(rows, dim, sharding=plan)},
        optimization_parameters=AdagradParameters(0.1),
        partition_strategy=strategy,
    )


def model_fn(features, labels, mode, params):
    y = nn.Dense(1)(features["ids"])
    loss = jnp.mean((y - labels) ** 2)
    return te.TPUEstimatorSpec(mode, loss=loss, train_op=optax.sgd(0.1))


def save(model_dir: str, rows: int, dim: int, strategy: str) -> None:
    est = te.TPUEstimator(
        model_fn, model_dir=model_dir, use_tpu=True, train_batch_size=BATCH,
        embedding_config_spec=make_spec(rows, dim, strategy),
        config=te.RunConfig(tpu_config=te.TPUConfig(iterations_per_loop=1)),
    )
    rng = np.random.RandomState(0)
    batch = ({"ids": rng.randint(0, rows, (BATCH, 1))}, rng.randn(BATCH, 1).astype(np.float32))
    est.train(lambda params: iter([batch]), max_steps=1)


class Counted:
    """A checkpoint reader (checkpoint/row_reads.py SavedRows) counting the bytes it reads."""

    read_bytes = 0

    def __init__(self, reader):
        self.reader, self.shape, self.dtype = reader, reader.shape, reader.dtype

    def empty(self, rows, columns=()):
        return self.reader.empty(rows, columns)

    def read(self, rows, out, columns=()):
        Counted.read_bytes += int(np.count_nonzero(np.asarray(rows) >= 0)) * out[:1].nbytes
        return self.reader.read(rows, out, columns)


def per_device(reader, saved, target, sharding) -> jax.Array:
    """The restore's read before blocks were read once per host: each device's block read
    for it alone (a replicated table read once per device)."""
    shape = (target.storage_rows, *reader.shape[1:])
    shards = []
    for device, index in sharding.addressable_devices_indices_map(shape).items():
        start, stop, _ = index[0].indices(shape[0])
        block = reader.empty(stop - start, tuple(index[1:]))
        reader.read(source_rows(saved, target, start, stop), block, tuple(index[1:]))
        shards.append(jax.device_put(block, device).block_until_ready())
        del block
    return jax.make_array_from_single_device_arrays(shape, sharding, shards)


def restore(model_dir: str, rows: int, dim: int, strategy: str, slots: bool, how: str, plan=None) -> jax.Array:
    path = f"{model_dir}/{max(int(n) for n in os.listdir(model_dir) if n.isdigit())}"
    component = EmbeddingTables.create(make_spec(rows, dim, strategy, plan), Topology.create(use_tpu=True))
    meta, where = saved_state(state_metadata(path))
    saved, read = meta["extras"]["embedding"], reader_at(path, where["embedding"])
    if how in ("rows", "perdevice"):
        open_rows = opener(path, empty=aligned_empty, release=trim)  # as estimator/runtime.py opens it
        counted = lambda leaf: Counted(open_rows(leaf))  # noqa: E731
        if how == "rows":
            return component.from_checkpoint(saved, read, counted, with_slots=slots)
        if slots:
            raise SystemExit("perdevice restores the tables alone: SLOTS must be 0")
        layouts, tables = saved_layouts(saved_layout(saved, read)), component.tables
        return {
            t: per_device(counted(saved["tables"][t]), layouts[t], tables.layouts[t], tables.table_shardings()[t])
            for t in component.spec.tables
        }
    raw = restore_state_numpy(path, {"extras": {"embedding": saved}})["extras"]["embedding"]
    state = EmbeddingState(raw["tables"], raw["slots"] if slots else {}, raw["layout"])
    return component.tables.place(component.tables.logical(state), with_slots=slots)


def warm_start(model_dir: str, rows: int, dim: int, strategy: str, how: str, plan=None):
    """A function warm starting fresh tables (made first: not measured) from the newest
    checkpoint, returning the warm-started tables: HOW `warm`, as the estimator now does
    (`apply_warm_start` + `warm_started`: each block of rows read from the checkpoint);
    `warmwhole`, as it did before (the fresh tables and slots and the source's tables and
    slots whole on the host, then `ShardedTables.place`)."""
    path = f"{model_dir}/{max(int(n) for n in os.listdir(model_dir) if n.isdigit())}"
    component = EmbeddingTables.create(make_spec(rows, dim, strategy, plan), Topology.create(use_tpu=True))
    fresh = jax.block_until_ready(component.tables.init(jax.random.PRNGKey(0)))
    state = TrainState.create({"params": {}}, None, 0).replace(extras={"embedding": fresh})
    settings = te.WarmStartSettings(path, vars_to_warm_start=["embedding/.*"])
    readers = {"embedding": TableReader}
    # the source's files checked against their digests now (checkpoint/integrity.py, cached):
    # that check's buffers (8 threads x 8 MiB chunks at most) are not the warm start's reads
    variable_source(path, readers=readers)

    def run():
        if how == "warm":
            opened = functools.partial(opener, empty=aligned_empty, release=trim)  # as estimator/runtime.py
            open_rows = lambda at: (lambda leaf: Counted(opened(at)(leaf)))  # noqa: E731
            offered = {"embedding": component.warm_start_variables(fresh)}
            _, started = apply_warm_start(state, settings, None, offered, readers, open_rows)
            return component.warm_started(fresh, started["embedding"]).tables
        logical = component.tables.logical(jax.device_get(fresh))
        prev = source_variables(path, readers)
        return component.tables.place({**logical, "t": prev["embedding/t"]}).tables

    return run


def prepared(model_dir: str, rows: int, dim: int, strategy: str, slots: bool, how: str, plan=None):
    """The measured call of a case (what must exist before it, made now)."""
    if how.startswith("warm"):
        return warm_start(model_dir, rows, dim, strategy, how, plan)
    return lambda: restore(model_dir, rows, dim, strategy, slots, how, plan)


def main(argv: list[str]) -> None:
    what, model_dir, rows, dim = argv[:4]
    rows, dim = int(rows), int(dim)
    if what == "save":
        save(model_dir, rows, dim, argv[4])
        return
    cases = [(case.split(":") + [None])[:4] for case in argv[4:]]  # STRATEGY:SLOTS:HOW[:PLAN], in turn
    with tempfile.TemporaryDirectory() as small:
        save(small, 64, dim, cases[0][0])
        for strategy, slots, how, plan in cases:
            jax.block_until_ready(prepared(small, 64, dim, strategy, slots == "1", how, plan)())
    for strategy, slots, how, plan in cases:
        run = prepared(model_dir, rows, dim, strategy, slots == "1", how, plan)
        trim()
        Counted.read_bytes = 0
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM := VmRSS
        before, start = status_kib("VmRSS"), time.perf_counter()
        state = jax.block_until_ready(run())
        seconds = time.perf_counter() - start
        peak, after = status_kib("VmHWM"), status_kib("VmRSS")
        shards = [s.data for leaf in jax.tree.leaves(state) for s in leaf.addressable_shards]
        own = sum(x.nbytes for x in shards)
        # host memory the shards take (XLA:CPU devices may share one aligned host buffer)
        distinct = sum({x.unsafe_buffer_pointer(): x.nbytes for x in shards}.values())
        del shards, state, run
        print(json.dumps({
            "devices": jax.device_count(), "strategy": strategy, "slots": int(slots), "how": how,
            "plan": plan, "peak_growth": (peak - before) * 1024, "rss_growth": (after - before) * 1024,
            "own": own, "distinct": distinct, "table": rows * dim * 4, "read_bytes": Counted.read_bytes, "seconds": seconds,
        }), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
