"""`NanTensorHook`: what to do when the training loss becomes NaN or infinite."""

from __future__ import annotations

import logging
from typing import Iterable

import numpy as np

from tpu_estimator.api.session_run_hook import (
    RunContext,
    SessionRunArgs,
    SessionRunHook,
    SessionRunValues,
)
from tpu_estimator.errors import NanLossDuringTrainingError

log = logging.getLogger("tpu_estimator")


class NanTensorHook(SessionRunHook):
    """Stops training when the loss (or another fetched scalar) is NaN or infinite.

    `train()` already raises `NanLossDuringTrainingError` on a non-finite
    loss, naming the step; the last good checkpoint is kept. This hook
    changes that: with `fail_on_nan_loss=False` the engine hands the
    non-finite loss to the hooks instead of raising, this hook logs a warning
    and requests a stop, and training ends *without* saving the diverged
    state (the last good checkpoint stays the latest). With
    `fail_on_nan_loss=True` (the default) it raises, as `train()` would.

    Args:
      loss_tensor: Name of the value to watch: `'loss'`, or a scalar recorded
        with `tpu_estimator.summary.scalar` in model_fn.
      fail_on_nan_loss: Raise (True) or warn and stop (False).

    Example:
      >>> est.train(input_fn, max_steps=1000,
      ...           hooks=[NanTensorHook('loss', fail_on_nan_loss=False)])
    """

    def __init__(self, loss_tensor: str = "loss", fail_on_nan_loss: bool = True) -> None:
        if not isinstance(loss_tensor, str):
            raise TypeError(
                "NanTensorHook: `loss_tensor` must be the name of a step output, e.g. 'loss'. "
                f"Received: loss_tensor={type(loss_tensor).__name__}."
            )
        self.loss_tensor = loss_tensor
        self.fail_on_nan_loss = bool(fail_on_nan_loss)

    @property
    def handles_non_finite_loss(self) -> bool:
        """True when the engine should hand a non-finite loss to the hooks instead of raising."""
        return not self.fail_on_nan_loss

    def before_run(self, run_context: RunContext) -> SessionRunArgs:
        return SessionRunArgs(self.loss_tensor)

    def after_run(self, run_context: RunContext, run_values: SessionRunValues) -> None:
        value = run_values.results
        if np.all(np.isfinite(np.asarray(value, np.float64))):
            return
        text = (
            f"Model diverged with {self.loss_tensor} = {value} in the loop that ended at global "
            f"step {run_values.global_step}."
        )
        if self.fail_on_nan_loss:
            raise NanLossDuringTrainingError(text + " The last checkpoint is kept.")
        log.warning("%s Stopping training; the last good checkpoint is kept.", text)
        run_context.request_stop()


def handles_non_finite_loss(hooks: Iterable[SessionRunHook]) -> bool:
    """Whether some hook turns a non-finite loss into warn-and-stop (see `NanTensorHook`)."""
    return any(getattr(h, "handles_non_finite_loss", False) for h in hooks)
