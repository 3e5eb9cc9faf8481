"""The original's small contracts: the optimizer starts from the parameters training starts
from, a listener sees each saved step once, evaluate() of another run's checkpoint."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import tpu_estimator as te
from tests.final_state import FinalState
from tests.estimator.models import batches_fn, estimator, mlp_model_fn


def pull_to_init() -> optax.GradientTransformation:
    """An optimizer whose state holds parameter values (like an EMA or schedule-free's `z`):
    it remembers the parameters it was initialised with and moves the parameters back to them."""

    def init(params):
        return jax.tree.map(jnp.copy, params)

    def update(grads, state, params):
        return jax.tree.map(lambda s, p: s - p, state, params), state

    return optax.GradientTransformation(init, update)


def sevens(variables):
    """A Scaffold init_fn: the first Dense kernel set to 7.0."""
    params = jax.tree.map(np.asarray, variables["params"])
    params["Dense_0"]["kernel"] = np.full_like(params["Dense_0"]["kernel"], 7.0)
    return {**variables, "params": params}


def remembering_model_fn(features, labels, mode, params):
    logits = nn.Dense(3)(nn.relu(nn.Dense(4)(features["x"])))
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    scaffold_fn = (lambda: te.Scaffold(init_fn=sevens)) if params.get("scaffold") else None
    return te.TPUEstimatorSpec(mode, loss=loss, train_op=pull_to_init(), scaffold_fn=scaffold_fn)


def test_optimizer_state_is_built_from_the_scaffold_parameters(tmp_path, data):
    x, y = data
    est = estimator(tmp_path, model_fn=remembering_model_fn, params={"scaffold": True}, ipl=1)
    hook = FinalState()
    est.train(batches_fn(x, y), steps=2, hooks=[hook])
    kernel = np.asarray(jax.device_get(hook.state.params["Dense_0"]["kernel"]))
    np.testing.assert_array_equal(kernel, 7.0)  # the optimizer pulled back to 7.0, not to random
    np.testing.assert_array_equal(np.asarray(hook.state.opt_state["Dense_0"]["kernel"]), 7.0)


def test_optimizer_state_is_built_from_the_warm_started_parameters(tmp_path, data):
    x, y = data
    source = estimator(tmp_path / "source", ipl=1)  # mlp_model_fn: Dense(16), Dense(3) on 8 features
    source.train(batches_fn(x, y), steps=3)
    want = source.get_variable_value("Dense_0/kernel")

    def model_fn(features, labels, mode, params):
        spec = mlp_model_fn(features, labels, mode, params)
        return spec._replace(train_op=pull_to_init()) if mode == te.ModeKeys.TRAIN else spec

    est = estimator(tmp_path / "warm", model_fn=model_fn, warm_start_from=str(tmp_path / "source"), ipl=1)
    hook = FinalState()
    est.train(batches_fn(x, y), steps=2, hooks=[hook])
    np.testing.assert_allclose(np.asarray(hook.state.params["Dense_0"]["kernel"]), want, rtol=1e-6)


class Saves(te.CheckpointSaverListener):
    def __init__(self):
        self.steps = []
        self.ended = None

    def after_save(self, session, global_step_value):
        self.steps.append(global_step_value)

    def end(self, session, global_step_value):
        self.ended = global_step_value


def test_checkpoint_saver_hook_listener_sees_each_saved_step_once(tmp_path, data):
    x, y = data
    listener = Saves()
    est = estimator(tmp_path, ipl=1)
    hook = te.CheckpointSaverHook(str(tmp_path), save_steps=3, listeners=[listener])
    est.train(batches_fn(x, y), steps=7, hooks=[hook])
    assert listener.steps == [1, 4, 7] and listener.ended == 7


def test_train_listener_sees_each_saved_step_once(tmp_path, data):
    x, y = data
    listener = Saves()
    est = estimator(tmp_path, ipl=2, ckpt_steps=4)
    est.train(batches_fn(x, y), steps=7, saving_listeners=[listener])
    assert listener.steps == [0, 4, 7] and listener.ended == 7
    est.train(batches_fn(x, y), steps=2, saving_listeners=[listener])  # resumes: step 7 is not saved again
    assert listener.steps == [0, 4, 7, 9]


def test_evaluate_reads_another_runs_checkpoint(tmp_path, data):
    x, y = data
    trained = estimator(tmp_path / "trained", ckpt_steps=4)
    trained.train(batches_fn(x, y), steps=8)
    first = trained.latest_checkpoint().rsplit("/", 1)[0] + "/4"
    expected = trained.evaluate(batches_fn(x[:64], y[:64]), checkpoint_path=first)
    other = estimator(tmp_path / "other")  # the same model, no checkpoint of its own
    got = other.evaluate(batches_fn(x[:64], y[:64]), checkpoint_path=first)
    assert got["global_step"] == 4 and got == pytest.approx(expected)
    assert other.latest_checkpoint() is None  # reading it wrote nothing into the other model_dir
    predictions = list(other.predict(batches_fn(x[:8], None), checkpoint_path=first))
    assert len(predictions) == 8


def test_checkpoint_path_that_is_no_checkpoint_is_an_error(tmp_path, data):
    x, y = data
    with pytest.raises(ValueError, match="checkpoint_path.*<model_dir>/<step>"):
        estimator(tmp_path).evaluate(batches_fn(x[:16], y[:16]), checkpoint_path=str(tmp_path / "nope"))
