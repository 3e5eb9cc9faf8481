"""Sharding plans (embedding/plan.py): row-wise, column-wise and replicated tables.

The planner's rule and overrides, their checks and the one log line per table; each plan
on 8 devices gives 1 device's lookups and optimizer steps and holds what it says on each
device; through the estimator (the per-replica programs), mixed plans train as 1 device,
and a checkpoint records the plans and restores onto other plans and another device count.
"""

from __future__ import annotations

import logging

import jax
import numpy as np
import pytest

import tpu_estimator as te
from tpu_estimator.embedding import AdagradParameters, AdamParameters, EmbeddingConfigSpec, FeatureConfig, TableConfig
from tpu_estimator.embedding.component import EmbeddingTables
from tpu_estimator.embedding.plan import REPLICATE_MAX_BYTES, choose, describe
from tpu_estimator.embedding.sharded import ShardedTables
from tpu_estimator.parallel.mesh import Topology

B, V, DIM = 16, 37, 8
TOL = dict(rtol=2e-5, atol=2e-6)


def make_spec(big=None, small=None, optimizer=None):
    return EmbeddingConfigSpec(
        feature_to_config_dict={
            "bag": FeatureConfig("big", weight_key="bag_w"),
            "seq": FeatureConfig("big", max_sequence_length=3),
            "small": FeatureConfig("small"),
        },
        table_to_config_dict={
            "big": TableConfig(V, DIM, sharding=big),
            "small": TableConfig(5, DIM, combiner="sqrtn", sharding=small),
        },
        optimization_parameters=optimizer or AdagradParameters(0.5),
    )


def make_batch(seed):
    rng = np.random.RandomState(seed)
    bag = rng.randint(0, V, (B, 4))
    bag[rng.rand(B, 4) < 0.3] = -1
    bag[2] = [7, 7, 7, -1]
    ids = {"bag": bag, "seq": rng.randint(-1, V, (B, 3)), "small": rng.randint(0, 5, (B, 2))}
    weights = {"bag": rng.uniform(0.5, 2.0, (B, 4)).astype(np.float32)}
    grads = {"bag": rng.randn(B, DIM), "seq": rng.randn(B, 3, DIM), "small": rng.randn(B, DIM)}
    return {k: v.astype(np.int32) for k, v in ids.items()}, weights, {k: v.astype(np.float32) for k, v in grads.items()}


def mesh(n):
    return jax.sharding.Mesh(np.array(jax.devices()[:n]), ("data",))


