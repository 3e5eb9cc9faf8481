"""Flax NNX layers in a model_fn, through Flax's public bridge (`flax.nnx.bridge.to_linen`).

model_fn builds an NNX module inline as it builds linen layers; its `nnx.Param`s
are the `params` collection (trained, named `<module name>/<attribute path>`), its
`nnx.BatchStat`s the `batch_stats` collection (averaged over replicas after each
step, as linen's), and its `nnx.Rngs` streams draw from the step's per-replica key.
Train, evaluate, predict and export behave as with linen layers: 8 devices equal
1 device, the export serves predict()'s answers, dropout draws new masks each step.
"""

from __future__ import annotations

import numpy as np
import optax
import pytest
from flax import nnx
from flax.nnx import bridge

import tpu_estimator as te
from tests.estimator.models import batches_fn, make_data

X, Y = make_data(256)


class MLP(nnx.Module):
    def __init__(self, din: int, dout: int, full: bool, *, rngs: nnx.Rngs) -> None:
        self.l1 = nnx.Linear(din, 16, rngs=rngs)
        self.full = full  # batch norm and dropout (per replica: 8 devices then differ from 1)
        if full:
            self.bn = nnx.BatchNorm(16, rngs=rngs)
            self.drop = nnx.Dropout(0.5, rngs=rngs)
        self.l2 = nnx.Linear(16, dout, rngs=rngs)

    def __call__(self, x, train: bool):
        h = self.l1(x)
        if self.full:
            h = self.drop(nnx.relu(self.bn(h, use_running_average=not train)), deterministic=not train)
        return self.l2(nnx.relu(h) if not self.full else h)


def model_fn(features, labels, mode, params):
    train = mode == te.ModeKeys.TRAIN
    logits = bridge.to_linen(MLP, X.shape[1], 3, params["full"], name="mlp")(features["x"], train)
    if mode == te.ModeKeys.PREDICT:
        return te.TPUEstimatorSpec(mode, predictions={"logits": logits})
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    if train:
        return te.TPUEstimatorSpec(mode, loss=loss, train_op=optax.sgd(params["lr"]))
    return te.TPUEstimatorSpec(mode, loss=loss)


def make(model_dir, use_tpu=True, lr=0.1, full=True, ipl=4):
    config = te.RunConfig(model_dir=str(model_dir), tf_random_seed=0, tpu_config=te.TPUConfig(ipl))
    return te.TPUEstimator(model_fn, config=config, params={"lr": lr, "full": full}, use_tpu=use_tpu,
                           train_batch_size=32, eval_batch_size=32, predict_batch_size=32)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = {}
    for name, use_tpu, full in (("full", True, True), ("eight", True, False), ("one", False, False)):
        est = make(tmp_path_factory.mktemp(name), use_tpu, full=full)
        est.train(batches_fn(X, Y, repeat=5), steps=8)
        out[name] = est
    return out


def test_nnx_state_maps_to_params_and_batch_stats(runs):
    names = runs["full"].get_variable_names()
    assert names == [
        "batch_stats/mlp/bn/mean", "batch_stats/mlp/bn/var", "global_step", "mlp/bn/bias", "mlp/bn/scale",
        "mlp/l1/bias", "mlp/l1/kernel", "mlp/l2/bias", "mlp/l2/kernel",
    ]
    assert not np.allclose(runs["full"].get_variable_value("batch_stats/mlp/bn/mean"), 0.0)  # updated
    assert runs["one"].get_variable_names() == ["global_step", "mlp/l1/bias", "mlp/l1/kernel", "mlp/l2/bias",
                                                "mlp/l2/kernel"]


def test_eight_devices_equal_one_in_train_evaluate_and_predict(runs):
    eight, one = runs["eight"], runs["one"]
    for name in eight.get_variable_names():
        np.testing.assert_allclose(eight.get_variable_value(name), one.get_variable_value(name),
                                   rtol=2e-4, atol=2e-5, err_msg=name)
    e8, e1 = eight.evaluate(batches_fn(X, Y)), one.evaluate(batches_fn(X, Y))
    np.testing.assert_allclose(e8["loss"], e1["loss"], rtol=1e-4)
    p8 = np.stack([p["logits"] for p in eight.predict(batches_fn(X[:40], None))])
    p1 = np.stack([p["logits"] for p in one.predict(batches_fn(X[:40], None))])
    np.testing.assert_allclose(p8, p1, rtol=1e-4, atol=1e-5)


def test_export_serves_predicts_answers(runs, tmp_path):
    est = runs["full"]

    def receiver():
        spec = te.TensorSpec((None, X.shape[1]), np.float32)
        return te.ServingInputReceiver({"x": spec}, {"x": spec})

    served = te.load_exported(est.export_saved_model(str(tmp_path), receiver)).signatures["serving_default"](x=X[:40])
    predicted = np.stack([p["logits"] for p in est.predict(batches_fn(X[:40], None))])
    np.testing.assert_allclose(np.asarray(served["logits"]), predicted, rtol=1e-4, atol=1e-5)


def test_dropout_draws_new_masks_each_step(tmp_path):
    """With learning rate 0 only dropout's masks change the loss from step to step."""
    losses = []

    class Losses(te.SessionRunHook):
        def before_run(self, run_context):
            return te.SessionRunArgs(["loss"])

        def after_run(self, run_context, run_values):
            losses.append(float(run_values.results[0]))

    one_batch = batches_fn(X[:32], Y[:32], repeat=8)
    est = make(tmp_path, use_tpu=False, lr=0.0, ipl=1)
    est.train(one_batch, steps=4, hooks=[Losses()])
    assert len(set(losses)) == len(losses) == 4, losses
