"""Progress bars for train/evaluate/predict (forced on, rendered into a buffer) and their switches."""

from __future__ import annotations

import io
import itertools

import pytest
from tests.hooks.hook_model import input_fn
from rich.console import Console

import tpu_estimator as te
from tpu_estimator.estimator import progress


@pytest.fixture
def bars(monkeypatch):
    buf = io.StringIO()
    monkeypatch.setattr(progress, "_console", lambda: Console(file=buf, force_terminal=True, width=120))
    te.set_progress(True)
    yield buf
    te.set_progress(None)


def test_bars_for_train_evaluate_predict(est, bars):
    est.train(input_fn, max_steps=4)
    est.evaluate(input_fn, steps=3)
    list(itertools.islice(est.predict(lambda params: ({"x": x} for (x, _) in itertools.islice(
        ((f["x"], l) for f, l in input_fn(params)), 2)), yield_single_examples=False), 2))
    out = bars.getvalue()
    assert "train" in out and "4/4" in out and "loss" in out and "steps/s" in out
    assert "eval" in out and "3/3" in out
    assert "predict" in out


def test_switches(monkeypatch):
    te.set_progress(None)
    monkeypatch.setenv("TPU_ESTIMATOR_PROGRESS", "0")
    assert not progress.enabled()
    monkeypatch.delenv("TPU_ESTIMATOR_PROGRESS")
    monkeypatch.setattr(progress.sys, "stderr", io.StringIO())  # not a terminal
    assert not progress.enabled()
    te.set_progress(False)
    assert progress.hooks_for("train", 10) == []
    te.set_progress(None)
