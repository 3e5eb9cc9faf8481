"""examples/transformer_lm.py runs as a program (--quick): a decoder-only transformer written as
a model_fn trains on 8 fake devices (perplexity falls from about the vocabulary size towards the
language's 2), evaluates, exports, and the model server's next tokens equal predict()'s."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import numpy as np
import pytest

import tpu_estimator as te

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "transformer_lm.py"


@pytest.fixture(scope="module")
def lm():
    spec = importlib.util.spec_from_file_location("transformer_lm", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def out(lm, tmp_path_factory):
    return lm.run(["--quick", "--model_dir", str(tmp_path_factory.mktemp("lm"))])


def test_perplexity_falls_towards_the_languages(lm, out):
    before, after = lm.perplexity(out["before"]), lm.perplexity(out["after"])
    assert before > 0.7 * out["size"].vocab, before  # untrained: about uniform over the vocabulary
    assert after < 0.25 * before and after > 2.0 - 1e-3, (before, after)  # 2: two successors per token
    assert out["after"]["global_step"] == out["steps"]


def test_predictions_are_the_languages_successors_and_the_server_agrees(out):
    allowed = (out["predicted"][:, None] == out["allowed"]).any(1)
    assert allowed.sum() >= 6, (out["predicted"], out["allowed"])
    assert out["agree"]
    exported = te.load_exported(out["export_dir"]).signatures["serving_default"](tokens=out["tokens"])
    np.testing.assert_array_equal(np.asarray(exported["next_token"]), out["predicted"])


def test_the_parameter_count_of_the_benchmark_size(lm):
    assert 100e6 < lm.SIZES["100m"].parameters < 120e6
