"""TPUEstimator's constructor checks, attributes and variable access."""

from __future__ import annotations

import os

import pytest

import tpu_estimator as te
from tests.estimator.models import batches_fn, estimator, mlp_model_fn

CFG = te.RunConfig(log_step_count_steps=None)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(config=None), ValueError, "needs `config`"),
        (dict(config=object()), TypeError, "must be a tpu_estimator.RunConfig"),
        (dict(params={"batch_size": 4}), ValueError, "reserved keys"),
        (dict(params={"context": 1}), ValueError, "reserved keys"),
        (dict(train_batch_size=None), ValueError, "`train_batch_size` cannot be None"),
        (dict(train_batch_size=0), ValueError, "`train_batch_size` must be a positive int"),
        (dict(export_saved_model_api_version=3), ValueError, "must be 1 or 2"),
        (dict(embedding_config_spec=object()), ValueError, "not supported"),
    ],
)
def test_constructor_errors(kwargs, error, match):
    args = dict(config=CFG, train_batch_size=16)
    args.update(kwargs)
    with pytest.raises(error, match=match):
        te.TPUEstimator(mlp_model_fn, **args)


def test_model_fn_arguments_are_checked():
    with pytest.raises(ValueError, match="argument named `features`"):
        te.TPUEstimator(lambda labels, mode: None, config=CFG, train_batch_size=16)
    with pytest.raises(ValueError, match="argument named 'extra'"):
        te.TPUEstimator(lambda features, extra: None, config=CFG, train_batch_size=16)


def test_model_dir_must_agree(tmp_path):
    with pytest.raises(ValueError, match="must be the same"):
        te.TPUEstimator(
            mlp_model_fn, model_dir=str(tmp_path / "a"),
            config=te.RunConfig(model_dir=str(tmp_path / "b")), train_batch_size=16,
        )
    est = te.TPUEstimator(mlp_model_fn, model_dir=str(tmp_path), config=CFG, train_batch_size=16)
    assert est.model_dir == str(tmp_path) == est.config.model_dir
    assert est.eval_dir() == os.path.join(str(tmp_path), "eval")
    assert est.eval_dir("test") == os.path.join(str(tmp_path), "eval_test")


def test_no_model_dir_uses_a_temporary_directory():
    est = te.TPUEstimator(mlp_model_fn, config=CFG, train_batch_size=16)
    assert os.path.isdir(est.model_dir)


def test_params_and_bound_model_fn(tmp_path):
    est = estimator(tmp_path, params={"lr": 0.5})
    assert est.params == {"lr": 0.5}
    assert est.model_fn.keywords == {"params": {"lr": 0.5}}


def test_variables_need_a_checkpoint(tmp_path, data):
    est = estimator(tmp_path)
    assert est.latest_checkpoint() is None
    with pytest.raises(ValueError, match="no checkpoint yet"):
        est.get_variable_names()
    x, y = data
    est.train(batches_fn(x, y), steps=4)
    assert est.get_variable_names() == [
        "Dense_0/bias", "Dense_0/kernel", "Dense_1/bias", "Dense_1/kernel", "global_step",
    ]
    assert est.get_variable_value("Dense_0/kernel").shape == (8, 16)
    with pytest.raises(ValueError, match="Unknown variable name"):
        est.get_variable_value("nope")