def test_planner_replicates_small_tables_and_shards_the_others_by_rows():
    small = TableConfig(1_000, 16)  # 64 KB
    limit = TableConfig(REPLICATE_MAX_BYTES // (4 * 32), 32)
    big = TableConfig(limit.vocabulary_size + 1, 32)
    assert [choose(t, 8) for t in (small, limit, big)] == ["replicated", "replicated", "row"]
    assert choose(small, 1) == choose(big, 1) == "row"  # one device: every table whole there
    assert choose(TableConfig(1_000, 16, sharding="row"), 8) == "row"
    assert choose(TableConfig(10**7, 16, sharding="replicated"), 8) == "replicated"
    assert choose(TableConfig(10**7, 16, sharding="column"), 8) == "column"


def test_sharding_is_checked_with_the_argument_named():
    with pytest.raises(ValueError, match=r"TableConfig\(sharding=...\)` must be 'row', 'column'.*sharding='rows'"):
        TableConfig(10, 4, sharding="rows")
    spec = make_spec(big="column")
    with pytest.raises(ValueError, match=r"'big'.*multiple of 8.*dimension=12, sharding='column'"):
        ShardedTables(EmbeddingConfigSpec(
            feature_to_config_dict=spec.feature_to_config_dict,
            table_to_config_dict={"big": TableConfig(V, 12, sharding="column"), "small": TableConfig(5, DIM)},
            optimization_parameters=spec.optimization_parameters,
        ), mesh(8), table_axes=("data",)).plans
    two_axes = jax.sharding.Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    with pytest.raises(ValueError, match=r"'big'.*sharding='column'.*batch axis"):
        ShardedTables(spec, two_axes).plans


def test_plan_is_logged_once_one_line_per_table(caplog):
    spec = make_spec(big="column")
    with caplog.at_level(logging.INFO, logger="tpu_estimator.embedding"):
        EmbeddingTables.create(spec, Topology.create(use_tpu=True))
        EmbeddingTables.create(spec, Topology.create(use_tpu=True)).on_one_device()
    lines = [r.getMessage() for r in caplog.records if r.name == "tpu_estimator.embedding"]
    assert lines == describe(spec, 8) + describe(spec, 8), lines
    assert "'big' (37 x 8, 0.00 MiB): column over 8 device(s) (TableConfig(sharding=...))" in lines[0]
    assert ("'small' (5 x 8, 0.00 MiB): replicated over 8 device(s) (planner: 0.00 MiB <= 1.00 MiB, replicated "
            "at most without a train_batch_size)") in lines[1]


@pytest.mark.parametrize(
    "plan, optimizer",
    [("column", AdagradParameters(0.5)), ("replicated", AdamParameters(0.05, lazy_adam=False))],
    ids=["column-Adagrad", "replicated-Adam(non-lazy)"],
)
def test_each_plan_steps_like_1_device(plan, optimizer):
    """(Row-wise: tests/embedding/test_sharded.py.) The small table is replicated by the planner."""
    spec = make_spec(big=plan, small=None, optimizer=optimizer)
    results = {}
    for n in (1, 8):
        tables = ShardedTables(spec, mesh(n), table_axes=("data",))
        state = tables.init(jax.random.PRNGKey(3))
        lookup, apply = jax.jit(tables.lookup), jax.jit(tables.apply_gradients)
        acts = []
        for seed in (0, 1):
            ids, weights, grads = make_batch(seed)
            acts.append(jax.device_get(lookup(state.tables, ids, weights)))
            state = apply(state, ids, weights, grads, seed)
        results[n] = acts, tables.logical(jax.device_get(state)), state
    for got, want in zip(results[8][0], results[1][0]):
        for f in want:
            np.testing.assert_allclose(got[f], want[f], **TOL, err_msg=f)
    for name, want in results[1][1].items():
        np.testing.assert_allclose(results[8][1][name], want, **TOL, err_msg=name)
    state8 = results[8][2]
    held = {"row": (5, DIM), "column": (V, 1), "replicated": (V, DIM)}[plan]  # ceil(37/8) rows; 8/8 columns
    for array in (state8.tables["big"], *state8.slots["big"].values()):
        assert {s.data.shape for s in array.addressable_shards} == {held}
    assert {s.data.shape for s in state8.tables["small"].addressable_shards} == {(5, DIM)}  # the planner: replicated
    code = {"row": [V, 8, 0, 0], "replicated": [V, 1, 0, 1], "column": [V, 1, 0, 2]}[plan]
    assert np.asarray(state8.layout["big"]).tolist() == code


def test_checkpoint_records_the_plans_and_restores_onto_other_plans_and_device_counts(tmp_path):
    """8 devices (users replicated by the planner, items by columns) -> 4 replicas of 2 cores,
    every table by rows -> trains as 1 device all along; the saved layout names each plan."""
    from tests.embedding import test_estimator as e
    from tpu_estimator.checkpoint.manager import Checkpointer

    row = e.make_spec(sharding="row")
    mixed = EmbeddingConfigSpec(
        feature_to_config_dict=row.feature_to_config_dict,
        table_to_config_dict={"users": TableConfig(50, e.DIM, combiner="sum"),
                              "items": TableConfig(203, e.DIM, sharding="column")},
        optimization_parameters=row.optimization_parameters,
    )
    moved, probe = tmp_path / "moved", e.StateProbe()
    e.estimator(moved, True, mixed).train(e.train_input(e.BATCHES[:3]), max_steps=3, hooks=[probe])
    emb = probe.state.extras["embedding"]  # as the per-replica programs left it
    for name, held in (("users", (50, e.DIM)), ("items", (203, e.DIM // 8))):
        for array in (emb.tables[name], *emb.slots[name].values()):
            assert {s.data.shape for s in array.addressable_shards} == {held}, name
    saved = Checkpointer(str(moved), read_only=True)
    layout = saved.restore_raw(3)["extras"]["embedding"]["layout"]
    saved.close()
    assert {t: np.asarray(c).tolist() for t, c in layout.items()} == {"users": [50, 1, 0, 1], "items": [203, 1, 0, 2]}
    config = te.RunConfig(model_dir=str(moved), tpu_config=te.TPUConfig(iterations_per_loop=3, num_cores_per_replica=2))
    last = te.TPUEstimator(e.model_fn, config=config, use_tpu=True, train_batch_size=e.B, eval_batch_size=e.B,
                           embedding_config_spec=row)
    last.train(e.train_input(e.BATCHES[3:5]), max_steps=5)
    one = e.estimator(tmp_path / "one", False, row)
    for lo, hi in ((0, 3), (3, 5)):
        one.train(e.train_input(e.BATCHES[lo:hi]), max_steps=hi)
    names = ("embedding/users", "embedding/items", "embedding/items/accumulator", "Dense_0/kernel")
    for name in names:
        np.testing.assert_allclose(
            last.get_variable_value(name), one.get_variable_value(name), rtol=2e-5, atol=1e-6, err_msg=name
        )
    # and back: the row-wise checkpoint restored onto the replicated and column plans (each
    # device reads its own part of every table, embedding/restore.py)
    back = e.estimator(moved, True, mixed)
    back.train(e.train_input(e.BATCHES[5:6]), max_steps=6)
    one.train(e.train_input(e.BATCHES[5:6]), max_steps=6)
    for name in names:
        np.testing.assert_allclose(
            back.get_variable_value(name), one.get_variable_value(name), rtol=2e-5, atol=1e-6, err_msg=name
        )
