"""TPUConfig(gradient_accumulation_steps, precision_policy, remat_policy) through the estimator,
on 8 devices: what input_fn and model_fn see, the dtypes model_fn computes in, float32
checkpoints and outputs, float16 loss scaling (a skipped step), and the settings' errors.
The step maths is tested in tests/unit/test_accumulate.py."""

from __future__ import annotations

import sys

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import tpu_estimator as te
from tests.estimator.models import N_CLASSES, batches_fn, estimator, make_data, metric_fn

BF16 = np.dtype(jnp.bfloat16)
NAMES = ["Dense_0/bias", "Dense_0/kernel", "Dense_1/bias", "Dense_1/kernel"]
X, Y = make_data(256)
SEEN: list[tuple] = []  # (what, mode, value) recorded while model_fn / input_fn trace or run


def recording_model_fn(features, labels, mode, params):
    """mlp_model_fn, recording the batch size, the features' and the kernel's dtypes it sees."""
    dense = nn.Dense(16)
    h = dense(features["x"])
    if not dense.is_initializing():  # (the initialisation creates float32 parameters)
        SEEN.append(("batch_size", mode, params.get("batch_size"), features["x"].shape[0]))
        SEEN.append(("x", mode, features["x"].dtype))
        if "id" in features:
            SEEN.append(("id", mode, features["id"].dtype))
        SEEN.append(("kernel", mode, dense.variables["params"]["kernel"].dtype))
        SEEN.append(("activation", mode, h.dtype))
    logits = nn.Dense(N_CLASSES)(nn.relu(h))
    if mode == te.ModeKeys.PREDICT:
        return te.TPUEstimatorSpec(mode, predictions={"logits": logits})
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    if mode == te.ModeKeys.TRAIN:
        return te.TPUEstimatorSpec(mode, loss=loss, train_op=optax.sgd(0.1))
    return te.TPUEstimatorSpec(mode, loss=loss, eval_metrics=(metric_fn, [labels, logits]))


def recording_input_fn(params):
    SEEN.append(("input_fn", params["batch_size"]))
    return batches_fn(X, Y, repeat=10)(params)


def seen(what, mode):
    return {s[2:] if len(s) > 3 else s[2] for s in SEEN if s[0] == what and s[1] == mode}


def weights(est):
    return {n: est.get_variable_value(n) for n in NAMES}


def train(model_dir, steps=2, input_fn=recording_input_fn, model_fn=recording_model_fn, **tpu):
    est = estimator(model_dir, model_fn=model_fn, train_batch_size=32,
                    tpu_config=te.TPUConfig(2, **tpu))
    est.train(input_fn, steps=steps)
    return est


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    return weights(train(tmp_path_factory.mktemp("f32")))


# --- gradient accumulation -----------------------------------------------------------


def test_accumulation_feeds_micro_batches_and_updates_once_per_step(tmp_path, baseline):
    SEEN.clear()
    est = train(tmp_path, gradient_accumulation_steps=2, remat_policy="dots_with_no_batch_dims_saveable")
    assert est.get_variable_value("global_step") == 2  # updates, not micro-batches
    assert {s[1] for s in SEEN if s[0] == "input_fn"} == {32}  # as without accumulation
    assert seen("batch_size", te.ModeKeys.TRAIN) == {(2, 2)}  # 32 / 8 replicas / 2
    got = weights(est)
    for n in NAMES:  # no batch norm: the same updates as k=1 on the same batches
        np.testing.assert_allclose(got[n], baseline[n], rtol=1e-5, atol=1e-6)


def test_a_batch_that_k_does_not_divide_is_an_error(tmp_path):
    with pytest.raises(ValueError, match=r"gradient_accumulation_steps=3 with a per-replica batch of 4"):
        train(tmp_path, gradient_accumulation_steps=3)


# --- precision policies ----------------------------------------------------------------


def test_mixed_bfloat16_computes_in_bfloat16_and_keeps_float32(tmp_path, baseline, monkeypatch):
    SEEN.clear()

    def input_fn(params):  # an integer feature stays an integer
        for feats, y in batches_fn(X, Y, repeat=10)(params):
            yield {**feats, "id": np.arange(len(y), dtype=np.int32)}, y

    est = train(tmp_path, input_fn=input_fn, precision_policy="mixed_bfloat16")
    assert seen("x", "train") == seen("kernel", "train") == seen("activation", "train") == {BF16}
    assert seen("id", "train") == {np.dtype(np.int32)}
    saved = {n: te.load_variable(str(tmp_path), n) for n in NAMES}
    assert {saved[n].dtype for n in NAMES} == {np.dtype(np.float32)}  # checkpoints hold float32
    got = weights(est)
    for n in NAMES:  # close to the float32 run
        np.testing.assert_allclose(got[n], baseline[n], rtol=0.05, atol=0.02)

    out = est.evaluate(batches_fn(X[:64], Y[:64]))
    assert seen("kernel", "eval") == {BF16}
    logits = np.maximum(X[:64] @ got["Dense_0/kernel"] + got["Dense_0/bias"], 0) @ got["Dense_1/kernel"]
    logits = logits + got["Dense_1/bias"]
    shifted = logits - logits.max(1, keepdims=True)
    loss = np.mean(np.log(np.exp(shifted).sum(1)) - shifted[np.arange(64), Y[:64]])
    np.testing.assert_allclose(out["loss"], loss, rtol=0.02)  # the float32 loss, within bfloat16's error
    pred = next(iter(est.predict(batches_fn(X[:16], None))))
    assert seen("kernel", "infer") == {BF16} and pred["logits"].dtype == np.float32

    SEEN.clear()

    def receiver():
        spec = te.TensorSpec((None, X.shape[1]), np.float32)
        return te.ServingInputReceiver({"x": spec}, {"x": spec})

    monkeypatch.setitem(sys.modules, "tensorflow", None)  # the jax.export artifact only (faster)
    export = est.export_saved_model(str(tmp_path / "export"), receiver)
    assert seen("kernel", "infer") == {BF16}  # the export computes in bfloat16
    served = te.load_exported(export).signatures["serving_default"](x=X[:16])
    assert np.asarray(served["logits"]).dtype == np.float32
    np.testing.assert_allclose(np.asarray(served["logits"]), np.stack(
        [p["logits"] for p in est.predict(batches_fn(X[:16], None))]), rtol=0.02, atol=0.02)


