"""`ProfilerHook`: a JAX profiler trace of some training steps, for TensorBoard's profile tab."""

from __future__ import annotations

import logging
import jax

from tpu_estimator.api.checks import is_int, message
from tpu_estimator.hooks.cadence import global_step_of
from tpu_estimator.api.session_run_hook import RunContext, Session, SessionRunHook, SessionRunValues

log = logging.getLogger("tpu_estimator")


class ProfilerHook(SessionRunHook):
    """Traces the loops that run global steps `start_step`..`end_step` with `jax.profiler`.

    The trace starts at the first loop boundary at or after `start_step` and
    stops at the first one at or after `end_step` (or when training ends), so
    it covers whole loops. It is written to `output_dir/plugins/profile/<run>/`
    (default output_dir: model_dir), where TensorBoard's profile plugin
    (`pip install tensorboard-plugin-profile`) finds it.

    Args:
      start_step: First global step to trace (skip the first loop to leave out
        compilation).
      end_step: Last global step to trace.
      output_dir: Where to write the trace (default: the estimator's model_dir).

    Raises:
      ValueError: if not 0 <= start_step < end_step.

    Example:
      >>> est.train(input_fn, max_steps=1000, hooks=[ProfilerHook(100, 200)])
    """

    def __init__(self, start_step: int = 1, end_step: int | None = None, output_dir: str | None = None) -> None:
        end_step = start_step + 1 if end_step is None else end_step
        if not (is_int(start_step) and is_int(end_step) and 0 <= start_step < end_step):
            raise ValueError(
                message(
                    "ProfilerHook needs ints 0 <= start_step < end_step.",
                    f"start_step={start_step!r}, end_step={end_step!r}",
                )
            )
        self.start_step, self.end_step = start_step, end_step
        self.output_dir = output_dir
        self._step = 0
        self._tracing = False
        self._done = False

    def after_create_session(self, session: Session, coord: None) -> None:
        self._step = global_step_of(session)
        self.output_dir = self.output_dir or session.model_dir

    def before_run(self, run_context: RunContext) -> None:
        if not self._tracing and not self._done and self._step >= self.start_step - 1:
            jax.profiler.start_trace(self.output_dir)
            self._tracing = True
        return None

    def after_run(self, run_context: RunContext, run_values: SessionRunValues) -> None:
        self._step = run_values.global_step or self._step
        if self._tracing and self._step >= self.end_step:
            self._stop()

    def end(self, session: Session) -> None:
        if self._tracing:
            self._stop()

    def _stop(self) -> None:
        jax.profiler.stop_trace()
        self._tracing, self._done = False, True
        log.info("Wrote a profiler trace to %s/plugins/profile.", self.output_dir)
