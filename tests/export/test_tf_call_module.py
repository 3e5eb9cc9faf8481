"""The StableHLO target of the SavedModel's programs (export/tf_call_module.py), probed in the real TensorFlow.

TensorFlow is in the `test` extra: these run in CI on every Python (never skipped).
"""

import json
import logging
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import export_test_model as tm
import tpu_estimator as te
from tpu_estimator.export import saved_model as tf_sm
from tpu_estimator.export import tf_call_module


def _key(version):
    return tuple(int(p) for p in version.split("."))


def test_candidates_are_newest_first_and_never_newer_than_tensorflows_stablehlo():
    uncapped = tf_call_module.candidates(None)
    assert uncapped == sorted(uncapped, key=_key, reverse=True) and len(uncapped) >= 2
    assert uncapped[-1] == "0.9.0"  # (jaxlib's minimum)
    assert tf_call_module.candidates("1.0.0") == ["1.0.0", "0.9.0"]
    assert tf_call_module.candidates("99.0.0") == uncapped  # (never newer than jax.export's own target)
    reads = tf_call_module.tensorflow_stablehlo_version()
    if reads is not None:  # (TF 2.21 reports 1.13.7)
        assert all(_key(v) <= _key(reads) for v in tf_call_module.candidates(reads))


def _dense_program():
    """Another program than the probe's: a batch-polymorphic matmul, tanh and argmax."""
    (batch,) = jax.export.symbolic_shape("batch")
    w = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
    fn = jax.jit(lambda x: {"h": jnp.tanh(x @ w), "c": jnp.argmax(x @ w, -1)})
    return jax.export.export(fn, platforms=("cpu",))(jax.ShapeDtypeStruct((batch, 4), np.float32))


def test_the_probe_takes_the_newest_target_tensorflow_runs_and_tells_the_truth(monkeypatch):
    """Uncapped (as where TensorFlow does not report its StableHLO), newest first.

    JAX 0.12.0.1 with TF 2.21: 1.18.0 fails ('vhlo.custom_call_v2'), 1.16.3 runs;
    JAX 0.10.2: its own 1.15.0 runs. Each verdict holds for another program.
    """
    monkeypatch.setattr(tf_call_module, "tensorflow_stablehlo_version", lambda: None)
    found = tf_call_module.probe.__wrapped__()  # (not the process's cached answer)
    tried = [*found.failures, found.target]
    assert found.target is not None and found.reason is None
    assert tried == tf_call_module.candidates(None)[:len(tried)]
    exported = _dense_program()
    x = np.random.RandomState(0).randn(5, 4).astype(np.float32)
    want = exported.call(x)
    for version in found.failures:
        with pytest.raises(Exception, match="(?i)deserializ|unregistered"):
            tf_call_module.run_in_tensorflow(exported, version, x)
    got = tf_call_module.run_in_tensorflow(exported, found.target, x)
    np.testing.assert_array_equal(got["c"], want["c"])
    np.testing.assert_allclose(got["h"], want["h"], rtol=1e-6, atol=1e-6)


def test_the_export_uses_the_probed_target_capped_by_tensorflows_stablehlo():
    found = tf_call_module.probe()
    assert found.target == tf_sm.stablehlo_target() and tf_sm.incompatibility() is None
    reads = tf_call_module.tensorflow_stablehlo_version()
    expected = tf_call_module.candidates(reads)
    assert found.target == expected[len(found.failures)]


def test_a_program_newer_than_the_target_cannot_be_reserialized():
    exported = jax.export.export(jax.jit(jax.lax.tan), platforms=("cpu",))(jax.ShapeDtypeStruct((3,), np.float32))
    assert tf_call_module.reserialize(exported.mlir_module_serialized, "1.13.7")  # (tan_v2: StableHLO 1.x)
    with pytest.raises(tf_call_module.TargetTooOld, match=r"uses StableHLO newer than 1\.0\.0"):
        tf_call_module.reserialize(exported.mlir_module_serialized, "1.0.0")


def tan_model_fn(features, labels, mode, params):
    """tm.model_fn's layers (it restores tm's checkpoint) under `tan`, whose StableHLO op is newer than 1.0.0."""
    hidden = nn.relu(nn.Dense(16)(features["x"]))  # (Dense_0 first, as in tm.model_fn)
    logits = nn.Dense(3)(hidden)
    return te.TPUEstimatorSpec(mode, predictions={"y": jax.lax.tan(0.1 * logits)})


def test_a_model_needing_newer_ops_than_tensorflow_reads_gets_no_saved_model_and_a_warning(
    trained_est, tmp_path, monkeypatch, caplog
):
    """As with a TensorFlow that reads StableHLO only up to 1.0.0: the jax.export artifacts still serve."""
    monkeypatch.setattr(tf_sm, "stablehlo_target", lambda: "1.0.0")
    est = tm.estimator(trained_est.model_dir, fn=tan_model_fn)
    with caplog.at_level(logging.WARNING, logger="tpu_estimator"):
        path = os.fsdecode(est.export_saved_model(str(tmp_path), tm.receiver_fn))
    assert "No TensorFlow SavedModel (saved_model.pb) written" in caplog.text
    assert "reads StableHLO up to 1.0.0, and this model needs newer ops" in caplog.text
    assert "Signature 'serving_default' of tag set ['serve']" in caplog.text
    assert not os.path.exists(os.path.join(path, "saved_model.pb"))
    with open(os.path.join(path, "manifest.json")) as f:
        assert json.load(f)["saved_model"] is None
    out = te.load_exported(path).signatures["serving_default"](x=tm.X[:2])
    assert out["y"].shape == (2, 3) and np.isfinite(out["y"]).all()
