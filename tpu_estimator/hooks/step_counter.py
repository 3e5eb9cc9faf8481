"""`StepCounterHook`: writes `global_step/sec` and `examples/sec` summaries."""

from __future__ import annotations

import logging
from tpu_estimator.hooks.cadence import Cadence
from tpu_estimator.api.session_run_hook import RunContext, Session, SessionRunHook, SessionRunValues
from tpu_estimator.summary.writer import FileWriter, create_file_writer

log = logging.getLogger("tpu_estimator")


class StepCounterHook(SessionRunHook):
    """Measures training speed; writes it as summaries (`train()` already writes the same
    tags to `model_dir` every `log_step_count_steps` steps: use this hook for another
    cadence or `output_dir`).

    Args:
      every_n_steps: Measure every this many global steps (checked at loop ends).
      every_n_secs: Or every this many seconds (give one).
      output_dir: Directory of the event files (default: the estimator's model_dir).
      summary_writer: A `tpu_estimator.summary.FileWriter` to use instead.
      batch_size: Examples per step for `examples/sec` (default: the estimator's
        train_batch_size; no `examples/sec` if unknown).
    """

    def __init__(
        self,
        every_n_steps: int | None = 100,
        every_n_secs: float | None = None,
        output_dir: str | None = None,
        summary_writer: FileWriter | None = None,
        batch_size: int | None = None,
    ) -> None:
        if every_n_secs is not None and every_n_steps == 100:
            every_n_steps = None
        self._timer = Cadence.exactly_one(every_n_steps, every_n_secs, who="StepCounterHook")
        self._output_dir = output_dir
        self._writer = summary_writer
        self._batch_size = batch_size

    def after_create_session(self, session: Session, coord: None) -> None:
        if self._writer is None:
            self._writer = create_file_writer(self._output_dir or session.model_dir)
        if self._batch_size is None:
            self._batch_size = (getattr(session, "batch_sizes", None) or {}).get("train")

    def after_run(self, run_context: RunContext, run_values: SessionRunValues) -> None:
        step = run_values.global_step or 0
        if not self._timer.due(step):
            return
        secs, steps = self._timer.mark(step)
        if secs and steps:
            rate = steps / secs
            self._writer.scalar("global_step/sec", rate, step)
            if self._batch_size:
                self._writer.scalar("examples/sec", rate * self._batch_size, step)
            log.debug("global_step/sec: %.4g", rate)

    def end(self, session: Session) -> None:
        if self._writer is not None:
            self._writer.flush()
