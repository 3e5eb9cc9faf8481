"""evaluate() and predict() in loops of iterations_per_loop batches (estimator/inference.py):
one on-device program per loop ("scan") or queued per-batch programs ("step"), exact either way,
on 8 replicas with uneven data; a second call compiles nothing; a hook's stop drops the loop
queued behind it."""

from __future__ import annotations

import numpy as np
import pytest

import tpu_estimator as te
from tests.estimator.models import batches_fn, compiled_programs, estimator
from tpu_estimator.loops.compiles import count_compiles


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data):
    """One model_dir trained once; an estimator per strategy reads it (ipl=4, eval batch 64)."""
    x, y = data
    base = tmp_path_factory.mktemp("loops")
    estimator(base, eval_batch_size=64, predict_batch_size=16).train(batches_fn(x, y), max_steps=8)
    out = {}
    for strategy in ("scan", "step"):
        tpu = te.TPUConfig(iterations_per_loop=4, loop_strategy=strategy)
        out[strategy] = estimator(base, tpu_config=tpu, eval_batch_size=64, predict_batch_size=16)
    return out


def test_both_strategies_evaluate_alike_and_exactly(trained, data):
    x, y = data  # 1,000 examples, batch 64: 15 full batches (3 loops of 4, 3 single) + one of 40
    results = {}
    for strategy, est in trained.items():
        with count_compiles() as first:
            results[strategy] = est.evaluate(batches_fn(x, y))
        with count_compiles() as second:
            assert est.evaluate(batches_fn(x, y)) == results[strategy]
        programs = compiled_programs(first.names)
        if strategy == "scan":
            assert programs == {"evaluate_loop": 1, "evaluate_batch": 1, "evaluate_examples": 1}
        else:
            assert programs == {"evaluate_batch": 1, "evaluate_examples": 1}
        assert compiled_programs(second.names) == {}
    assert results["scan"]["accuracy"] == results["step"]["accuracy"]
    assert results["scan"]["loss"] == pytest.approx(results["step"]["loss"], rel=1e-6)


def test_both_strategies_predict_every_example_in_order(trained, data):
    x, _ = data
    n = 16 * 9 + 5  # 9 full batches (2 loops of 4 and one single) and a padded one
    got = {}
    for strategy, est in trained.items():
        with count_compiles() as compiles:
            got[strategy] = np.stack([p["logits"] for p in est.predict(batches_fn(x[:n], None))])
        if strategy == "scan":
            assert compiled_programs(compiles.names).get("predict_loop", 0) <= 1
    assert got["scan"].shape == (n, 3)
    np.testing.assert_allclose(got["scan"], got["step"], rtol=1e-5, atol=1e-6)


class _StopAfter(te.SessionRunHook):
    """Asks to stop after `n` loops; records the batches done at each after_run."""

    def __init__(self, n: int) -> None:
        self.n, self.seen = n, []

    def before_run(self, run_context):
        return te.SessionRunArgs({"batches": "batches"})

    def after_run(self, run_context, run_values):
        self.seen.append(run_values.results["batches"])
        if len(self.seen) == self.n:
            run_context.request_stop()


@pytest.mark.parametrize("strategy", ["scan", "step"])
def test_a_stop_drops_the_queued_loop(trained, data, strategy):
    """The loop after the stop was already queued: its results are not merged."""
    x, y = data
    est = trained[strategy]
    hook = _StopAfter(2)
    stopped = est.evaluate(batches_fn(x, y), hooks=[hook])
    assert hook.seen == [4, 8]
    assert stopped == est.evaluate(batches_fn(x[: 8 * 64], y[: 8 * 64]))
    hook = _StopAfter(1)
    preds = list(est.predict(batches_fn(x, None), hooks=[hook], yield_single_examples=False))
    assert hook.seen == [4] and len(preds) == 4


