"""Loop strategies: "scan", "step" and "auto" train alike; how "step" loops are fed."""

from __future__ import annotations

import numpy as np
import pytest

import tpu_estimator as te
from tests.estimator.models import batches_fn, compiled_programs, estimator
from tpu_estimator.loops.compiles import count_compiles
from tests.estimator.test_train import StepRecorder


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data):
    """24 steps in loops of 4 with each strategy: (estimator, hook steps, compiled programs)."""
    x, y = data
    out = {}
    for strategy in ("scan", "step", "auto"):
        hook = StepRecorder()
        tpu = te.TPUConfig(iterations_per_loop=4, loop_strategy=strategy)
        est = estimator(tmp_path_factory.mktemp(strategy), tpu_config=tpu)
        with count_compiles() as compiles:
            est.train(batches_fn(x, y), steps=24, hooks=[hook])
        out[strategy] = (est, hook.steps, compiled_programs(compiles.names))
    return out


@pytest.mark.parametrize("strategy", ["step", "auto"])
def test_every_strategy_trains_like_scan(trained, strategy):
    scan, scan_steps, _ = trained["scan"]
    est, steps, _ = trained[strategy]
    assert steps == scan_steps == [4, 8, 12, 16, 20, 24]
    for name in scan.get_variable_names():
        np.testing.assert_allclose(
            est.get_variable_value(name), scan.get_variable_value(name), rtol=1e-5, atol=1e-6
        )


def test_step_strategy_never_builds_the_scan_program(trained):
    _, _, programs = trained["step"]
    assert "train_one_step" in programs and "train_scan" not in programs


def test_auto_decides_before_the_first_loop_from_the_model(tmp_path, data, trained, caplog):
    """The dense test model has no convolution: "auto" scans on XLA:CPU from the first loop,
    decided once (logged once), compiling one scan program and never a step program."""
    x, y = data
    tpu = te.TPUConfig(iterations_per_loop=4, loop_strategy="auto")
    est = estimator(tmp_path, tpu_config=tpu)
    assert est.loop_strategy == "auto"  # nothing traced yet
    with caplog.at_level("INFO", logger="tpu_estimator"), count_compiles() as compiles:
        est.train(batches_fn(x, y), steps=24)
        est.train(batches_fn(x, y), steps=8)
    assert est.loop_strategy == "scan"
    assert compiled_programs(compiles.names) == {"init_state": 1, "train_scan": 1}
    chosen = [r.getMessage() for r in caplog.records if "loop_strategy='auto' chose" in r.getMessage()]
    assert chosen == ["loop_strategy='auto' chose 'scan': XLA:CPU, no convolutions: iterations_per_loop "
                      "steps in one program."]
    scan, _, _ = trained["scan"]
    est2 = estimator(tmp_path / "again", tpu_config=tpu).train(batches_fn(x, y), steps=24)
    np.testing.assert_allclose(
        est2.get_variable_value("Dense_0/kernel"), scan.get_variable_value("Dense_0/kernel"), rtol=1e-5, atol=1e-6
    )


def test_auto_steps_a_convolution_on_cpu_and_any_model_at_one_iteration(tmp_path, data):
    import flax.linen as nn
    import optax

    def conv_model_fn(features, labels, mode, params):
        h = nn.Conv(2, (3,), name="conv")(features["x"][..., None]).mean(axis=(1, 2))
        loss = ((h - labels) ** 2).mean()
        return te.TPUEstimatorSpec(mode, loss=loss, train_op=optax.sgd(0.1))

    x, y = data
    conv = te.TPUEstimator(conv_model_fn, config=te.RunConfig(
        model_dir=str(tmp_path / "conv"), tpu_config=te.TPUConfig(iterations_per_loop=4)), train_batch_size=16)
    conv.train(batches_fn(x, y), steps=4)
    assert conv.loop_strategy == "step"
    # Evaluation (forward only) on 8 devices loops on the device: its convolutions are not slow in a scan.
    step_eval = te.TPUEstimator(conv_model_fn, config=te.RunConfig(
        model_dir=str(tmp_path / "conv"), tpu_config=te.TPUConfig(iterations_per_loop=4, loop_strategy="step")),
        train_batch_size=16, eval_batch_size=16)
    conv = te.TPUEstimator(conv_model_fn, config=conv.config, train_batch_size=16, eval_batch_size=16)
    with count_compiles() as compiles:
        scanned = conv.evaluate(batches_fn(x, y), steps=5)
    assert "evaluate_loop" in compiled_programs(compiles.names)
    assert (conv.loop_strategy, conv.inference_loop_strategy) == ("step", "scan")
    assert scanned == pytest.approx(step_eval.evaluate(batches_fn(x, y), steps=5), rel=1e-6)
    one = estimator(tmp_path / "one", tpu_config=te.TPUConfig(iterations_per_loop=1))
    one.train(batches_fn(x, y), steps=3)
    assert one.loop_strategy == "step"


def test_the_rule_per_backend():
    from tpu_estimator.loops.strategy import LoopStrategy

    for backend in ("tpu", "gpu"):
        assert LoopStrategy("auto", backend).decide(100, {"conv_general_dilated"}) == "scan"
    cpu_conv = LoopStrategy("auto", "cpu")
    assert cpu_conv.inference == "auto"  # not decided yet
    assert cpu_conv.decide(100, {"conv_general_dilated"}, devices=8) == "step"
    assert cpu_conv.inference == "scan"  # forward only on several devices: one program per loop
    one_device = LoopStrategy("auto", "cpu")
    assert one_device.decide(100, {"conv_general_dilated"}, devices=1) == "step"
    assert one_device.inference == "step"  # one device: a program per batch measured faster
    assert LoopStrategy("auto", "cpu").decide(1, {"dot_general"}) == "step"
    user = LoopStrategy("step", "tpu")
    assert user.decide(100, set()) == "step" and user.inference == "step"  # the user's choice wins


def test_step_loops_are_fed_in_growing_chunks_so_the_first_step_starts_at_once(tmp_path, data, monkeypatch):
    from tpu_estimator.feeding import feeder

    x, y = data
    seen = []
    real_chunks = feeder.chunks

    def recording(*args, **kwargs):
        for chunk in real_chunks(*args, **kwargs):
            seen.append((len(chunk.data), chunk.end_of_loop))
            yield chunk

    monkeypatch.setattr(feeder, "chunks", recording)
    monkeypatch.setattr(feeder, "STEP_CHUNK", 4)
    tpu = te.TPUConfig(iterations_per_loop=8, loop_strategy="step")
    estimator(tmp_path, tpu_config=tpu).train(batches_fn(x, y), steps=20)
    # Loop 1: 1+2+4+1; loop 2: 4+4 (capped at STEP_CHUNK); loop 3 (4 steps): 4.
    assert seen == [(1, False), (2, False), (4, False), (1, True), (4, False), (4, True), (4, True)]
