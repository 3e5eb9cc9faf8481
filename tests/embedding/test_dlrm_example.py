"""examples/dlrm.py runs as a program (--quick): 26 tables sharded over 8 fake devices train
(AUC above chance and above the untrained model's), evaluate, export, and the model server's
HTTP answers equal predict()'s."""

from __future__ import annotations

import importlib.util
import pathlib

import numpy as np
import pytest

import tpu_estimator as te
from tpu_estimator.export import saved_model

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "dlrm.py"


@pytest.fixture(scope="module")
def dlrm():
    spec = importlib.util.spec_from_file_location("dlrm", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def out(dlrm, tmp_path_factory):
    return dlrm.run(["--quick", "--model_dir", str(tmp_path_factory.mktemp("dlrm"))])


def test_the_model_learns_the_hidden_click_rule(out):
    before, after = out["before"], out["after"]
    assert after["global_step"] == out["steps"]
    assert after["loss"] < before["loss"] - 0.02, (before, after)
    assert after["auc"] > max(before["auc"], 0.6), (before, after)


def test_every_table_reads_back_whole(dlrm, out):
    assert len(out["tables"]) == 26
    for name, vocabulary_size in out["vocab"].items():
        assert out["tables"][name] == (vocabulary_size, dlrm.dimension(vocabulary_size))
    assert max(out["vocab"].values()) == 10_000 and min(out["vocab"].values()) == 10


def test_the_server_answers_as_predict_and_the_export(out):
    assert out["agree"]
    np.testing.assert_allclose(out["served"], out["predicted"], rtol=1e-4, atol=1e-5)
    exported = te.load_exported(out["export_dir"]).signatures["serving_default"](**out["features"])
    np.testing.assert_allclose(np.ravel(exported["probability"]), out["predicted"], rtol=1e-4, atol=1e-5)
    assert 0.0 < out["predicted"].min() and out["predicted"].max() < 1.0


@pytest.mark.xfail(
    saved_model.incompatibility() is not None, strict=True,
    reason=f"TensorFlow runs this JAX's StableHLO at no target: {saved_model.incompatibility()}",
)
def test_the_tensorflow_saved_model_answers_as_predict(out):
    """The SavedModel beside the export (XlaCallModule ops) looks the 26 tables up as predict() did."""
    import tensorflow as tf

    signature = tf.saved_model.load(out["export_dir"], tags=["serve"]).signatures["serving_default"]
    got = signature(**{k: tf.constant(v) for k, v in out["features"].items()})
    np.testing.assert_allclose(got["probability"].numpy(), out["predicted"], rtol=1e-4, atol=1e-5)
