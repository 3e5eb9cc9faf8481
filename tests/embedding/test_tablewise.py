"""Table-wise tables (embedding/tablewise.py): whole tables on one device each, stacked.

The packer balances rows and lookups; mixed with row-sharded and replicated tables,
table-wise ones look up and train as on 1 device (either partition strategy), each
device holding only its own tables; the compiled step's collective bytes per device
do not grow with the device count; through the estimator, 8 replicas train, evaluate
and predict as 1 device, `load_variable` reads each whole table by its name, and a
checkpoint moves from table-wise to row-wise on another device count and back.
"""

from __future__ import annotations

import logging

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, PartitionSpec as P

import tpu_estimator as te
from tests.embedding import test_estimator as e
from tests.embedding.test_collective_bytes import collective_bytes
from tpu_estimator.embedding import AdagradParameters, EmbeddingConfigSpec, FeatureConfig, TableConfig
from tpu_estimator.embedding.component import EmbeddingTables
from tpu_estimator.embedding.layout import MemberLayout, TableLayout
from tpu_estimator.embedding.lookup import Collectives
from tpu_estimator.embedding.plan import TABLE_WISE_MAX_PADDING, describe, table_plans
from tpu_estimator.embedding.restore import source_rows
from tpu_estimator.embedding.replica import lookup_in_replica, state_specs, update_in_replica
from tpu_estimator.embedding.sharded import ShardedTables
from tpu_estimator.embedding.tablewise import pack, stacks
from tpu_estimator.parallel.mesh import Topology

B, DIM = 16, 8
TOL = dict(rtol=2e-5, atol=2e-6)


def mesh(n):
    return Mesh(np.array(jax.devices()[:n]), ("data",))


def make_spec(strategy="div"):
    """Four table-wise tables (three stacks: tb has its own combiner, tc its own learning
    rate), one by rows and one replicated."""
    return EmbeddingConfigSpec(
        feature_to_config_dict={
            "a": FeatureConfig("ta"), "b": FeatureConfig("tb", max_sequence_length=3),
            "c": FeatureConfig("tc", weight_key="cw"), "a2": FeatureConfig("ta"), "d": FeatureConfig("td"),
            "r": FeatureConfig("row"), "s": FeatureConfig("rep"),
        },
        table_to_config_dict={
            "ta": TableConfig(30, DIM, sharding="table"),
            "tb": TableConfig(11, DIM, combiner="sum", sharding="table"),
            "tc": TableConfig(17, DIM, sharding="table", learning_rate=0.1),
            "td": TableConfig(13, DIM, sharding="table"),
            "row": TableConfig(40, DIM, sharding="row"),
            "rep": TableConfig(9, DIM, sharding="replicated"),
        },
        optimization_parameters=AdagradParameters(0.5),
        partition_strategy=strategy,
    )


def make_batch(seed):
    rng = np.random.RandomState(seed)
    ids = {
        "a": rng.randint(-1, 30, (B, 2)), "a2": rng.randint(0, 30, (B, 1)), "b": rng.randint(-1, 11, (B, 3)),
        "c": rng.randint(0, 17, (B, 4)), "d": rng.randint(-1, 13, (B, 2)), "r": rng.randint(0, 40, (B, 2)), "s": rng.randint(0, 9, (B, 1)),
    }
    ids["a"][3] = [29, 29]
    weights = {"c": rng.uniform(0.5, 2.0, (B, 4)).astype(np.float32)}
    grads = {f: rng.randn(B, 3, DIM) if f == "b" else rng.randn(B, DIM) for f in ids}
    return {k: v.astype(np.int32) for k, v in ids.items()}, weights, {k: v.astype(np.float32) for k, v in grads.items()}


def test_the_packer_balances_rows_then_lookups():
    sizes = {"t0": (100, 1), "t1": (60, 1), "t2": (50, 3), "t3": (40, 1), "t4": (10, 1), "t5": (10, 2)}
    placed = pack(sizes, 3)
    # biggest first, each where the fewest rows are; one after another on a device
    assert placed == {"t0": (0, 0), "t1": (1, 0), "t2": (2, 0), "t3": (2, 50), "t5": (1, 60), "t4": (1, 70)}
    rows = [sum(sizes[t][0] for t, (d, _) in placed.items() if d == device) for device in range(3)]
    assert max(rows) == 100 and min(rows) == 80  # R = the biggest table's rows: no packing does better
    # equal rows: the fewer lookups win the tie (y joins w, not x with its 3 lookups)
    equal = pack({"x": (10, 3), "y": (10, 1), "z": (10, 1), "w": (10, 1)}, 2)
    assert equal == {"x": (0, 0), "w": (1, 0), "y": (1, 10), "z": (0, 10)}
    # across stacks: what the devices hold of the others (values, then lookups) breaks ties
    assert pack({"v": (10, 1)}, 2, [[80, 0], [0, 5]]) == {"v": (1, 0)}
    assert pack({"v": (10, 1)}, 2, [[0, 5], [0, 0]]) == {"v": (1, 0)}


