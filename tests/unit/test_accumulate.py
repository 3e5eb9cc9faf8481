"""Gradient accumulation in train_step (loops/accumulate.py), without the estimator.

k micro-batches give the k=1 step's update on the same batch; the loss is the mean of
the micro-batches'; batch_stats are updated micro-batch after micro-batch; host_call
tensors are concatenated; summaries' scalars averaged; remat leaves the results as they are.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import tpu_estimator as te
from tpu_estimator.loops.accumulate import micro_batch_size
from tpu_estimator.loops.train import init_program, step_program, train_step
from tpu_estimator.model.call import check_model_fn
from tpu_estimator.model.module import bind_model
from tpu_estimator.parallel.collectives import single_replica
from tpu_estimator.parallel.mesh import Topology
from unit_toy import TRAIN_VIEW, host_call_fn

BATCH = 16
MOMENTUM = 0.5  # of the batch norm's running statistics


def bn_model_fn(features, labels, mode, params):
    """BatchNorm (running statistics) -> Dense -> MSE; a host_call tensor and a summary."""
    x = nn.BatchNorm(use_running_average=False, momentum=MOMENTUM)(features["x"])
    pred = nn.Dense(1)(nn.tanh(nn.Dense(8)(x)))[:, 0]
    loss = jnp.mean((pred - labels) ** 2)
    te.summary.scalar("pred_mean", pred.mean())
    return te.TPUEstimatorSpec(mode, loss=loss, train_op=optax.sgd(0.1, momentum=0.9), host_call=(host_call_fn, [pred]))


def _model(k: int = 1, remat: str | None = None):
    model = bind_model(bn_model_fn, check_model_fn(bn_model_fn), te.ModeKeys.TRAIN, {}, None, BATCH // k)
    return dataclasses.replace(model, accumulation_steps=k, remat_policy=remat)


@pytest.fixture(scope="module")
def batch():
    rng = np.random.RandomState(0)
    x = (rng.randn(BATCH, 4) * np.arange(1, BATCH + 1)[:, None] / 4).astype(np.float32)  # micro-batches differ
    return {"x": jnp.asarray(x)}, jnp.asarray(rng.randn(BATCH).astype(np.float32))


@pytest.fixture(scope="module")
def state0(batch):
    features, labels = batch
    return init_program(_model(), TRAIN_VIEW, Topology.create(use_tpu=False), 3, True)(
        {"x": features["x"][:4]}, labels[:4]
    )


def _steps(model, state, batch, n=2):
    step = jax.jit(lambda s, b: train_step(model, TRAIN_VIEW, s, b))
    outs = []
    with single_replica():
        for _ in range(n):
            state, out = step(state, batch)
            outs.append(out)
    return state, outs


@pytest.fixture(scope="module")
def one_big(state0, batch):
    return _steps(_model(1), state0, batch)


def test_micro_batches_give_the_big_steps_gradients(batch):
    """On a model without BatchNorm (which normalises each micro-batch by its own statistics,
    so that its k=4 update is not the big batch's): k=4 micro-batches' mean gradient is the
    batch's, through two Adam steps."""

    def mse_model_fn(features, labels, mode, params):
        pred = nn.Dense(1)(nn.tanh(nn.Dense(8)(features["x"])))[:, 0]
        return te.TPUEstimatorSpec(mode, loss=jnp.mean((pred - labels) ** 2), train_op=optax.adam(0.01))

    def model(k):
        m = bind_model(mse_model_fn, check_model_fn(mse_model_fn), te.ModeKeys.TRAIN, {}, None, BATCH // k)
        return dataclasses.replace(m, accumulation_steps=k)

    features, labels = batch
    s0 = init_program(model(1), TRAIN_VIEW, Topology.create(use_tpu=False), 3, True)(features, labels)
    big, big_outs = _steps(model(1), s0, batch)
    small, small_outs = _steps(model(4), s0, batch)
    assert int(small.step) == int(big.step) == 2  # one update per step
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6), small.params, big.params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6), small.opt_state, big.opt_state)
    # the loss of equal micro-batches' mean squared errors is the batch's
    np.testing.assert_allclose(small_outs[0]["loss"], big_outs[0]["loss"], rtol=1e-6)


def test_loss_is_the_mean_of_the_micro_batches_and_stats_are_sequential(state0, batch):
    k = 4
    m = BATCH // k
    state, outs = _steps(_model(k), state0, batch, n=1)
    features, labels = batch
    x = np.asarray(features["x"])
    # running mean: updated once per micro-batch, in order
    mean = np.asarray(state0.collections["batch_stats"]["BatchNorm_0"]["mean"])
    for j in range(k):
        mean = MOMENTUM * mean + (1 - MOMENTUM) * x[j * m:(j + 1) * m].mean(0)
    np.testing.assert_allclose(state.collections["batch_stats"]["BatchNorm_0"]["mean"], mean, rtol=1e-5)
    # loss: each micro-batch's loss with the same (step-0) parameters, averaged
    model1 = _model(1)
    losses = []
    for j in range(k):
        micro = ({"x": features["x"][j * m:(j + 1) * m]}, labels[j * m:(j + 1) * m])
        spec, _ = model1.apply(state0.variables, *micro, rng=jax.random.PRNGKey(0), mutable=["batch_stats"])
        losses.append(float(spec.loss))
    np.testing.assert_allclose(outs[0]["loss"], np.mean(losses), rtol=1e-5)
    # host_call: the micro-batches' tensors concatenated (the whole batch); summaries averaged
    preds = outs[0]["host_call"][0]
    assert preds.shape == (BATCH,)
    np.testing.assert_allclose(outs[0]["summaries"]["scalar"]["pred_mean"], preds.mean(), rtol=1e-5)


@pytest.mark.parametrize("remat", ["full", "dots_saveable"])
def test_remat_leaves_the_results_as_they_are(state0, batch, one_big, remat):
    big, big_outs = one_big
    state, outs = _steps(_model(1, remat), state0, batch)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), state.params, big.params)
    np.testing.assert_allclose(outs[1]["loss"], big_outs[1]["loss"], rtol=1e-6)


def test_an_indivisible_batch_names_the_setting():
    assert micro_batch_size(12, 4) == 3
    with pytest.raises(ValueError, match=r"gradient_accumulation_steps=5 with a per-replica batch of 12.*\[1, 2, 3, 4, 6, 12\]"):
        micro_batch_size(12, 5)


def test_micro_batches_lower_the_steps_scratch_memory():
    """XLA's memory analysis of the compiled step (the measure of benchmarks/step_memory.py):
    activations dominate this model, so k=4 needs well under half of k=1's scratch memory."""

    def wide_model_fn(features, labels, mode, params):
        x = features["x"]
        for _ in range(4):
            x = x + nn.LayerNorm()(nn.gelu(nn.Dense(128)(x)))
        return te.TPUEstimatorSpec(mode, loss=jnp.mean((x[:, 0] - labels) ** 2), train_op=optax.sgd(0.1))

    def temp(k):
        m = bind_model(wide_model_fn, check_model_fn(wide_model_fn), te.ModeKeys.TRAIN, {}, None, 512 // k)
        m = dataclasses.replace(m, accumulation_steps=k)
        batch = ({"x": np.zeros((512, 128), np.float32)}, np.zeros((512,), np.float32))
        topology = Topology.create(use_tpu=False)
        state = jax.eval_shape(init_program(m, TRAIN_VIEW, topology, 0, True), *batch)
        return step_program(m, TRAIN_VIEW, topology).lower(state, batch).compile().memory_analysis().temp_size_in_bytes

    assert temp(4) < 0.5 * temp(1)
