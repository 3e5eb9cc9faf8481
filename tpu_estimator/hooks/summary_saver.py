"""`SummarySaverHook`: writes the loss and model_fn scalar summaries on its own cadence."""

from __future__ import annotations

from tpu_estimator.hooks.cadence import Cadence
from tpu_estimator.api.session_run_hook import (
    RunContext,
    Session,
    SessionRunArgs,
    SessionRunHook,
    SessionRunValues,
)
from tpu_estimator.summary.writer import FileWriter, create_file_writer


class SummarySaverHook(SessionRunHook):
    """Writes `loss` and the `summary.scalar` values of model_fn every N steps or T seconds.

    `train()` already writes all summaries to `model_dir` every
    `save_summary_steps` steps; use this hook for another directory or
    cadence. It writes the values of the last step of each loop.

    Args:
      save_steps: Write every this many global steps, or
      save_secs: every this many seconds (give exactly one).
      output_dir: Directory of the event files (default: model_dir).
      summary_writer: A `tpu_estimator.summary.FileWriter` to use instead.
    """

    def __init__(
        self,
        save_steps: int | None = None,
        save_secs: float | None = None,
        output_dir: str | None = None,
        summary_writer: FileWriter | None = None,
    ) -> None:
        self._timer = Cadence.exactly_one(save_steps, save_secs, who="SummarySaverHook", names=("save_steps", "save_secs"))
        self._output_dir = output_dir
        self._writer = summary_writer

    def after_create_session(self, session: Session, coord: None) -> None:
        if self._writer is None:
            self._writer = create_file_writer(self._output_dir or session.model_dir)

    def before_run(self, run_context: RunContext) -> SessionRunArgs:
        return SessionRunArgs({"loss": "loss", "summaries": "summaries"})

    def after_run(self, run_context: RunContext, run_values: SessionRunValues) -> None:
        step = run_values.global_step or 0
        if self._timer.due(step):
            self._timer.mark(step)
            self._writer.scalars(step, {"loss": run_values.results["loss"], **run_values.results["summaries"]})

    def end(self, session: Session) -> None:
        if self._writer is not None:
            self._writer.flush()