def test_stacks_group_tables_a_row_table_could_share_and_are_logged_with_their_device(caplog):
    spec = make_spec()
    plans = ShardedTables(spec, mesh(8), table_axes=("data",)).plans
    assert plans == {"rep": "replicated", "row": "row", "ta": "table", "tb": "table", "tc": "table", "td": "table"}
    found = stacks(spec, plans, 8)
    # what a row table's lookup and update read of its TableConfig: dimension, combiner, learning rate
    assert [[t for t, _ in s.members] for s in found] == [["ta", "td"], ["tb"], ["tc"]]
    devices = {t: m.device for s in found for t, m in s.members}
    assert len(set(devices.values())) == 4  # each on a device of its own (rows, then what the others hold)
    with caplog.at_level(logging.INFO, logger="tpu_estimator.embedding"):
        EmbeddingTables.create(spec, Topology.create(use_tpu=True))
    lines = [r.getMessage() for r in caplog.records if r.name == "tpu_estimator.embedding"]
    assert lines == describe(spec, 8)
    assert f"'ta' (30 x 8, 0.00 MiB): table on device {devices['ta']} of 8 (TableConfig(sharding=...))" in lines[2]
    assert stacks(spec, ShardedTables(spec, mesh(1)).plans, 1) == ()  # one device: every table whole there


def test_the_planner_stacks_tables_that_fill_the_devices_evenly():
    """Tables too big to replicate, of one dimension, that pack with at most
    TABLE_WISE_MAX_PADDING stored rows per row: table-wise; the biggest left out by rows;
    overrides and other dimensions keep their plans."""
    sizes = {f"m{i}": (20_000, 32) for i in range(8)} | {"wide": (30_000, 32), "huge": (3_000_000, 32),
                                                          "tiny": (100, 32), "asked": (20_000, 32)}
    sizes |= {f"d{i}": (20_000, 16) for i in range(3)}  # 3 tables over 8 devices: 2.7x padding
    configs = {t: TableConfig(v, d, sharding="row" if t == "asked" else None) for t, (v, d) in sizes.items()}
    spec = EmbeddingConfigSpec(
        feature_to_config_dict={f"f_{t}": FeatureConfig(t) for t in configs}, table_to_config_dict=configs,
        optimization_parameters=AdagradParameters(0.1),
    )
    plans = table_plans(spec, 8)
    assert {t for t, p in plans.items() if p == "table"} == {f"m{i}" for i in range(8)}
    assert plans["wide"] == plans["huge"] == plans["asked"] == plans["d0"] == "row" and plans["tiny"] == "replicated"
    assert table_plans(spec, 4)["wide"] == "row"  # on 4 devices too: with it, 1.26 stored rows per row
    assert {p for p in table_plans(spec, 1).values()} == {"row"}
    assert TABLE_WISE_MAX_PADDING == 1.25


def test_what_cannot_be_stacked_or_split_is_an_error_naming_the_tables():
    def spec_of(tables):
        return EmbeddingConfigSpec(
            feature_to_config_dict={f"f{t}": FeatureConfig(t) for t in tables}, table_to_config_dict=tables,
            optimization_parameters=AdagradParameters(0.1),
        )

    clash = spec_of({"_tablewise_0": TableConfig(10, 4), "t": TableConfig(10, 4, sharding="table")})
    with pytest.raises(ValueError, match=r"'_tablewise_'.*table names=\['_tablewise_0'\].*Rename"):
        stacks(clash, table_plans(clash, 8), 8)
    huge = spec_of({f"t{i}": TableConfig(2**30, 4, sharding="table") for i in range(3)})
    with pytest.raises(ValueError, match=r"int32.*tables=\['t0', 't1', 't2'\], 2 x 2147483648.*sharding='row'"):
        stacks(huge, table_plans(huge, 2), 2)
    wide = spec_of({"w": TableConfig(2_000, 256)})  # 2 MB (over the 1 MiB replicated), dimension 256: split by columns
    assert table_plans(wide, 8) == {"w": "column"}
    two_axes = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    with pytest.raises(ValueError, match=r"'w'.*the planner's 'column' \(dimension 256\).*sharding='row'"):
        ShardedTables(wide, two_axes).plans


