"""Checkpoints written as training writes them (an Orbax step through `Checkpointer`), for
the checkpoints_iterator tests here and on gs:// (tests/cloud)."""

from __future__ import annotations

import numpy as np

from tpu_estimator.checkpoint.manager import Checkpointer


def save_steps(directory: str, *steps: int) -> None:
    """Commits each step (a small state) and waits until it is complete on storage."""
    checkpointer = Checkpointer(directory)
    try:
        for step in steps:
            assert checkpointer.save(step, {"w": np.full((2,), step, np.float32)})
            checkpointer.wait()
    finally:
        checkpointer.close()
