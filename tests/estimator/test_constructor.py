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
        (dict(embedding_config_spec=object()), TypeError, "must be a tpu_estimator.EmbeddingConfigSpec"),
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


def _with_num_shards(model_dir, num_shards, cores=None, use_tpu=True):
    tpu = te.TPUConfig(num_shards=num_shards, num_cores_per_replica=cores)
    return te.TPUEstimator(
        mlp_model_fn, config=te.RunConfig(model_dir=str(model_dir), tpu_config=tpu, log_step_count_steps=None),
        use_tpu=use_tpu, train_batch_size=16,
    )


@pytest.mark.parametrize("num_shards, cores", [(None, None), (8, None), (8, 1), (4, 2), (None, 4)])
def test_num_shards_that_matches_the_devices_is_accepted(tmp_path, num_shards, cores):
    _with_num_shards(tmp_path, num_shards, cores)  # 8 devices: num_shards = 8 / num_cores_per_replica


@pytest.mark.parametrize(
    "num_shards, cores, match",
    [
        (4, None, r"replicas: 8 \(8 devices found / num_cores_per_replica=1\).*"
                  r"Received: num_shards=4 with 8 replicas on 8 devices.*set num_shards=8"),
        (16, None, r"Received: num_shards=16 with 8 replicas on 8 devices.*set num_shards=8"),
        # as in the original, num_shards counts replicas, not devices
        (8, 2, r"replicas: 4 \(8 devices found / num_cores_per_replica=2\).*"
               r"Received: num_shards=8 with 4 replicas on 8 devices.*Leave num_shards=None"),
    ],
)
def test_num_shards_that_disagrees_with_the_devices_is_an_error(tmp_path, num_shards, cores, match):
    with pytest.raises(ValueError, match=match):
        _with_num_shards(tmp_path, num_shards, cores)


def test_num_shards_is_ignored_on_cpu(tmp_path):
    est = _with_num_shards(tmp_path, 4, use_tpu=False)  # one CPU device, as the original ignored it there
    assert est.config.tpu_config.num_shards == 4
