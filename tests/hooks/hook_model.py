"""A tiny MLP whose model_fn records a summary scalar, for the hook tests (one module object
shared by the fixtures and the tests: SPEC_HOOKS is set by tests)."""

from __future__ import annotations

import flax.linen as nn
import numpy as np
import optax

import tpu_estimator as te

SPEC_HOOKS: list = []  # the spec's training_hooks (set by a test)


def model_fn(features, labels, mode, params):
    h = nn.Dense(8)(features["x"])
    te.summary.scalar("h_mean", h.mean())
    logits = nn.Dense(2)(nn.relu(h))
    if mode == te.ModeKeys.PREDICT:
        return te.TPUEstimatorSpec(mode, predictions={"c": logits.argmax(-1)}, prediction_hooks=list(SPEC_HOOKS))
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    if mode == te.ModeKeys.EVAL:
        return te.TPUEstimatorSpec(mode, loss=loss, evaluation_hooks=list(SPEC_HOOKS))
    return te.TPUEstimatorSpec(mode, loss=loss, train_op=optax.sgd(0.1), training_hooks=list(SPEC_HOOKS))


def input_fn(params, nan_from=None):
    rng = np.random.default_rng(0)
    b = params["batch_size"]
    for i in range(40):
        x = rng.normal(size=(b, 4)).astype(np.float32)
        if nan_from is not None and i >= nan_from:
            x[:] = np.nan
        yield {"x": x}, (x[:, 0] > 0).astype(np.int32)