def test_table_wise_tables_step_like_1_device_each_on_its_device():
    """'mod' (the estimator tests below: 'div'): a stacked id i of a table at (device d,
    offset o) is the stack's id (o + i) x N + d."""
    strategy = "mod"
    spec = make_spec(strategy)
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
        results[n] = acts, tables.logical(jax.device_get(state)), state, tables
    for got, want in zip(results[8][0], results[1][0]):
        for f in want:
            np.testing.assert_allclose(got[f], want[f], **TOL, err_msg=f)
    assert set(results[8][1]) == set(results[1][1])
    for name, want in results[1][1].items():
        np.testing.assert_allclose(results[8][1][name], want, **TOL, err_msg=name)
    _, logical, state8, tables8 = results[8]
    for stack in tables8.stacks:
        array = state8.tables[stack.name]
        assert {s.data.shape for s in array.addressable_shards} == {(stack.rows_per_shard, DIM)}
        for t, member in stack.members:  # the whole table on its device, nowhere else
            shard = next(s for s in array.addressable_shards if s.index[0].start == member.device * stack.rows_per_shard)
            held = np.asarray(shard.data)[member.offset : member.offset + member.vocabulary_size]
            np.testing.assert_array_equal(held, logical[t])
    assert np.asarray(state8.layout[tables8.stacks[2].name]["tc"]).tolist()[:4] == [17, 8, ["div", "mod"].index(strategy), 3]
    placed = tables8.place(logical)  # whole tables back into their stacks (warm start now reads by rows)
    for name, array in placed.tables.items():
        np.testing.assert_array_equal(np.asarray(array), np.asarray(state8.tables[name]), err_msg=name)
        assert array.sharding == state8.tables[name].sharding


def _step_hlo(spec, n):
    """The per-replica train step (lookup, gradients, Adagrad) of `spec` compiled on n devices."""
    tables = ShardedTables(spec, mesh(n), batch_axis="data", table_axes=("data",))
    coll = Collectives("data", ("data",), n, n, routing="owners")
    state = jax.eval_shape(lambda: tables.build(jax.random.PRNGKey(0)))
    stored = tables.stored_spec

    def step(state, ids, step):
        ids = tables.stored_ids(ids)
        acts = lookup_in_replica(stored, coll, state, ids, {})
        loss = lambda acts: sum(jnp.sum(jnp.tanh(a)) for a in acts.values())  # noqa: E731
        return update_in_replica(stored, coll, state, ids, {}, jax.grad(loss)(acts), step)

    specs = state_specs(state, tables.stored_plans)
    program = jax.jit(jax.shard_map(step, mesh=tables.mesh, in_specs=(specs, P("data"), P()), out_specs=specs,
                                    check_vma=False))
    ids = {f: jax.ShapeDtypeStruct((n * 32, 4), jnp.int32) for f in spec.features}
    return program.lower(state, ids, jax.ShapeDtypeStruct((), jnp.int32)).compile().as_text()


def test_table_wise_collective_bytes_per_device_are_flat_in_the_device_count():
    """8 table-wise tables (one stack), 32 examples x 4 ids per device and feature: on 2, 4
    and 8 devices each device holds 4, 2, 1 whole tables and exchanges the same bytes (ids
    routed to the one device holding their table: `[N, C]` buffers, C ~ 2 M / N; the
    all-gathered scheme's grow with N: tests/embedding/test_collective_bytes.py)."""
    spec = EmbeddingConfigSpec(
        feature_to_config_dict={f"f{i}": FeatureConfig(f"t{i}") for i in range(8)},
        table_to_config_dict={f"t{i}": TableConfig(500, 16, sharding="table") for i in range(8)},
        optimization_parameters=AdagradParameters(0.1),
    )
    totals = {}
    for n in (2, 4, 8):
        found = collective_bytes(_step_hlo(spec, n))
        assert set(found) == {"all-to-all", "all-reduce"}, found
        totals[n] = sum(found.values())
    assert len(set(totals.values())) == 1, totals  # the same static buffers: 417,792 bytes at each N


