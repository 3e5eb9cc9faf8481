"""evaluate() is exact on any dataset size; predict() yields one result per example, in order."""

from __future__ import annotations

import flax.linen as nn
import numpy as np
import optax
import pytest

import tpu_estimator as te
from tpu_estimator import metrics
from tests.estimator.models import N_CLASSES, batches_fn, estimator


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data):
    x, y = data
    est = estimator(tmp_path_factory.mktemp("trained"), eval_batch_size=64, predict_batch_size=16)
    return est.train(batches_fn(x, y), max_steps=12)


def _numpy_logits(est, x):
    h = np.maximum(x @ est.get_variable_value("Dense_0/kernel") + est.get_variable_value("Dense_0/bias"), 0)
    return h @ est.get_variable_value("Dense_1/kernel") + est.get_variable_value("Dense_1/bias")


def _xent(logits, y):
    z = logits - logits.max(1, keepdims=True)
    return -(z[np.arange(len(y)), y] - np.log(np.exp(z).sum(1)))


def test_evaluate_counts_every_example_once(trained, data):
    x, y = data  # 1,000 examples, batch 64: 15 full batches and one of 40
    result = trained.evaluate(batches_fn(x, y))
    logits = _numpy_logits(trained, x)
    assert result["global_step"] == 12
    assert result["accuracy"] == pytest.approx(np.mean(logits.argmax(1) == y), abs=1e-9)
    assert result["loss"] == pytest.approx(_xent(logits, y).mean(), rel=1e-5)


def test_evaluate_steps_limits_batches(trained, data):
    x, y = data
    result = trained.evaluate(batches_fn(x, y), steps=2)
    logits = _numpy_logits(trained, x[:128])
    assert result["accuracy"] == pytest.approx(np.mean(logits.argmax(1) == y[:128]))
    with pytest.raises(ValueError, match="steps > 0"):
        trained.evaluate(batches_fn(x, y), steps=0)


def test_evaluate_writes_tensorboard_scalars(trained, data):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    x, y = data
    trained.evaluate(batches_fn(x[:64], y[:64]), name="small")
    acc = EventAccumulator(trained.eval_dir("small"))
    acc.Reload()
    assert {"accuracy", "loss"} <= set(acc.Tags()["scalars"])
    assert acc.Scalars("loss")[-1].step == 12


def test_predict_yields_one_result_per_example_in_order(trained, data):
    x, _ = data
    preds = list(trained.predict(batches_fn(x, None)))
    assert len(preds) == 1000
    np.testing.assert_array_equal([p["classes"] for p in preds], _numpy_logits(trained, x).argmax(1))


def test_predict_pads_a_short_final_batch(trained, data):
    x, _ = data  # 24 examples, predict batch 16 on 8 replicas
    preds = list(trained.predict(batches_fn(x[:24], None), predict_keys=["classes"]))
    assert len(preds) == 24 and set(preds[0]) == {"classes"}


def test_predict_whole_batches(trained, data):
    x, _ = data
    batches = list(trained.predict(batches_fn(x[:40], None), yield_single_examples=False))
    assert [b["logits"].shape for b in batches] == [(16, N_CLASSES), (16, N_CLASSES), (8, N_CLASSES)]


def test_predict_key_errors(trained, data):
    x, _ = data
    with pytest.raises(ValueError, match=r"unknown \['nope'\]"):
        list(trained.predict(batches_fn(x[:16], None), predict_keys=["nope"]))


def test_abandoned_predict_leaves_nothing_running(trained, data):
    import threading

    x, _ = data
    before = threading.active_count()
    gen = trained.predict(batches_fn(x, None))
    next(gen)
    gen.close()
    assert threading.active_count() == before
    assert len(list(trained.predict(batches_fn(x[:32], None)))) == 32


def _estimator_spec_model(features, labels, mode, params):
    logits = nn.Dense(N_CLASSES)(features["x"])
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    if mode == te.ModeKeys.TRAIN:
        return te.EstimatorSpec(mode, loss=loss, train_op=optax.sgd(0.1))
    ops = {"accuracy": metrics.accuracy(labels, logits.argmax(-1)), "mse": metrics.mean(loss)}
    return te.EstimatorSpec(mode, loss=loss, eval_metric_ops=ops)


def test_eval_metric_ops_are_computed_in_the_program_and_exact(tmp_path, data):
    x, y = data
    est = estimator(tmp_path, model_fn=_estimator_spec_model, eval_on_tpu=False)
    est.train(batches_fn(x, y), steps=4)
    result = est.evaluate(batches_fn(x[:100], y[:100]))  # 6 full batches + 4 examples
    logits = x[:100] @ est.get_variable_value("Dense_0/kernel") + est.get_variable_value("Dense_0/bias")
    assert result["accuracy"] == pytest.approx(np.mean(logits.argmax(1) == y[:100]))
    assert result["loss"] == pytest.approx(_xent(logits, y[:100]).mean(), rel=1e-5)


def test_estimator_spec_in_eval_needs_eval_on_tpu_false(tmp_path, data):
    x, y = data
    est = estimator(tmp_path, model_fn=_estimator_spec_model)
    with pytest.raises(TypeError, match="eval_on_tpu=False"):
        est.evaluate(batches_fn(x[:16], y[:16]))


def test_a_metric_named_loss_is_an_error(tmp_path, data):
    def model_fn(features, labels, mode, params):
        logits = nn.Dense(N_CLASSES)(features["x"])
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
        fn = lambda l, g: {"loss": metrics.mean(g)}
        return te.TPUEstimatorSpec(mode, loss=loss, eval_metrics=(fn, [labels, logits]))

    x, y = data
    with pytest.raises(ValueError, match="may not be named 'loss'"):
        estimator(tmp_path, model_fn=model_fn).evaluate(batches_fn(x[:16], y[:16]))


def test_single_device_estimator_lets_input_fn_choose_the_batch(tmp_path, data):
    x, y = data
    est = te.Estimator(_estimator_spec_model, model_dir=str(tmp_path), config=te.RunConfig(log_step_count_steps=None))

    def input_fn(params):
        assert "batch_size" not in params
        for i in range(0, 100, 25):
            yield {"x": x[i : i + 25]}, y[i : i + 25]

    est.train(input_fn)
    assert est.get_variable_value("global_step") == 4
    assert 0 <= est.evaluate(input_fn)["accuracy"] <= 1