def regression_model_fn(features, labels, mode, params):
    pred = nn.Dense(1)(nn.relu(nn.Dense(16)(features["x"])))[:, 0]
    loss = jnp.mean((pred - labels) ** 2)
    return te.TPUEstimatorSpec(mode, loss=loss, train_op=optax.sgd(0.01))


def regression_input(scale):
    """Small inputs and labels (float16 gradients x 2**15 stay finite), labels times `scale`."""
    def input_fn(params):
        for feats, y in batches_fn(X, Y, repeat=10)(params):
            yield {"x": feats["x"] * 1e-3}, y.astype(np.float32) * 1e-3 * scale
    return input_fn


def test_mixed_float16_skips_an_overflowing_step_and_halves_the_scale(tmp_path):
    """From a float32 checkpoint (the loss scale is optional state: it starts afresh), train
    on under mixed_float16, then one step whose float16 gradients overflow."""
    train(tmp_path, steps=1, input_fn=regression_input(1), model_fn=regression_model_fn)
    est = estimator(tmp_path, model_fn=regression_model_fn, train_batch_size=32,
                    tpu_config=te.TPUConfig(2, precision_policy="mixed_float16"))
    assert np.isfinite(est.evaluate(regression_input(1), steps=1)["loss"])
    est.train(regression_input(1), steps=2)
    assert est.get_variable_value("global_step") == 3
    assert est.get_variable_value("loss_scale/scale") == 2.0**15
    assert est.get_variable_value("loss_scale/good_steps") == 2
    assert est.get_variable_value("Dense_0/kernel").dtype == np.float32
    before = {n: est.get_variable_value(n) for n in NAMES}
    # labels of 1e4: the scaled gradient of the float16 predictions overflows
    est.train(regression_input(1e7), steps=1)
    assert est.get_variable_value("global_step") == 4  # a skipped step still counts
    assert est.get_variable_value("loss_scale/scale") == 2.0**14
    assert est.get_variable_value("loss_scale/good_steps") == 0
    for n in NAMES:
        np.testing.assert_array_equal(est.get_variable_value(n), before[n])


# --- the settings' errors --------------------------------------------------------------


@pytest.mark.parametrize(
    "kw, error, match",
    [
        ({"gradient_accumulation_steps": 0}, ValueError, "gradient_accumulation_steps=0"),
        ({"gradient_accumulation_steps": 2.0}, TypeError, "gradient_accumulation_steps=2.0"),
        ({"precision_policy": "bfloat16"}, ValueError, "precision_policy='bfloat16'.*mixed_bfloat16"),
        ({"remat_policy": "dots"}, ValueError, "dots_saveable.*remat_policy='dots'"),
        ({"remat_policy": "save_only_these_names"}, ValueError, "remat_policy='save_only_these_names'"),
        ({"remat_policy": True}, ValueError, "remat_policy=True"),
    ],
)
def test_settings_are_checked(kw, error, match):
    with pytest.raises(error, match=match):
        te.TPUConfig(**kw)



def test_accumulation_with_embedding_tables_equals_one_big_step(tmp_path):
    """The looked-up activations are split with the features; their gradients are the
    micro-batches' concatenated (over k), so the tables' updates are the big step's."""
    from tests.embedding.test_estimator import BATCHES, make_spec
    from tests.embedding.test_estimator import model_fn as embedding_model_fn

    out = {}
    for k in (1, 2):
        est = te.TPUEstimator(
            embedding_model_fn, model_dir=str(tmp_path / str(k)), use_tpu=False, train_batch_size=32,
            embedding_config_spec=make_spec(),
            config=te.RunConfig(tpu_config=te.TPUConfig(2, gradient_accumulation_steps=k)),
        )
        est.train(lambda params: iter(BATCHES[:2]), max_steps=2)
        out[k] = {n: est.get_variable_value(n) for n in ("embedding/users", "embedding/items", *NAMES)}
    for n, v in out[1].items():
        np.testing.assert_allclose(out[2][n], v, rtol=1e-5, atol=1e-6, err_msg=n)