def test_storage_rows_map_between_a_stack_and_the_other_layouts():
    """embedding/restore.py's `source_rows` with a stacked table (`MemberLayout`) on either
    side: every device's storage rows are the saved logical rows, other tables' rows -1."""
    logical = np.arange(23 * 2, dtype=np.float32).reshape(23, 2)
    stacked = MemberLayout(23, 4, device=2, offset=5, rows_per_shard=30)  # rows 65..87 of 120
    stack = np.zeros((120, 2), np.float32)
    stack[65:88] = logical
    np.testing.assert_array_equal(stacked.to_logical(stack), logical)
    for other in (TableLayout(23, 3, "mod"), TableLayout(23, 1), MemberLayout(23, 8, 7, 0, 23)):
        storage = other.to_storage(logical) if isinstance(other, TableLayout) else np.pad(logical, ((161, 0), (0, 0)))
        rows = source_rows(other, stacked, 0, 120)  # onto the stack
        got = np.where((rows >= 0)[:, None], storage[np.maximum(rows, 0)], 0)
        np.testing.assert_array_equal(got, stack)
        assert (rows[:65] == -1).all() and (rows[88:] == -1).all()
        if isinstance(other, TableLayout):  # and back
            back = source_rows(stacked, other, 0, other.storage_rows)
            np.testing.assert_array_equal(np.where((back >= 0)[:, None], stack[np.maximum(back, 0)], 0), storage)


def test_each_device_draws_only_its_own_tables():
    """The init program (embedding/initial.py `stack_in_place`) of 8 table-wise tables of
    5,000 x 32 on 8 devices holds per device its stack shard (and slot) plus a few
    shard-sized temporaries (threefry's counters), not the 8 tables of the whole stack."""
    spec = EmbeddingConfigSpec(
        feature_to_config_dict={f"f{i}": FeatureConfig(f"t{i}") for i in range(8)},
        table_to_config_dict={f"t{i}": TableConfig(5_000, 32, sharding="table") for i in range(8)},
        optimization_parameters=AdagradParameters(0.1),
    )
    tables = ShardedTables(spec, mesh(8), table_axes=("data",))
    program = jax.jit(tables.build, out_shardings=tables.state_shardings()).lower(jax.random.PRNGKey(0)).compile()
    analysis, shard = program.memory_analysis(), 5_000 * 32 * 4
    assert analysis.output_size_in_bytes <= 2 * shard + 1024
    assert analysis.temp_size_in_bytes <= 4 * shard + (64 << 10) < 8 * shard, analysis.temp_size_in_bytes
    assert "all-gather" not in program.as_text()


# --- through the estimator -------------------------------------------------------------


def estimator_spec(users="table", items="row", clicks="table"):
    return EmbeddingConfigSpec(
        feature_to_config_dict={
            "user": FeatureConfig("users"), "history": FeatureConfig("items", max_sequence_length=4),
            "clicked": FeatureConfig("clicks", weight_key="clicked_w"), "region": FeatureConfig("regions"),
        },
        table_to_config_dict={
            "users": TableConfig(50, e.DIM, combiner="sum", sharding=users),
            "items": TableConfig(203, e.DIM, sharding=items),
            "clicks": TableConfig(40, e.DIM, sharding=clicks, learning_rate=0.2),
            "regions": TableConfig(7, e.DIM),  # replicated by the planner on 8 devices
        },
        optimization_parameters=AdagradParameters(0.5),
    )


def model_fn(features, labels, mode, params):
    history = features["history"].reshape(features["history"].shape[0], -1)
    x = jnp.concatenate([features["user"], features["clicked"], features["region"], history, features["dense"]], 1)
    y = nn.Dense(1)(nn.relu(nn.Dense(16)(x)))
    if mode == te.ModeKeys.PREDICT:
        return te.TPUEstimatorSpec(mode, predictions={"y": y})
    loss = jnp.mean((y - labels) ** 2)
    return te.TPUEstimatorSpec(mode, loss=loss, train_op=optax.sgd(0.1))


def batches(lo, hi):
    out = []
    for i, (features, labels) in enumerate(e.BATCHES[lo:hi]):
        region = np.random.RandomState(lo + i).randint(0, 7, (e.B,))
        out.append(({**features, "region": region}, labels))
    return out


def estimator(model_dir, use_tpu, spec, cores_per_replica=1):
    config = te.RunConfig(model_dir=str(model_dir), tpu_config=te.TPUConfig(
        iterations_per_loop=3, num_cores_per_replica=cores_per_replica))
    return te.TPUEstimator(model_fn, config=config, use_tpu=use_tpu, train_batch_size=e.B, eval_batch_size=e.B,
                           predict_batch_size=e.B, embedding_config_spec=spec)


