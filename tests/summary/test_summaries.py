"""Summaries from model_fn, automatic training scalars, eval summaries and host_call writers,
read back with TensorBoard's own EventAccumulator."""

from __future__ import annotations

import json
import os

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import tpu_estimator as te

LOGGED: dict = {}


def model_fn(features, labels, mode, params):
    h = nn.Dense(8)(features["x"])
    te.summary.scalar("h_mean", h.mean())
    te.summary.histogram("h", h)
    te.summary.image("img", jnp.ones((2, 4, 4, 1)) * 0.5)
    logits = nn.Dense(2)(nn.relu(h))
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    if mode == te.ModeKeys.EVAL:
        return te.TPUEstimatorSpec(mode, loss=loss)
    tx = optax.inject_hyperparams(optax.sgd)(learning_rate=optax.linear_schedule(0.1, 0.0, 6))
    host_call = (host_fn, {"step": jnp.zeros((h.shape[0],), jnp.int32) + 0, "m": jnp.broadcast_to(h.mean(), (h.shape[0],))})
    return te.TPUEstimatorSpec(mode, loss=loss, train_op=tx, host_call=host_call)


def host_fn(step, m):
    LOGGED.setdefault("calls", 0)
    LOGGED["calls"] += 1
    w = te.summary.create_file_writer(os.path.join(LOGGED["dir"], "host"))
    w.scalar("host/m", float(np.mean(m)), LOGGED["calls"])


def input_fn(params):
    rng = np.random.default_rng(0)
    for _ in range(20):
        x = rng.normal(size=(params["batch_size"], 4)).astype(np.float32)
        yield {"x": x}, (x[:, 0] > 0).astype(np.int32)


class LossRecorder(te.SessionRunHook):
    def __init__(self):
        self.seen = {}

    def before_run(self, run_context):
        return te.SessionRunArgs(["loss", "h_mean"])

    def after_run(self, run_context, run_values):
        self.seen[run_values.global_step] = run_values.results


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("summaries"))
    LOGGED["dir"] = d
    cfg = te.RunConfig(model_dir=d, tpu_config=te.TPUConfig(iterations_per_loop=3),
                       save_summary_steps=2, log_step_count_steps=3)
    est = te.TPUEstimator(model_fn, config=cfg, train_batch_size=16, eval_batch_size=16)
    rec = LossRecorder()
    est.train(input_fn, max_steps=6, hooks=[rec])
    acc = EventAccumulator(d, size_guidance={"scalars": 0, "histograms": 0, "images": 0})
    acc.Reload()
    return est, acc, rec


def steps_values(acc, tag):
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_model_fn_summaries_written_every_save_summary_steps(trained):
    est, acc, rec = trained
    tags = acc.Tags()
    assert {"loss", "h_mean", "learning_rate", "global_step/sec", "examples/sec"} <= set(tags["scalars"])
    assert [s for s, _ in steps_values(acc, "h_mean")] == [2, 4, 6]
    assert [s for s, _ in steps_values(acc, "loss")] == [2, 4, 6]
    # values are those of the step: the last step of each loop matches what hooks received
    assert dict(steps_values(acc, "loss"))[6] == pytest.approx(rec.seen[6][0], rel=1e-6)
    assert dict(steps_values(acc, "h_mean"))[6] == pytest.approx(rec.seen[6][1], rel=1e-6)
    hist = acc.Histograms("h")
    assert [h.step for h in hist] == [2, 4, 6]
    assert hist[0].histogram_value.num == 16 * 8  # gathered from all 8 replicas
    assert tags["images"] == ["img/image/0", "img/image/1"]
    assert [i.step for i in acc.Images("img/image/0")] == [2, 4, 6]


def test_automatic_rate_and_learning_rate(trained):
    est, acc, rec = trained
    lr = steps_values(acc, "learning_rate")
    assert [s for s, _ in lr] == [3, 6]
    assert lr[0][1] == pytest.approx(0.1 * (1 - 2 / 6))  # the rate used by the loop's last step
    rates = steps_values(acc, "global_step/sec")
    assert [s for s, _ in rates] == [3, 6] and all(v > 0 for _, v in rates)
    assert steps_values(acc, "examples/sec")[1][1] == pytest.approx(16 * rates[1][1], rel=1e-5)


def test_host_call_file_writer(trained):
    acc = EventAccumulator(os.path.join(LOGGED["dir"], "host"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("host/m")] == list(range(1, 7))  # once per step


def test_eval_summaries_and_results_log(trained):
    est, _, _ = trained
    results = est.evaluate(input_fn, steps=2, name="val")  # summary.* calls are no-ops in EVAL
    acc = EventAccumulator(est.eval_dir("val"))
    acc.Reload()
    assert steps_values(acc, "loss") == [(6, pytest.approx(results["loss"], rel=1e-6))]
    with open(os.path.join(est.eval_dir("val"), "eval_results.jsonl")) as f:
        row = json.loads(f.readline())
    assert row["global_step"] == 6 and row["loss"] == pytest.approx(results["loss"])


def test_summary_errors_and_noop_outside_training():
    te.summary.scalar("x", 1.0)  # outside a compiled training step: nothing happens
    with pytest.raises(ValueError, match="exactly one element"):
        te.summary.scalar("x", jnp.ones(3))
    with pytest.raises(ValueError, match=r"\[N, H, W, C\]"):
        te.summary.image("x", jnp.ones((4, 4)))
    with pytest.raises(TypeError, match="non-empty str name"):
        te.summary.histogram("", jnp.ones(3))
