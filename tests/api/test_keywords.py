"""A misspelled keyword argument of a config or the estimator: TypeError with a "did you mean"."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import pickle

import pytest

import tpu_estimator as te
from tpu_estimator.api.keywords import suggest_keywords


def model_fn(features, labels, mode, params):
    raise AssertionError("never called: the keyword check comes first")


CASES = [
    (te.RunConfig, {"model_dri": "runs/x"}, "model_dir"),
    (te.RunConfig, {"save_checkpoint_steps": 10}, "save_checkpoints_steps"),
    (te.TPUConfig, {"iterations_per_loops": 10}, "iterations_per_loop"),
    (te.ClusterConfig, {"num_process": 2}, "num_processes"),
    (lambda **kw: te.TPUEstimator(model_fn, **kw), {"train_batchsize": 8}, "train_batch_size"),
    (lambda **kw: te.TPUEstimator(model_fn, **kw), {"model_dri": "runs/x"}, "model_dir"),
    (lambda **kw: te.Estimator(model_fn, **kw), {"parms": {}}, "params"),
    (lambda **kw: te.TrainSpec(lambda params: [], **kw), {"max_step": 3}, "max_steps"),
    (lambda **kw: te.EvalSpec(lambda params: [], **kw), {"throttle_sec": 3}, "throttle_secs"),
    (lambda **kw: te.WarmStartSettings("runs/x", **kw), {"var_to_warm_start": ".*"}, "vars_to_warm_start"),
    (lambda **kw: te.TableConfig(10, 4, **kw), {"combinr": "sum"}, "combiner"),
    (lambda **kw: te.FeatureConfig("t", **kw), {"max_sequence_len": 2}, "max_sequence_length"),
    (lambda **kw: te.AdagradParameters(0.1, **kw), {"initial_acumulator": 0.1}, "initial_accumulator"),
    (lambda **kw: te.EmbeddingConfigSpec(**kw), {"table_to_config_dic": {}}, "table_to_config_dict"),
]


@pytest.mark.parametrize("make, kwargs, suggestion", CASES)
def test_misspelled_keyword_suggests_the_name(make, kwargs, suggestion):
    (bad, value), = kwargs.items()
    with pytest.raises(TypeError, match=rf"got an unexpected keyword argument '{bad}'\. "
                       rf"Received: {bad}=.*\. Did you mean '{suggestion}'\?"):
        make(**kwargs)


def test_no_close_name_lists_the_keywords():
    with pytest.raises(TypeError, match=r"TPUConfig\(\) got an unexpected keyword argument 'zzz'\. "
                       r"Received: zzz=1\. Its keyword arguments are: iterations_per_loop, num_shards, "):
        te.TPUConfig(zzz=1)


def test_a_long_value_is_shortened_in_the_message():
    with pytest.raises(TypeError) as info:
        te.RunConfig(model_dri="x" * 1000)
    assert len(str(info.value)) < 300


def test_subclass_is_named_by_its_own_name():
    with pytest.raises(TypeError, match=r"^Estimator\(\) got an unexpected keyword argument 'configg'"):
        te.Estimator(model_fn, configg=None)


def test_signature_replace_pickle_and_copy_are_unchanged():
    params = inspect.signature(te.RunConfig).parameters
    assert "model_dir" in params and "tpu_config" in params
    assert list(inspect.signature(te.TPUConfig).parameters)[0] == "iterations_per_loop"
    assert "train_batch_size" in inspect.signature(te.TPUEstimator).parameters
    config = te.RunConfig(model_dir="runs/x", tpu_config=te.TPUConfig(iterations_per_loop=5))
    assert pickle.loads(pickle.dumps(config)) == config
    assert copy.deepcopy(config) == config
    assert dataclasses.replace(config.tpu_config, iterations_per_loop=7).iterations_per_loop == 7
    assert te.TPUConfig(3).iterations_per_loop == 3  # positional arguments pass through


def test_the_decorator_needs_an_own_init():
    class NoInit:
        pass

    with pytest.raises(TypeError, match="suggest_keywords needs a class that defines __init__ itself"):
        suggest_keywords(NoInit)
