"""Fixtures of the hook tests."""

from __future__ import annotations

import pytest

import tpu_estimator as te
from tests.hooks.hook_model import model_fn


@pytest.fixture(scope="module")
def est(tmp_path_factory):
    cfg = te.RunConfig(
        model_dir=str(tmp_path_factory.mktemp("hooks")),
        tpu_config=te.TPUConfig(iterations_per_loop=2),
        save_checkpoints_steps=2,
        save_summary_steps=2,
        log_step_count_steps=None,
    )
    return te.TPUEstimator(model_fn, config=cfg, train_batch_size=16, eval_batch_size=16, predict_batch_size=16)