def _model_fn_with(metric_fn):
    """The test MLP, its eval_metrics' metric_fn replaced."""
    import optax
    from flax import linen as nn

    def model_fn(features, labels, mode, params):
        logits = nn.Dense(3)(nn.relu(nn.Dense(16)(features["x"])))
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
        if mode == te.ModeKeys.TRAIN:
            return te.TPUEstimatorSpec(mode, loss=loss, train_op=optax.sgd(0.1))
        return te.TPUEstimatorSpec(mode, loss=loss, eval_metrics=(metric_fn, [labels, logits]))

    return model_fn


@pytest.mark.parametrize("strategy", ["scan", "step"])
def test_metric_fn_runs_in_the_program_when_it_traces(tmp_path, data, strategy):
    """A metric_fn of jnp ops runs inside the programs (the host calls it only on the padded
    final batch's real rows); one that needs values (numpy, float()) runs on the host on every
    batch. Both give the same results: metric_fn sees one global batch at a time either way."""
    from tpu_estimator import metrics

    x, y = data  # 1,000 examples, batch 64: 15 full batches and one padded (40 real)
    host_calls = {"traced": 0, "numpy": 0}

    def traced(labels, logits):
        host_calls["traced"] += isinstance(labels, np.ndarray)
        top = logits.max(-1)
        return {"accuracy": metrics.accuracy(labels, logits.argmax(-1)), "top_logit": metrics.mean(top),
                "batch_max": metrics.mean(top.max())}  # a per-batch statistic: batches must stay whole

    def numpy_only(labels, logits):
        host_calls["numpy"] += 1
        labels, logits = np.asarray(labels), np.asarray(logits)
        top = logits.max(-1)
        return {"accuracy": metrics.accuracy(labels, logits.argmax(-1)), "top_logit": metrics.mean(top),
                "batch_max": metrics.mean(float(top.max()))}

    tpu = te.TPUConfig(iterations_per_loop=4, loop_strategy=strategy)
    results = {}
    for name, fn in (("traced", traced), ("numpy", numpy_only)):
        est = estimator(tmp_path, model_fn=_model_fn_with(fn), tpu_config=tpu, eval_batch_size=64)
        if name == "traced":
            est.train(batches_fn(x, y), max_steps=8)
        results[name] = est.evaluate(batches_fn(x, y))
    assert host_calls["traced"] == 1  # the padded batch
    assert host_calls["numpy"] >= 16  # every batch (and tries to trace it that failed)
    assert results["traced"].keys() == results["numpy"].keys()
    for key, value in results["numpy"].items():
        assert results["traced"][key] == pytest.approx(value, rel=1e-6), key


def test_the_device_input_in_flight_is_a_few_chunks_not_a_loop(trained, data, monkeypatch):
    """A long predict loop (40 batches) fed in chunks of 4 batches: the chunks are dispatched
    as they arrive and the queued programs hold at most two chunks of input, so the live
    device input (stacked chunks and single batches) stays at a few chunks, not a loop's 10."""
    import jax

    from tpu_estimator.feeding import feeder

    x = data[0][:992]  # 62 batches of 16; 3 epochs: 4 loops of 40 batches and one of 26
    batch_bytes = 16 * 8 * 4  # predict batch 16 x N_FEATURES float32
    monkeypatch.setattr(feeder, "MAX_CHUNK_BYTES", 4 * batch_bytes)

    def live_input() -> int:
        return sum(a.nbytes for a in jax.live_arrays() if a.dtype == np.float32 and a.shape[-2:] == (16, 8))

    peak = []

    class Sample(te.SessionRunHook):
        def after_run(self, run_context, run_values):
            peak.append(live_input())

    before = live_input()
    tpu = te.TPUConfig(iterations_per_loop=40, loop_strategy="scan")
    est = estimator(trained["scan"].model_dir, tpu_config=tpu, eval_batch_size=64, predict_batch_size=16)
    n = 0
    for preds in est.predict(batches_fn(x, None, repeat=3), hooks=[Sample()], yield_single_examples=False):
        n += len(preds["logits"])
        peak.append(live_input())
    assert n == 3 * len(x)
    chunk = 4 * batch_bytes
    assert max(peak) - before <= 4 * chunk, (max(peak) - before) / chunk  # a loop is 10 chunks
