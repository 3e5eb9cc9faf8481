"""`checkpoints_iterator` on gs:// (the GCS emulator of conftest.py): a model_dir that does not
exist yet, its newest checkpoint first, a new one once, then the timeout."""

from __future__ import annotations

import os
import sys

import pytest

import tpu_estimator as te
from tpu_estimator.checkpoint import iterator as iterator_module

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "checkpoint"))
from iterator_helpers import save_steps  # noqa: E402


@pytest.fixture(autouse=True)
def fast_poll(monkeypatch):
    monkeypatch.setattr(iterator_module, "POLL_SECONDS", 0.1)


def test_checkpoints_iterator_on_gcs(gs_dir):
    model_dir = f"{gs_dir}/run"
    it = te.checkpoints_iterator(model_dir, timeout=0.5)
    save_steps(model_dir, 1, 2)
    assert next(it) == f"{model_dir}/2"
    save_steps(model_dir, 3)
    assert next(it) == f"{model_dir}/3"
    assert list(it) == []  # no new one within the timeout
