"""The public names import, and every docstring example runs."""

from __future__ import annotations

import doctest
import importlib
import inspect

import pytest

import tpu_estimator.metrics as metrics

MODULES = ["_base", "_mean", "_accuracy", "_confusion", "_auc", "_regression", "_iou"]


def test_every_public_name_imports_and_is_exported() -> None:
    for name in metrics.__all__:
        assert getattr(metrics, name) is not None
    public = {n for n in vars(metrics) if not n.startswith("_")}
    assert public == set(metrics.__all__)


def test_factories_share_the_tf_signature() -> None:
    for name in ("accuracy", "precision", "recall", "auc", "mean_squared_error",
                 "root_mean_squared_error", "mean_absolute_error", "true_positives",
                 "false_positives", "false_negatives", "true_negatives", "top_k_accuracy",
                 "mean_iou"):
        params = list(inspect.signature(getattr(metrics, name)).parameters)
        assert params[:2] == ["labels", "predictions"] and "weights" in params, name
    assert list(inspect.signature(metrics.mean).parameters) == ["values", "weights"]


@pytest.mark.parametrize("module", MODULES)
def test_docstring_examples_run(module: str) -> None:
    mod = importlib.import_module(f"tpu_estimator.metrics.{module}")
    result = doctest.testmod(mod, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
