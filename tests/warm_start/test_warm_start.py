"""warm_start_from (directory, checkpoint, WarmStartSettings) and Scaffold.init_fn, through TPUEstimator."""

from __future__ import annotations

import flax.linen as nn
import numpy as np
import optax
import pytest

import tpu_estimator as te
from tpu_estimator.checkpoint.warm_start import WarmStartSettings, warm_start


def set_bias_42(variables):
    """Scaffold.init_fn: runs once after initialisation (no checkpoint yet)."""
    variables["params"]["Dense_0"]["bias"] = np.full_like(variables["params"]["Dense_0"]["bias"], 42.0)
    return variables


def model_fn(features, labels, mode, params):
    h = nn.relu(nn.Dense(4)(features["x"]))
    logits = nn.Dense(2)(h)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    scaffold_fn = (lambda: te.Scaffold(init_fn=set_bias_42)) if params.get("scaffold") else None
    return te.TPUEstimatorSpec(mode, loss=loss, train_op=optax.sgd(params["lr"]), scaffold_fn=scaffold_fn)


def input_fn(params):
    rng = np.random.default_rng(0)
    for _ in range(10):
        x = rng.normal(size=(params["batch_size"], 3)).astype(np.float32)
        yield {"x": x}, (x[:, 0] > 0).astype(np.int32)


def make(tmp, name, **kw):
    cfg = te.RunConfig(model_dir=str(tmp / name), tpu_config=te.TPUConfig(iterations_per_loop=5))
    params = kw.pop("params", {"lr": 0.0})
    return te.TPUEstimator(model_fn, config=cfg, params=params, train_batch_size=16, **kw)


@pytest.fixture(scope="module")
def model_a(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ws")
    a = make(tmp, "a", params={"lr": 0.0, "scaffold": True})
    a.train(input_fn, max_steps=1)
    return tmp, a


def test_scaffold_init_fn_sets_a_variable(model_a):
    _, a = model_a
    np.testing.assert_array_equal(a.get_variable_value("Dense_0/bias"), np.full(4, 42.0))


def test_warm_start_from_model_dir(model_a):
    tmp, a = model_a
    b = make(tmp, "b", warm_start_from=a.model_dir)
    b.train(input_fn, steps=5)
    assert b.get_variable_value("global_step") == 5
    np.testing.assert_array_equal(b.get_variable_value("Dense_0/bias"), np.full(4, 42.0))  # lr 0: as started
    np.testing.assert_array_equal(b.get_variable_value("Dense_1/kernel"), a.get_variable_value("Dense_1/kernel"))


def test_warm_start_settings_from_one_checkpoint_selects_variables(model_a):
    tmp, a = model_a
    ws = WarmStartSettings(a.latest_checkpoint(), vars_to_warm_start="Dense_0/.*")
    c = make(tmp, "c", warm_start_from=ws)
    c.train(input_fn, steps=5)
    np.testing.assert_array_equal(c.get_variable_value("Dense_0/bias"), np.full(4, 42.0))
    np.testing.assert_array_equal(c.get_variable_value("Dense_0/kernel"), a.get_variable_value("Dense_0/kernel"))
    assert c.get_variable_value("Dense_1/bias").tolist() == [0.0, 0.0]  # fresh init, not warm-started


VARS = {"params": {"Dense_0": {"kernel": np.zeros((3, 4)), "bias": np.zeros(4)}},
        "batch_stats": {"BatchNorm_0": {"mean": np.zeros(4)}}}
PREV = {"Dense_0/kernel": np.ones((3, 4)), "Dense_0/bias": np.ones(4), "old/bias": np.full(4, 7.0),
        "batch_stats/BatchNorm_0/mean": np.full(4, 3.0), "wide/kernel": np.ones((5, 4))}


def test_default_is_trainable_only_and_list_selects_any_collection():
    out = warm_start(VARS, WarmStartSettings("x"), PREV)
    assert out["params"]["Dense_0"]["bias"].tolist() == [1.0] * 4
    assert out["batch_stats"]["BatchNorm_0"]["mean"].tolist() == [0.0] * 4
    out = warm_start(VARS, WarmStartSettings("x", ["batch_stats/.*"]), PREV)
    assert out["batch_stats"]["BatchNorm_0"]["mean"].tolist() == [3.0] * 4
    assert out["params"]["Dense_0"]["bias"].tolist() == [0.0] * 4


def test_rename_maps_new_to_old_names():
    ws = WarmStartSettings("x", "Dense_0/bias", {"Dense_0/bias": "old/bias"})
    assert warm_start(VARS, ws, PREV)["params"]["Dense_0"]["bias"].tolist() == [7.0] * 4


def test_errors_list_viable_names():
    with pytest.raises(ValueError, match=r"unused renames \['nope'\].*Dense_0/bias"):
        warm_start(VARS, WarmStartSettings("x", ".*", {"nope": "old/bias"}), PREV)
    with pytest.raises(ValueError, match=r"shape \(3, 4\).*\(5, 4\).*Dense_0/kernel"):
        warm_start(VARS, WarmStartSettings("x", "Dense_0/kernel", {"Dense_0/kernel": "wide/kernel"}), PREV)
    with pytest.raises(ValueError, match="does not have"):
        warm_start(VARS, WarmStartSettings("x"), {"other": np.ones(4)})
    with pytest.raises(TypeError, match="warm_start_from"):
        make(__import__("pathlib").Path("/tmp/te_ws_bad"), "d", warm_start_from=3).train(input_fn, steps=1)
