"""`LoggingTensorHook`: logs named step outputs every N steps or T seconds."""

from __future__ import annotations

import logging
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from tpu_estimator.api.checks import message
from tpu_estimator.hooks.cadence import Cadence
from tpu_estimator.api.session_run_hook import (
    RunContext,
    Session,
    SessionRunArgs,
    SessionRunHook,
    SessionRunValues,
)

log = logging.getLogger("tpu_estimator")


class LoggingTensorHook(SessionRunHook):
    """Logs values the step outputs, by name, at INFO level on the `tpu_estimator` logger.

    Names: `'loss'`, `'global_step'`, and every scalar that model_fn records
    with `tpu_estimator.summary.scalar`. Values are those of the last step
    of the loop (hooks run at loop boundaries).

    Args:
      tensors: A list of names, or a dict of tag -> name.
      every_n_iter: Log every this many global steps (checked at loop ends).
      every_n_secs: Or every this many seconds. Give one, unless `at_end`.
      at_end: Also log the last values when training ends.
      formatter: Optional `formatter(dict tag -> value) -> str`.

    Raises:
      ValueError: no or both periods without `at_end`, or a period <= 0.

    Example:
      >>> LoggingTensorHook({'loss': 'loss', 'mean': 'logits_mean'}, every_n_iter=100)
    """

    def __init__(
        self,
        tensors: Sequence[str] | Mapping[str, str],
        every_n_iter: int | None = None,
        every_n_secs: float | None = None,
        at_end: bool = False,
        formatter: Callable[[dict[str, Any]], str] | None = None,
    ) -> None:
        if isinstance(tensors, str):
            tensors = [tensors]
        if not isinstance(tensors, Mapping):
            tensors = {name: name for name in tensors}
        self._tensors = dict(tensors)
        self._tags = list(self._tensors)
        self._timer = None
        if not at_end or every_n_iter is not None or every_n_secs is not None:
            self._timer = Cadence.exactly_one(
                every_n_iter, every_n_secs, who="LoggingTensorHook", names=("every_n_iter", "every_n_secs")
            )
        if formatter is not None and not callable(formatter):
            raise TypeError(message("LoggingTensorHook: `formatter` must be callable.", f"formatter={formatter!r}"))
        self._at_end = at_end
        self._formatter = formatter
        self._last: dict[str, Any] | None = None

    def before_run(self, run_context: RunContext) -> SessionRunArgs:
        return SessionRunArgs(self._tensors)

    def after_run(self, run_context: RunContext, run_values: SessionRunValues) -> None:
        self._last = run_values.results
        step = run_values.global_step or 0
        if self._timer is not None and self._timer.due(step):
            self._timer.mark(step)
            self._log(self._last)

    def end(self, session: Session) -> None:
        if self._at_end and self._last is not None:
            self._log(self._last)

    def _log(self, values: dict[str, Any]) -> None:
        if self._formatter is not None:
            log.info(self._formatter(values))
        else:
            log.info(", ".join(f"{tag} = {_fmt(values[tag])}" for tag in self._tags))


def _fmt(value: Any) -> str:
    arr = np.asarray(value)
    return f"{arr.item():.6g}" if arr.ndim == 0 and np.issubdtype(arr.dtype, np.floating) else str(value)
