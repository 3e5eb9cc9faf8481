"""TPUEstimator(embedding_config_spec=...): train, evaluate, predict, checkpoints, export.

A small DLRM-like model (two tables, a sequence feature, a weighted feature,
duplicate ids) trained by the real estimator on 8 replicas and on 1 device
from the same global batches: the losses, metrics, predictions and whole
tables agree; each device holds 1/8 of every table and slot; checkpoints move
between device counts; an export looks up on one device.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import tpu_estimator as te
from tpu_estimator.embedding import (
    AdagradParameters,
    AdamParameters,
    EmbeddingConfigSpec,
    FeatureConfig,
    TableConfig,
)

B, DIM, STEPS = 32, 8, 6
SEEN: list[dict[str, tuple[int, ...]]] = []


def make_spec(optimizer=None, strategy="div", sharding="row"):
    return EmbeddingConfigSpec(
        feature_to_config_dict={
            "user": FeatureConfig("users"),
            "history": FeatureConfig("items", max_sequence_length=4),
            "clicked": FeatureConfig("items", weight_key="clicked_w"),
        },
        table_to_config_dict={
            "users": TableConfig(50, DIM, combiner="sum", sharding=sharding),
            "items": TableConfig(203, DIM, sharding=sharding),
        },
        optimization_parameters=optimizer or AdagradParameters(0.5),
        partition_strategy=strategy,
    )


def make_batches(n, seed=0):
    rng = np.random.RandomState(seed)
    out = []
    for _ in range(n):
        history = rng.randint(0, 203, (B, 4))
        history[rng.rand(B, 4) < 0.3] = -1
        clicked = rng.randint(0, 40, (B, 6))  # a hot range: duplicates across replicas
        clicked[rng.rand(B, 6) < 0.4] = -1
        features = {
            "user": rng.randint(0, 50, (B,)),
            "history": history,
            "clicked": clicked,
            "clicked_w": rng.uniform(0.1, 1.0, (B, 6)).astype(np.float32),
            "dense": rng.randn(B, 3).astype(np.float32),
        }
        out.append((features, rng.randn(B, 1).astype(np.float32)))
    return out


BATCHES = make_batches(STEPS + 3)


def cut(batch, n):
    features, labels = batch
    return {k: v[:n] for k, v in features.items()}, labels[:n]


# evaluated and predicted: two full batches and a short one (padded; run example by example)
UNEVEN = BATCHES[STEPS : STEPS + 2] + [cut(BATCHES[STEPS + 2], 20)]


def model_fn(features, labels, mode, params):
    SEEN.append({k: tuple(v.shape) for k, v in features.items()})
    history = features["history"].reshape(features["history"].shape[0], -1)
    x = jnp.concatenate([features["user"], features["clicked"], history, features["dense"]], axis=1)
    y = nn.Dense(1)(nn.relu(nn.Dense(16)(x)))
    if mode == te.ModeKeys.PREDICT:
        return te.TPUEstimatorSpec(mode, predictions={"y": y}, export_outputs={"y": te.PredictOutput({"y": y})})
    loss = jnp.mean((y - labels) ** 2)

    def metric_fn(labels, y):
        return {"mse": te.metrics.mean_squared_error(labels, y)}

    return te.TPUEstimatorSpec(mode, loss=loss, train_op=optax.sgd(0.1), eval_metrics=(metric_fn, {"labels": labels, "y": y}))


def estimator(model_dir, use_tpu, spec=None):
    return te.TPUEstimator(
        model_fn,
        model_dir=str(model_dir),
        use_tpu=use_tpu,
        train_batch_size=B,
        eval_batch_size=B,
        predict_batch_size=B,
        embedding_config_spec=spec or make_spec(),
        config=te.RunConfig(tpu_config=te.TPUConfig(iterations_per_loop=3)),
    )


def train_input(batches):
    return lambda params: iter(batches)


def predict_input(batches):
    return lambda params: iter([f for f, _ in batches])


class StateProbe(te.SessionRunHook):
    """Fetches the training state after the last loop (its arrays, as placed)."""

    def __init__(self):
        self.state = None

    def before_run(self, run_context):
        return te.SessionRunArgs({"state": "state"})

    def after_run(self, run_context, run_values):
        self.state = run_values.results["state"]


def run(model_dir, use_tpu, spec=None):
    est = estimator(model_dir, use_tpu, spec)
    probe = StateProbe()
    est.train(train_input(BATCHES[:STEPS]), max_steps=STEPS, hooks=[probe])
    evaluated = est.evaluate(train_input(UNEVEN))
    predicted = np.concatenate([p["y"] for p in est.predict(predict_input(UNEVEN))])
    tables = {n: est.get_variable_value(n) for n in ("embedding/users", "embedding/items")}
    return est, probe.state, evaluated, predicted, tables


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return {
        n: run(tmp_path_factory.mktemp(f"emb{n}"), use_tpu=n == 8)
        for n in (8, 1)
    }


def test_8_replicas_equal_1_device(runs):
    _, _, eval8, pred8, tables8 = runs[8]
    _, _, eval1, pred1, tables1 = runs[1]
    assert eval8["global_step"] == eval1["global_step"] == STEPS
    np.testing.assert_allclose(eval8["loss"], eval1["loss"], rtol=1e-5)
    np.testing.assert_allclose(eval8["mse"], eval1["mse"], rtol=1e-5)
    np.testing.assert_allclose(pred8, pred1, rtol=1e-5, atol=1e-6)
    assert pred8.shape == (2 * B + 20,)  # predict yields one example at a time
    for name in tables1:
        np.testing.assert_allclose(tables8[name], tables1[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_tables_are_whole_and_trained(runs):
    est, _, _, _, tables = runs[8]
    assert {n for n in est.get_variable_names() if n.startswith("embedding/")} == {
        "embedding/users", "embedding/items", "embedding/users/accumulator", "embedding/items/accumulator"
    }
    # the same without the model (as tf.train.load_variable), from any device count
    np.testing.assert_array_equal(te.load_variable(est.model_dir, "embedding/items"), tables["embedding/items"])
    assert dict(te.list_variables(est.model_dir))["embedding/items/accumulator"] == (203, DIM)
    assert tables["embedding/users"].shape == (50, DIM)
    assert tables["embedding/items"].shape == (203, DIM)
    fresh = estimator(est.model_dir + "-fresh", use_tpu=True)
    fresh.train(train_input(BATCHES[:1]), max_steps=0 + 1)  # one step: tables barely moved
    moved = np.abs(tables["embedding/items"] - fresh.get_variable_value("embedding/items")).max(axis=1)
    assert (moved[:40] > 1e-4).all()  # the hot ids were updated
    ids_seen = set(np.concatenate([b[0]["history"].ravel() for b in BATCHES[:STEPS]]).tolist())
    never = [i for i in range(40, 203) if i not in ids_seen]
    assert never and (moved[never] < 1e-3).all()  # rows never looked up: only step 1 differs (none)


def test_each_device_holds_an_eighth_of_each_table_and_slot(runs):
    _, state, _, _, _ = runs[8]
    emb = state.extras["embedding"]
    for name, rows in (("users", 7), ("items", 26)):  # ceil(V / 8)
        for array in (emb.tables[name], *emb.slots[name].values()):
            shapes = {s.data.shape for s in array.addressable_shards}
            assert shapes == {(rows, DIM)}, (name, shapes)
            assert len({s.device for s in array.addressable_shards}) == 8
    assert set(emb.slots["items"]) == {"accumulator"}


def test_model_fn_sees_activations_in_place_of_ids(runs):
    shapes = [s for s in SEEN if s.get("user", (0,))[0] == B // 8]  # per-replica batch on 8
    assert shapes, SEEN[:3]
    seen = shapes[-1]
    assert seen["user"] == (B // 8, DIM)
    assert seen["clicked"] == (B // 8, DIM)
    assert seen["history"] == (B // 8, 4, DIM)
    assert "clicked_w" not in seen and seen["dense"] == (B // 8, 3)


def test_checkpoint_moves_between_device_counts_and_partition_strategies(tmp_path):
    """8 devices 'div' -> 1 device 'mod' -> 8 devices 'mod' train as 1 device 'div' all
    along (the tables convert through their logical order; the saved layout says the
    storage order, and 'mod' needs the saved shard count)."""
    div, mod = make_spec(AdamParameters(0.05), "div"), make_spec(AdamParameters(0.05), "mod")
    moved = tmp_path / "moved"
    estimator(moved, True, div).train(train_input(BATCHES[:3]), max_steps=3)
    estimator(moved, False, mod).train(train_input(BATCHES[3:5]), max_steps=5)
    last = estimator(moved, True, mod)
    last.train(train_input(BATCHES[5:6]), max_steps=6)
    one = estimator(tmp_path / "one", False, div)
    for lo, hi in ((0, 3), (3, 5), (5, 6)):
        one.train(train_input(BATCHES[lo:hi]), max_steps=hi)
    for name in ("embedding/users", "embedding/items", "embedding/items/m", "Dense_0/kernel"):
        np.testing.assert_allclose(
            last.get_variable_value(name), one.get_variable_value(name), rtol=2e-5, atol=1e-6, err_msg=name
        )
    np.testing.assert_allclose(
        last.evaluate(train_input(BATCHES[6:7]), steps=1)["loss"],
        one.evaluate(train_input(BATCHES[6:7]), steps=1)["loss"],
        rtol=1e-5,
    )


def test_export_looks_up_on_one_device(runs, tmp_path):
    est, _, _, pred, tables = runs[8]
    features = UNEVEN[0][0]
    receiver = te.build_raw_serving_input_receiver_fn(features)
    path = est.export_saved_model(str(tmp_path / "export"), receiver)
    model = te.load_exported(path)
    served = model.signatures["serving_default"](**UNEVEN[0][0])["y"]
    np.testing.assert_allclose(np.ravel(served), pred[:B], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(te.load_variable(path, "embedding/items"), tables["embedding/items"])


def test_ids_out_of_range_name_the_feature_and_table(tmp_path):
    bad = [(dict(BATCHES[0][0], user=np.full((B,), 50)), BATCHES[0][1])]
    with pytest.raises(ValueError, match=r"embedding feature 'user' \(table 'users'\).*\[0, 50\)"):
        estimator(tmp_path, True).train(train_input(bad), max_steps=1)


def test_not_an_embedding_config_spec_is_a_type_error(tmp_path):
    with pytest.raises(TypeError, match="embedding_config_spec"):
        te.TPUEstimator(model_fn, config=te.RunConfig(model_dir=str(tmp_path)), use_tpu=False, embedding_config_spec={"users": 1})


def test_a_changed_table_shape_is_an_error_naming_the_table(runs, tmp_path):
    """A changed vocabulary_size or dimension is an error naming the table (the partition
    strategy may change: test_checkpoint_moves_between_device_counts_and_partition_strategies)."""
    import shutil

    changed = tmp_path / "changed"
    shutil.copytree(runs[8][0].model_dir, changed)
    bigger = make_spec()
    bigger = EmbeddingConfigSpec(
        feature_to_config_dict=bigger.feature_to_config_dict,
        table_to_config_dict={**bigger.table_to_config_dict, "items": TableConfig(300, DIM)},
        optimization_parameters=bigger.optimization_parameters,
    )
    with pytest.raises(ValueError, match=r"no embedding table 'items' of vocabulary_size 300.*'items': 203"):
        estimator(changed, True, bigger).evaluate(train_input(BATCHES[6:7]), steps=1)
    wider = EmbeddingConfigSpec(
        feature_to_config_dict=bigger.feature_to_config_dict,
        table_to_config_dict={**bigger.table_to_config_dict, "items": TableConfig(203, DIM * 2)},
        optimization_parameters=bigger.optimization_parameters,
    )
    for run in ("train", "evaluate"):  # before model_fn's dense layers see other input widths
        with pytest.raises(ValueError, match=rf"table 'items' has dimension {DIM}, not {DIM * 2}"):
            getattr(estimator(changed, True, wider), run)(train_input(BATCHES[6:7]), steps=1)


def test_warm_start_copies_the_tables_slots_start_fresh(runs, tmp_path):
    est, _, _, _, tables = runs[8]
    warm = te.TPUEstimator(
        model_fn, model_dir=str(tmp_path), use_tpu=False, train_batch_size=B, eval_batch_size=B,
        embedding_config_spec=make_spec(), warm_start_from=est.model_dir,
        config=te.RunConfig(tpu_config=te.TPUConfig(iterations_per_loop=1)),
    )
    warm.train(train_input(BATCHES[:1]), max_steps=1)  # saves step 0 (warm-started), then step 1
    step0 = te.load_variable(str(tmp_path / "0"), "embedding/items")
    np.testing.assert_array_equal(step0, tables["embedding/items"])
    np.testing.assert_array_equal(te.load_variable(str(tmp_path / "0"), "embedding/items/accumulator"),
                                  np.full((203, DIM), 0.1, np.float32))  # slots start fresh


def test_model_parallel_replicas_look_up_like_1_device(runs, tmp_path):
    """num_cores_per_replica=2: 4 replicas of 2 cores; the tables' rows split over all 8
    devices ("data" and "model": each core holds 1/8, not its replica's 1/4), each core
    looking up half of its replica's examples; trained, evaluated and predicted as 1 device."""
    config = te.RunConfig(
        model_dir=str(tmp_path), tpu_config=te.TPUConfig(iterations_per_loop=3, num_cores_per_replica=2)
    )
    est = te.TPUEstimator(
        model_fn, config=config, use_tpu=True, train_batch_size=B, eval_batch_size=B, predict_batch_size=B,
        embedding_config_spec=make_spec(),
    )
    probe = StateProbe()
    est.train(train_input(BATCHES[:STEPS]), max_steps=STEPS, hooks=[probe])
    emb = probe.state.extras["embedding"]
    for name, rows in (("users", 7), ("items", 26)):  # ceil(V / 8)
        for array in (emb.tables[name], *emb.slots[name].values()):
            assert {s.data.shape for s in array.addressable_shards} == {(rows, DIM)}, name
            assert len({s.device for s in array.addressable_shards}) == 8
    for name, table in runs[1][4].items():
        np.testing.assert_allclose(est.get_variable_value(name), table, rtol=1e-5, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(est.evaluate(train_input(UNEVEN))["loss"], runs[1][2]["loss"], rtol=1e-5)
    predicted = np.concatenate([p["y"] for p in est.predict(predict_input(UNEVEN))])
    np.testing.assert_allclose(predicted, runs[1][3], rtol=1e-5, atol=1e-6)


def test_a_checkpoint_of_the_previous_layout_restores(runs, tmp_path):
    """Checkpoints written before the tables became a component (tpu_estimator 0.1.0) held
    them at the top level (`embedding`), not under `extras`: they are read, evaluated and
    trained on as before."""
    from tpu_estimator.checkpoint.manager import Checkpointer

    est, _, evaluated, _, tables = runs[1]
    source = Checkpointer(est.model_dir, read_only=True)
    raw = source.restore_raw(STEPS)
    source.close()
    extras = dict(raw.pop("extras"))
    legacy = {**raw, "embedding": extras.pop("embedding"), **({"extras": extras} if extras else {})}
    old_dir = str(tmp_path / "legacy")
    writer = Checkpointer(old_dir)
    writer.save(STEPS, legacy)
    writer.wait()
    writer.close()
    assert dict(te.list_variables(old_dir))["embedding/items/accumulator"] == (203, DIM)
    np.testing.assert_array_equal(te.load_variable(old_dir, "embedding/items"), tables["embedding/items"])
    old = estimator(old_dir, use_tpu=False)
    np.testing.assert_allclose(old.evaluate(train_input(UNEVEN))["loss"], evaluated["loss"], rtol=1e-6)
    old.train(train_input(BATCHES[:1]), max_steps=STEPS + 1)
    assert old.get_variable_value("global_step") == STEPS + 1
    assert "embedding/items" in old.get_variable_names()
