"""`StopAtStepHook`: stops training at a global step."""

from __future__ import annotations

from tpu_estimator.api.checks import is_int, message
from tpu_estimator.hooks.cadence import global_step_of
from tpu_estimator.api.session_run_hook import RunContext, Session, SessionRunHook, SessionRunValues


class StopAtStepHook(SessionRunHook):
    """Requests a stop once the global step reaches `last_step` (or start + `num_steps`).

    Hooks run at loop boundaries, so training stops at the end of the loop in
    which the step is reached: with `iterations_per_loop=k` it may run up to
    k-1 steps further (`train(max_steps=)` stops exactly).

    Args:
      num_steps: Steps to run after the step training starts from.
      last_step: The global step to stop at. Give exactly one.

    Raises:
      ValueError: neither or both given, or not a positive int.

    Example:
      >>> est.train(input_fn, hooks=[StopAtStepHook(num_steps=100)])
    """

    def __init__(self, num_steps: int | None = None, last_step: int | None = None) -> None:
        if (num_steps is None) == (last_step is None):
            raise ValueError(
                message(
                    "StopAtStepHook needs exactly one of `num_steps` and `last_step`.",
                    f"num_steps={num_steps!r}, last_step={last_step!r}",
                )
            )
        for name, value in (("num_steps", num_steps), ("last_step", last_step)):
            if value is not None and (not is_int(value) or value < 0):
                raise ValueError(message(f"StopAtStepHook: `{name}` must be an int >= 0.", f"{name}={value!r}"))
        self._num_steps = num_steps
        self._last_step = last_step

    @property
    def last_step(self) -> int | None:
        return self._last_step

    def after_create_session(self, session: Session, coord: None) -> None:
        if self._num_steps is not None:
            self._last_step = global_step_of(session) + self._num_steps

    def after_run(self, run_context: RunContext, run_values: SessionRunValues) -> None:
        if self._last_step is not None and (run_values.global_step or 0) >= self._last_step:
            run_context.request_stop()
