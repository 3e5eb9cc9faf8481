"""What model_fn and input_fn are given, and the errors for model_fns that break the contract."""

from __future__ import annotations

import flax.linen as nn
import optax
import pytest

import tpu_estimator as te
from tests.estimator.models import batches_fn, estimator


def test_model_fn_and_input_fn_get_the_arguments_they_name(tmp_path, data):
    x, y = data
    got = {}

    def model_fn(features, labels, mode, params, config):
        got["model"] = (mode, params["batch_size"], params["lr"], config)
        logits = nn.Dense(3)(features["x"])
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
        return te.TPUEstimatorSpec(mode, loss=loss, train_op=optax.sgd(params["lr"]))

    def input_fn(params, config, mode, input_context):
        got["input"] = (mode, params["batch_size"], config, input_context)
        return batches_fn(x, y)(params)

    est = estimator(tmp_path, model_fn=model_fn)
    est.train(input_fn, steps=2)
    assert got["model"] == (te.ModeKeys.TRAIN, 2, 0.1, est.config)  # per replica: 16 / 8
    mode, batch, config, context = got["input"]
    assert (mode, batch, config) == (te.ModeKeys.TRAIN, 16, est.config)  # per host
    assert (context.num_input_pipelines, context.input_pipeline_id, context.num_replicas_in_sync) == (1, 0, 8)


def test_labels_need_a_labels_argument(tmp_path, data):
    def model_fn(features, mode):
        return te.TPUEstimatorSpec(mode, predictions=nn.Dense(3)(features["x"]))

    x, y = data
    with pytest.raises(ValueError, match="model_fn does not take `labels`"):
        estimator(tmp_path, model_fn=model_fn).evaluate(batches_fn(x[:16], y[:16]))


def test_a_layer_built_in_one_mode_only_is_explained(tmp_path, data):
    def model_fn(features, labels, mode):
        h = features["x"]
        if mode == te.ModeKeys.TRAIN:
            h = nn.Dense(8)(h)  # shifts the automatic name of the next layer
        logits = nn.Dense(3)(h)
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
        if mode == te.ModeKeys.TRAIN:
            return te.TPUEstimatorSpec(mode, loss=loss, train_op=optax.sgd(0.1))
        return te.TPUEstimatorSpec(mode, loss=loss)

    x, y = data
    est = estimator(tmp_path, model_fn=model_fn).train(batches_fn(x, y), steps=2)
    with pytest.raises(ValueError, match="pass name='...' to such layers"):
        est.evaluate(batches_fn(x[:16], y[:16]))


def test_model_fn_must_return_a_spec(tmp_path, data):
    x, y = data
    est = estimator(tmp_path, model_fn=lambda features, labels, mode: {"loss": 1})
    with pytest.raises(TypeError, match="must return a TPUEstimatorSpec or an EstimatorSpec"):
        est.train(batches_fn(x, y), steps=1)
