"""Input pipeline modes on 8 fake devices: input_fn calls, params['batch_size'], what each replica gets."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import tpu_estimator as te
from tpu_estimator import InputPipelineConfig as IPC

R = 8  # replicas
N = 64


def make_model(record):
    def model_fn(features, labels, mode, params):
        record["model_batch"] = params["batch_size"]
        logits = nn.Dense(3)(features["x"])
        if mode == te.ModeKeys.PREDICT:
            return te.TPUEstimatorSpec(mode, predictions={"id": features["id"]})
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
        try:
            ids = jax.lax.all_gather(features["id"], "data")  # [replicas, per-replica batch]
        except NameError:  # initialisation traces model_fn outside the replicas
            ids = features["id"][None]
        tiled = jnp.broadcast_to(ids[None], (ids.shape[1], *ids.shape))

        def host_call(ids):
            record.setdefault("replica_ids", []).append(np.asarray(ids)[0])

        return te.TPUEstimatorSpec(mode, loss=loss, train_op=optax.sgd(0.1), host_call=(host_call, [tiled]))

    return model_fn


def make_input(record, offset_per_pipeline=0):
    rng = np.random.RandomState(0)
    x = rng.randn(N, 4).astype(np.float32)
    y = rng.randint(0, 3, N).astype(np.int32)

    def input_fn(params, input_context):
        b = params["batch_size"]
        record.setdefault("calls", []).append((b, input_context))
        base = offset_per_pipeline * input_context.input_pipeline_id
        for i in range(0, N - b + 1, b):
            ids = np.arange(i, i + b, dtype=np.int32) + base
            yield {"id": ids, "x": x[i : i + b]}, y[i : i + b]

    return input_fn


def make_estimator(tmp_path, record, pipeline, batch=16, **tpu):
    cfg = te.RunConfig(
        model_dir=str(tmp_path),
        tpu_config=te.TPUConfig(iterations_per_loop=2, per_host_input_for_training=pipeline, **tpu),
        log_step_count_steps=None,
    )
    return te.TPUEstimator(
        make_model(record), config=cfg, train_batch_size=batch, eval_batch_size=batch,
        predict_batch_size=batch,
    )


@pytest.mark.parametrize(
    "pipeline, batch, calls, input_batch, model_batch, offset",
    [
        (IPC.PER_HOST_V1, 16, 1, 16, 2, 0),
        (IPC.PER_HOST_V2, 16, 1, 2, 2, 0),
        (IPC.PER_SHARD_V1, 16, R, 2, 2, 1000),
        (IPC.BROADCAST, 12, 1, 12, 12, 0),  # need not divide the replica count
    ],
)
def test_train_input_modes(tmp_path, pipeline, batch, calls, input_batch, model_batch, offset):
    record = {}
    est = make_estimator(tmp_path, record, pipeline, batch)
    est.train(make_input(record, offset), max_steps=2)
    assert len(record["calls"]) == calls
    assert {b for b, _ in record["calls"]} == {input_batch}
    assert record["model_batch"] == model_batch
    seen = record["replica_ids"][0]  # step 1: [replica, per-replica batch]
    if pipeline is IPC.BROADCAST:
        expected = np.tile(np.arange(batch), (R, 1))
    elif pipeline is IPC.PER_SHARD_V1:
        expected = np.arange(R)[:, None] * offset + np.arange(2)[None, :]
        assert [c.input_pipeline_id for _, c in record["calls"]] == list(range(R))
        assert {c.num_input_pipelines for _, c in record["calls"]} == {R}
    else:
        expected = np.arange(batch).reshape(R, -1)
    np.testing.assert_array_equal(seen, expected)
    second = record["replica_ids"][1]
    if pipeline is IPC.PER_HOST_V1 or pipeline is IPC.PER_HOST_V2:
        np.testing.assert_array_equal(second, expected + batch)
    ctx = record["calls"][0][1]
    assert (ctx.num_replicas_in_sync, ctx.per_replica_batch_size) == (R, model_batch)
    assert ctx.num_hosts == (R if pipeline is IPC.PER_SHARD_V1 else 1)


@pytest.mark.parametrize("mode", ["sliced", "broadcast", "per_host_v2"])
def test_predict_input_modes(tmp_path, mode):
    record = {}
    kw = {}
    pipeline = IPC.PER_HOST_V1
    if mode == "sliced":
        kw["eval_training_input_configuration"] = IPC.SLICED
    elif mode == "broadcast":
        pipeline = IPC.BROADCAST
    else:
        pipeline = IPC.PER_HOST_V2
    est = make_estimator(tmp_path, record, pipeline, 16, **kw)
    preds = list(est.predict(make_input(record), yield_single_examples=False))
    expected_batch = 2 if mode == "per_host_v2" else 16
    assert {b for b, _ in record["calls"]} == {expected_batch}
    assert len(record["calls"]) == 1
    assert record["model_batch"] == (16 if mode == "broadcast" else 2)
    ids = np.concatenate([p["id"] for p in preds])
    # broadcast: replica 0's copy (the whole batch); otherwise the replicas' slices in order.
    np.testing.assert_array_equal(ids, np.arange(N))


def test_per_shard_v1_is_train_only(tmp_path):
    record = {}
    est = make_estimator(tmp_path, record, False)
    with pytest.raises(ValueError, match=r"PER_SHARD_V1 \(False\) only supports TRAIN"):
        est.evaluate(make_input(record))


def test_broadcast_eval_metrics_use_replica_zero(tmp_path):
    def model_fn(features, labels, mode, params):
        logits = nn.Dense(3)(features["x"])
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
        if mode == te.ModeKeys.TRAIN:
            return te.TPUEstimatorSpec(mode, loss=loss, train_op=optax.sgd(0.1))
        return te.TPUEstimatorSpec(mode, loss=loss, eval_metrics=(lambda ids: {"count": _count(ids)}, [features["id"]]))

    cfg = te.RunConfig(model_dir=str(tmp_path), tpu_config=te.TPUConfig(per_host_input_for_training=IPC.BROADCAST))
    est = te.TPUEstimator(model_fn, config=cfg, train_batch_size=16, eval_batch_size=16)
    result = est.evaluate(make_input({}), steps=2)
    assert result["count"] == 16  # metric_fn saw batches of 16 (replica 0's copy), not 8 copies


def _count(ids):
    return te.metrics.mean(np.full(np.shape(ids), float(np.shape(ids)[0])))
