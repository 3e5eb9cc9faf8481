"""The docstring examples (`>>>`) that run without training, a file system or a cluster.

Left out, as illustrative: estimator/{tpu_estimator,exporters,train_and_evaluate}.py
(need a trained estimator), export/loader.py, checkpoint/reader.py, summary/writer.py,
serving/server.py (need files), parallel/distributed.py (joins a cluster), and the
hooks whose examples call `est.train(...)` or need a model_dir.
"""

from __future__ import annotations

import contextlib
import doctest
import importlib
import io

import pytest

MODULES = [
    "tpu_estimator.api.export_output",
    "tpu_estimator.api.run_config",
    "tpu_estimator.api.scaffold",
    "tpu_estimator.api.serving_input",
    "tpu_estimator.api.session_run_hook",
    "tpu_estimator.api.spec",
    "tpu_estimator.api.tpu_config",
    "tpu_estimator.checkpoint.warm_start",
    "tpu_estimator.export.inference",
    "tpu_estimator.export.receivers",
    "tpu_estimator.feeding.device",
    "tpu_estimator.hooks.cadence",
    "tpu_estimator.hooks.listener",
    "tpu_estimator.loops.compiles",
    "tpu_estimator.loops.strategy",
    "tpu_estimator.estimator.preemption",
    "tpu_estimator.metrics._accuracy",
    "tpu_estimator.metrics._auc",
    "tpu_estimator.metrics._base",
    "tpu_estimator.metrics._confusion",
    "tpu_estimator.metrics._iou",
    "tpu_estimator.metrics._mean",
    "tpu_estimator.metrics._regression",
    "tpu_estimator.parallel.input_context",
    "tpu_estimator.summary.collect",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = doctest.testmod(
            module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, report=False
        )
    assert result.attempted > 0, f"{name} has no runnable examples left"
    assert result.failed == 0, out.getvalue()
