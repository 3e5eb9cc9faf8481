"""Initial tables drawn in place (embedding/initial.py): each device computes only its part.

The values are exactly the whole draw's (any mesh, strategy, plan and initializer); the
compiled init program holds, per device, its shards plus a few shard-sized temporaries
(`memory_analysis`, no all-gather), where the unconstrained program of tpu_estimator 0.2
held whole tables; and, in a subprocess, drawing a 24 MiB 'mod' table (with its Adagrad
slot) on 8 devices grows the peak host memory by the shards plus those temporaries, where
the unconstrained program grows it by several whole tables per device.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

from tpu_estimator.embedding import AdagradParameters, EmbeddingConfigSpec, FeatureConfig, TableConfig
from tpu_estimator.embedding.sharded import ShardedTables

WORKER = os.path.join(os.path.dirname(__file__), "init_memory_worker.py")
MIB = 1 << 20
# Per device, the init program's temporaries: threefry's counters (two uint32 arrays of the
# shard's size, and the loop's copy) and, for 'mod', the all-to-all's buffer.
TEMP_SHARDS = 4
INITIALIZERS = {
    "default": None,  # truncated normal, stddev 1/sqrt(dim)
    "glorot_uniform": jax.nn.initializers.glorot_uniform(),  # scaled by the whole shape's fans
    "normal": jax.nn.initializers.normal(0.3),
}


def make_tables(devices, strategy, sharding="row", initializer=None, rows=203, dim=8, shape=None, names=("data",),
                second=True):
    """Table "t" (`rows` x `dim`, by `sharding`) and, with `second`, a small row-sharded table "u"
    (drawn with the next key) on `devices` devices."""
    configs = {"t": TableConfig(rows, dim, sharding=sharding, initializer=initializer)}
    if second:
        configs["u"] = TableConfig(11, dim, sharding="row", initializer=initializer)
    spec = EmbeddingConfigSpec(
        feature_to_config_dict={f"f{t}": FeatureConfig(t) for t in configs},
        table_to_config_dict=configs,
        optimization_parameters=AdagradParameters(0.1, initial_accumulator=0.25),
        partition_strategy=strategy,
    )
    mesh = Mesh(np.array(jax.devices()[:devices]).reshape(shape or (devices,)), names)
    return ShardedTables(spec, mesh, batch_axis="data")


@pytest.mark.parametrize(
    "devices,shape,strategy,sharding,initializer",
    [(8, None, "div", "row", "default"), (8, None, "mod", "row", "glorot_uniform"),
     (8, (4, 2), "mod", "row", "normal"), (8, None, "div", "column", "glorot_uniform")],
)
def test_initial_tables_are_the_whole_draw(devices, shape, strategy, sharding, initializer):
    names = ("data", "model") if shape else ("data",)
    tables = make_tables(devices, strategy, sharding, INITIALIZERS[initializer], shape=shape, names=names)
    key = jax.random.PRNGKey(7)
    state = tables.init(key)
    logical = tables.logical(state)
    for i, (name, config) in enumerate(tables.spec.tables.items()):
        shape_ = (config.vocabulary_size, config.dimension)
        whole = jax.jit(lambda k: config.init_fn()(jax.random.fold_in(k, i), shape_, jnp.float32))(key)
        np.testing.assert_array_equal(logical[name], np.asarray(whole))  # exactly the one-device draw
        np.testing.assert_array_equal(logical[f"{name}/accumulator"], np.full(shape_, 0.25, np.float32))
        layout = tables.layouts[name]
        storage = np.asarray(state.tables[name])
        np.testing.assert_array_equal(storage, layout.to_storage(logical[name]))  # padding rows zero
        assert state.tables[name].sharding == tables.table_shardings()[name]
    if sharding == "column":
        assert {s.data.shape for s in state.tables["t"].addressable_shards} == {(203, 1)}


def _shard_bytes(tables, name="t"):
    config, layout = tables.spec.tables[name], tables.layouts[name]
    columns = config.dimension // tables.num_shards if tables.plans[name] == "column" else config.dimension
    return layout.rows_per_shard * columns * 4


def _unconstrained(tables):
    """The init program of tpu_estimator 0.2: the logical table drawn, then its storage order,
    with only the outputs' shardings given."""

    def build(key):
        config, layout = tables.spec.tables["t"], tables.layouts["t"]
        shape = (config.vocabulary_size, config.dimension)
        storage = layout.to_storage(config.init_fn()(jax.random.fold_in(key, 0), shape, jnp.float32))
        return storage, jnp.full(storage.shape, 0.1, jnp.float32)

    s = tables.table_shardings()["t"]
    return jax.jit(build, out_shardings=(s, s)).lower(jax.random.PRNGKey(0)).compile()


@pytest.mark.parametrize(
    "devices,strategy,sharding", [(8, "div", "row"), (8, "mod", "row"), (2, "mod", "row"), (8, "div", "column")]
)
def test_init_program_holds_its_shards_and_a_few_temporaries_per_device(devices, strategy, sharding):
    tables = make_tables(devices, strategy, sharding, rows=40_003, dim=32, second=False)
    program = jax.jit(tables.build, out_shardings=tables.state_shardings()).lower(jax.random.PRNGKey(0)).compile()
    analysis, shard = program.memory_analysis(), _shard_bytes(tables)
    assert analysis.output_size_in_bytes <= 2 * shard + 64  # table and slot shards (and the layout code)
    assert analysis.temp_size_in_bytes <= TEMP_SHARDS * shard + (64 << 10)
    assert "all-gather" not in program.as_text()


def test_unconstrained_init_program_holds_whole_tables_per_device():
    """The control: without embedding/initial.py's constraints, each device computes the whole
    'mod' table and its temporaries."""
    tables = make_tables(8, "mod", rows=40_003, dim=32, second=False)
    analysis = _unconstrained(tables).memory_analysis()
    assert analysis.temp_size_in_bytes > 2 * 40_003 * 32 * 4 > TEMP_SHARDS * _shard_bytes(tables)


@pytest.fixture(scope="module")
def measured():
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, WORKER, "200000", "32", "mod", "pinned", "whole"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return {r["how"]: r for r in map(json.loads, done.stdout.splitlines())}


def test_init_peak_memory_is_its_shards_and_bounded_temporaries(measured):
    pinned = measured["pinned"]
    # 8 devices in this process: its shards are the table and slot; the temporaries are each
    # device's (TEMP_SHARDS of its table shard), 32 MiB for the allocator and XLA's runtime.
    bound = pinned["own"] + TEMP_SHARDS * pinned["table"] + 32 * MIB
    assert pinned["peak_growth"] <= bound, (pinned, bound)
    assert pinned["devices"] * pinned["table"] > bound  # a whole table per device would not fit it
    assert measured["whole"]["peak_growth"] > bound, (measured["whole"], bound)  # the control breaks it
