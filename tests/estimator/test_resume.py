"""Checkpoints: a fresh estimator resumes bit-identically, input position included."""

from __future__ import annotations

import os

import flax.linen as nn
import grain
import numpy as np
import optax

import tpu_estimator as te
from tests.estimator.models import N_CLASSES, estimator


def _model_fn(features, labels, mode, params):
    h = nn.Dropout(0.2, deterministic=mode != te.ModeKeys.TRAIN)(features["x"])
    logits = nn.Dense(N_CLASSES)(nn.relu(nn.Dense(16)(h)))
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    return te.TPUEstimatorSpec(mode, loss=loss, train_op=optax.adam(1e-2))


def _grain_input_fn(x, y):
    def input_fn(params):
        return (
            grain.MapDataset.range(len(x))
            .shuffle(seed=3)
            .repeat()
            .batch(params["batch_size"])
            .map(lambda idx: ({"x": x[idx]}, y[idx]))
            .to_iter_dataset()
        )

    return input_fn


def test_killed_and_resumed_run_matches_an_uninterrupted_one(tmp_path, data):
    x, y = data
    inp = _grain_input_fn(x, y)
    whole = estimator(tmp_path / "whole", model_fn=_model_fn).train(inp, max_steps=40)
    estimator(tmp_path / "parts", model_fn=_model_fn).train(inp, max_steps=20)
    resumed = estimator(tmp_path / "parts", model_fn=_model_fn)  # a new process would do the same
    assert resumed.latest_checkpoint().endswith(os.sep + "20")
    resumed.train(inp, max_steps=40)
    for name in whole.get_variable_names():
        np.testing.assert_array_equal(whole.get_variable_value(name), resumed.get_variable_value(name))


def test_checkpoints_every_n_steps_keep_the_newest(tmp_path, data):
    x, y = data
    est = estimator(tmp_path, model_fn=_model_fn, ipl=2, ckpt_steps=4)
    est.train(_grain_input_fn(x, y), max_steps=12)
    steps = sorted(int(d) for d in os.listdir(tmp_path) if d.isdigit())
    assert steps == [0, 4, 8, 12]
    assert est.get_variable_value("global_step") == 12


def test_saving_listeners_are_called_around_each_save(tmp_path, data):
    x, y = data
    calls = []

    class Listener(te.CheckpointSaverListener):
        def begin(self):
            calls.append("begin")

        def before_save(self, session, step):
            calls.append(("before", step))

        def after_save(self, session, step):
            calls.append(("after", step))
            return step >= 4  # asks training to stop

        def end(self, session, step):
            calls.append(("end", step))

    est = estimator(tmp_path, model_fn=_model_fn, ipl=2, ckpt_steps=2)
    est.train(_grain_input_fn(x, y), max_steps=20, saving_listeners=[Listener()])
    assert calls == [
        "begin", ("before", 0), ("after", 0), ("before", 2), ("after", 2),
        ("before", 4), ("after", 4), ("end", 4),
    ]
