"""training_chief_hooks (EstimatorSpec) run after the other hooks, on process 0 only."""

from __future__ import annotations

import flax.linen as nn
import numpy as np
import optax

import tpu_estimator as te

CALLS: list = []


class Named(te.SessionRunHook):
    def __init__(self, name):
        self.name = name

    def after_run(self, run_context, run_values):
        CALLS.append(self.name)


def model_fn(features, labels, mode):
    loss = optax.l2_loss(nn.Dense(1)(features)[:, 0], labels).mean()
    return te.EstimatorSpec(mode, loss=loss, train_op=optax.sgd(0.1),
                            training_hooks=[Named("spec")], training_chief_hooks=[Named("chief")])


def test_chief_hooks_run_last_on_process_0(tmp_path):
    est = te.Estimator(model_fn, model_dir=str(tmp_path))
    data = [(np.ones((4, 2), np.float32), np.ones(4, np.float32))] * 2
    est.train(lambda: iter(data), hooks=[Named("arg")], max_steps=2)
    assert CALLS[:3] == ["arg", "spec", "chief"]