NAMES = ("embedding/users", "embedding/clicks", "embedding/clicks/accumulator", "embedding/items",
         "embedding/regions", "Dense_0/kernel")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """3 steps on 8 devices (users and clicks table-wise) and on 1 device."""
    out = {}
    for n in (8, 1):
        model_dir = tmp_path_factory.mktemp(f"tablewise{n}")
        est = estimator(model_dir, n == 8, estimator_spec())
        est.train(e.train_input(batches(0, 3)), max_steps=3)
        out[n] = est, model_dir
    return out


def test_8_replicas_train_evaluate_and_predict_as_1_device(trained):
    (est8, _), (est1, _) = trained[8], trained[1]
    for name in NAMES:
        np.testing.assert_allclose(est8.get_variable_value(name), est1.get_variable_value(name), rtol=2e-5,
                                   atol=1e-6, err_msg=name)
    data = batches(6, 8)
    np.testing.assert_allclose(est8.evaluate(e.train_input(data))["loss"], est1.evaluate(e.train_input(data))["loss"],
                               rtol=1e-5)
    predicted = {n: np.concatenate([p["y"] for p in est.predict(e.predict_input(data))])
                 for n, (est, _) in trained.items()}
    np.testing.assert_allclose(predicted[8], predicted[1], rtol=1e-5, atol=1e-6)


def test_load_variable_reads_a_table_wise_table_whole_by_its_name(trained):
    (_, dir8), (est1, _) = trained[8], trained[1]
    names = {n for n, _ in te.list_variables(str(dir8)) if n.startswith("embedding/")}
    assert names == {f"embedding/{t}{s}" for t in ("users", "items", "clicks", "regions") for s in ("", "/accumulator")}
    assert dict(te.list_variables(str(dir8)))["embedding/users"] == (50, e.DIM)
    for name in ("embedding/users", "embedding/clicks/accumulator"):
        np.testing.assert_allclose(te.load_variable(str(dir8), name), est1.get_variable_value(name), rtol=2e-5,
                                   atol=1e-6, err_msg=name)


def test_checkpoint_moves_from_table_wise_to_row_wise_on_other_devices_and_back(trained, tmp_path):
    """8 devices table-wise -> 4 replicas of 2 cores, every table by rows -> 8 devices
    table-wise again: trains as 1 device all along."""
    import shutil

    (_, dir8), (_, dir1) = trained[8], trained[1]
    moved, one_dir = tmp_path / "moved", tmp_path / "one"
    shutil.copytree(dir8, moved)
    shutil.copytree(dir1, one_dir)
    rows = estimator_spec("row", "row", "row")
    estimator(moved, True, rows, cores_per_replica=2).train(e.train_input(batches(3, 4)), max_steps=4)
    back = estimator(moved, True, estimator_spec())
    back.train(e.train_input(batches(4, 5)), max_steps=5)
    one = estimator(one_dir, False, estimator_spec())
    one.train(e.train_input(batches(3, 5)), max_steps=5)
    for name in NAMES:
        np.testing.assert_allclose(back.get_variable_value(name), one.get_variable_value(name), rtol=2e-5,
                                   atol=1e-6, err_msg=name)


def test_warm_start_reads_tables_into_their_stacks(trained, tmp_path):
    """A table-wise model on 4 replicas of 2 cores warm-started from the 1-device checkpoint
    (every table plain there): the chosen tables land in their stacks by rows (users,
    table-wise; items, row-wise), clicks (stacked, not chosen) and the slots stay fresh."""
    dir1 = trained[1][1]
    warm = te.TPUEstimator(
        model_fn, model_dir=str(tmp_path), use_tpu=True, train_batch_size=e.B, eval_batch_size=e.B,
        embedding_config_spec=estimator_spec(),
        warm_start_from=te.WarmStartSettings(str(dir1), ["embedding/users$", "embedding/items$"]),
        config=te.RunConfig(tpu_config=te.TPUConfig(iterations_per_loop=1, num_cores_per_replica=2)),
    )
    warm.train(e.train_input(batches(0, 1)), max_steps=1)  # saves step 0 (warm-started), then step 1
    step0 = str(tmp_path / "0")
    for name in ("embedding/users", "embedding/items"):
        np.testing.assert_array_equal(te.load_variable(step0, name), te.load_variable(str(dir1), name), err_msg=name)
    assert not np.allclose(te.load_variable(step0, "embedding/clicks"), te.load_variable(str(dir1), "embedding/clicks"))
    np.testing.assert_array_equal(te.load_variable(step0, "embedding/users/accumulator"),
                                  np.full((50, e.DIM), 0.1, np.float32))  # slots start fresh
