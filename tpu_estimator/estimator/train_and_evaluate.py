"""`train_and_evaluate`: alternate training and evaluation on one machine, then export.

Training runs in rounds. A round ends after `EvalSpec.every_n_steps` steps,
or (without it) at the first loop boundary `throttle_secs` after it began;
then the latest checkpoint is evaluated and the exporters run. It ends when
`TrainSpec.max_steps` is reached, or when training stops by itself (input
exhausted, or a hook such as `stop_if_no_decrease_hook` asked), after a final
evaluation and export. Each round calls `train()` again, which calls
`input_fn` again: it resumes its position if the pipeline is checkpointable
(grain), otherwise it starts over.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Callable, Sequence

from tpu_estimator.paths import join as path_join
from tpu_estimator.api.checks import message
from tpu_estimator.api.keywords import suggest_keywords
from tpu_estimator.estimator.exporters import Exporter
from tpu_estimator.api.session_run_hook import SessionRunHook

log = logging.getLogger("tpu_estimator")


@suggest_keywords
@dataclasses.dataclass(frozen=True)
class TrainSpec:
    """What `train_and_evaluate` trains: `input_fn`, up to `max_steps` (None: until the input
    ends), with `hooks` and `saving_listeners`."""

    input_fn: Callable[..., Any]
    max_steps: int | None = None
    hooks: Sequence[Any] = ()
    saving_listeners: Sequence[Any] = ()

    def __post_init__(self) -> None:
        if not callable(self.input_fn):
            raise TypeError(message("TrainSpec: `input_fn` must be callable.", f"input_fn={self.input_fn!r}"))
        if self.max_steps is not None and (isinstance(self.max_steps, bool) or self.max_steps <= 0):
            raise ValueError(message("TrainSpec: `max_steps` must be > 0 or None.", f"max_steps={self.max_steps!r}"))


@suggest_keywords
@dataclasses.dataclass(frozen=True)
class EvalSpec:
    """How `train_and_evaluate` evaluates.

    Args:
      input_fn: The evaluation input.
      steps: Batches per evaluation (None: the whole input).
      name: Evaluation name (`eval_dir(name)`).
      hooks: Evaluation hooks.
      exporters: An `Exporter` or a list of them, run after each evaluation.
      start_delay_secs: Accepted for compatibility; ignored (one machine).
      throttle_secs: Evaluate at most this often (seconds of training per round).
      every_n_steps: Instead, evaluate every this many training steps.
    """

    input_fn: Callable[..., Any]
    steps: int | None = 100
    name: str | None = None
    hooks: Sequence[Any] = ()
    exporters: Exporter | Sequence[Exporter] = ()
    start_delay_secs: float = 120
    throttle_secs: float = 600
    every_n_steps: int | None = None

    def __post_init__(self) -> None:
        if not callable(self.input_fn):
            raise TypeError(message("EvalSpec: `input_fn` must be callable.", f"input_fn={self.input_fn!r}"))
        exporters = [self.exporters] if isinstance(self.exporters, Exporter) else list(self.exporters or ())
        bad = [type(e).__name__ for e in exporters if not isinstance(e, Exporter)]
        names = [e.name for e in exporters if isinstance(e, Exporter)]
        if bad or len(set(names)) != len(names):
            raise ValueError(
                message("EvalSpec: `exporters` must be Exporters with distinct names.",
                        f"exporters of types {bad} and names {names}")
            )
        object.__setattr__(self, "exporters", tuple(exporters))
        if self.every_n_steps is not None and self.every_n_steps <= 0:
            raise ValueError(message("EvalSpec: `every_n_steps` must be > 0.", f"every_n_steps={self.every_n_steps!r}"))
        if self.throttle_secs is not None and self.throttle_secs < 0:
            raise ValueError(message("EvalSpec: `throttle_secs` must be >= 0.", f"throttle_secs={self.throttle_secs!r}"))


class _StopAfterSecs(SessionRunHook):
    """Ends a training round at the first loop boundary `secs` seconds after it began."""

    def __init__(self, secs: float) -> None:
        self.secs, self.fired, self._t0 = secs, False, 0.0

    def begin(self) -> None:
        self._t0, self.fired = time.monotonic(), False

    def after_run(self, run_context, run_values) -> None:
        if time.monotonic() - self._t0 >= self.secs:
            self.fired = True
            run_context.request_stop()


def _step(est: Any) -> int:
    path = est.latest_checkpoint()
    return int(path.rstrip("/").rsplit("/", 1)[-1]) if path else 0


def train_and_evaluate(estimator: Any, train_spec: TrainSpec, eval_spec: EvalSpec) -> tuple[dict[str, Any] | None, list[str]]:
    """Trains, evaluating and exporting along the way (see the module docstring).

    Returns:
      (the last evaluation's results, the export paths of its exporters). When a
      round's `train()` is preempted (`estimator.preempted`), it returns at once
      with the previous round's results (None if none) and no exports: the
      rerun resumes from the saved step.

    Raises:
      TypeError: if the specs are not a TrainSpec and an EvalSpec.
      PreemptedError: a SIGTERM came during an evaluation (the checkpoint it
        evaluated is saved; nothing of that evaluation or its exports was
        written): exit, and the rerun evaluates it again.

    Example:
      >>> train_and_evaluate(est, TrainSpec(train_input_fn, max_steps=1000),
      ...                    EvalSpec(eval_input_fn, steps=None, every_n_steps=200,
      ...                             exporters=[LatestExporter('latest', receiver_fn)]))
    """
    if not isinstance(train_spec, TrainSpec) or not isinstance(eval_spec, EvalSpec):
        raise TypeError(
            message("train_and_evaluate needs a TrainSpec and an EvalSpec.",
                    f"train_spec={type(train_spec).__name__}, eval_spec={type(eval_spec).__name__}")
        )
    max_steps = train_spec.max_steps
    result: dict[str, Any] | None = None
    exports: list[str] = []
    while True:
        start = _step(estimator)
        if max_steps is not None and start >= max_steps:
            final, done_early = True, False
        else:
            target = max_steps
            hooks = list(train_spec.hooks)
            timer = None
            if eval_spec.every_n_steps is not None:
                target = start + eval_spec.every_n_steps if max_steps is None else min(max_steps, start + eval_spec.every_n_steps)
            elif eval_spec.throttle_secs:
                timer = _StopAfterSecs(eval_spec.throttle_secs)
                hooks.append(timer)
            estimator.train(train_spec.input_fn, max_steps=target, hooks=hooks,
                            saving_listeners=list(train_spec.saving_listeners))
            if getattr(estimator, "preempted", False):  # saved; the rerun continues from here
                log.warning("train_and_evaluate: preempted at step %d; returning without evaluating.",
                            _step(estimator))
                return result, exports
            end = _step(estimator)
            done_early = (target is None or end < target) and not (timer is not None and timer.fired)
            final = done_early or (max_steps is not None and end >= max_steps) or end == start
        if result is not None and result.get("global_step") == _step(estimator):
            break  # already evaluated this checkpoint
        result = estimator.evaluate(eval_spec.input_fn, steps=eval_spec.steps, hooks=list(eval_spec.hooks),
                                    name=eval_spec.name)
        exports = []
        for exporter in eval_spec.exporters:
            path = exporter.export(estimator, path_join(estimator.model_dir, "export", exporter.name),
                                   estimator.latest_checkpoint(), result, final)
            if path is not None:
                exports.append(path)
        if final:
            break
    return result, exports
