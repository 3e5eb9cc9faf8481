"""Early stopping: stop training when an evaluated metric stops improving (as tf.estimator).

The hooks read what `evaluate()` records in `eval_dir` (`eval_results.jsonl`,
see `summary/eval_results.py`), so they work with `train_and_evaluate`, or
with evaluations run by another process on the same model_dir.
"""

from __future__ import annotations

import logging
import operator
from typing import Any, Callable, Protocol

from tpu_estimator.api.checks import message
from tpu_estimator.hooks.cadence import Cadence
from tpu_estimator.api.session_run_hook import RunContext, SessionRunHook, SessionRunValues
from tpu_estimator.paths import as_uri
from tpu_estimator.summary.eval_results import read_eval_results

class Evaluating(Protocol):
    """The estimator as these hooks read it: where its evaluations are recorded."""

    def eval_dir(self, name: str | None = None) -> str: ...


log = logging.getLogger("tpu_estimator")


class _StopOnPredicateHook(SessionRunHook):
    def __init__(self, should_stop_fn: Callable[[], bool], run_every_secs: float | None, run_every_steps: int | None) -> None:
        if not callable(should_stop_fn):
            raise TypeError(message("`should_stop_fn` must be callable.", f"should_stop_fn={should_stop_fn!r}"))
        self._fn = should_stop_fn
        self._timer = Cadence.exactly_one(run_every_steps, run_every_secs, who="early stopping", names=("run_every_steps", "run_every_secs"))

    def after_run(self, run_context: RunContext, run_values: SessionRunValues) -> None:
        step = run_values.global_step or 0
        if self._timer.due(step):
            self._timer.mark(step)
            if self._fn():
                run_context.request_stop()


def make_early_stopping_hook(
    estimator: object,
    should_stop_fn: Callable[[], bool],
    run_every_secs: float | None = 60,
    run_every_steps: int | None = None,
) -> SessionRunHook:
    """A hook that requests a stop when `should_stop_fn()` returns True (checked every
    `run_every_secs` seconds or `run_every_steps` steps; set the other to None)."""
    if run_every_steps is not None and run_every_secs == 60:
        run_every_secs = None
    return _StopOnPredicateHook(should_stop_fn, run_every_secs, run_every_steps)


def _metric(results: dict[str, Any], name: str, eval_dir: str) -> float:
    if name not in results:
        raise ValueError(
            message(
                f"Early stopping watches metric {name!r}, which evaluate() did not report.",
                f"metrics in {eval_dir}: {sorted(results)}",
            )
        )
    return float(results[name])


def _no_improvement_fn(estimator, metric_name, max_steps, eval_dir, min_steps, better):
    eval_dir = as_uri(eval_dir or estimator.eval_dir(), arg="eval_dir")

    def should_stop() -> bool:
        best, best_step = None, None
        for step, results in read_eval_results(eval_dir).items():
            if step < min_steps:
                continue
            value = _metric(results, metric_name, eval_dir)
            if best is None or better(value, best):
                best, best_step = value, step
            if step - best_step >= max_steps:
                log.info(
                    "Early stopping: %s has not improved on %.6g (step %d) for %d steps.",
                    metric_name, best, best_step, step - best_step,
                )
                return True
        return False

    return should_stop


def _threshold_fn(estimator, metric_name, threshold, eval_dir, min_steps, beyond):
    eval_dir = as_uri(eval_dir or estimator.eval_dir(), arg="eval_dir")

    def should_stop() -> bool:
        for step, results in read_eval_results(eval_dir).items():
            if step >= min_steps and beyond(_metric(results, metric_name, eval_dir), threshold):
                log.info("Early stopping: %s passed %s at step %d.", metric_name, threshold, step)
                return True
        return False

    return should_stop


def stop_if_no_increase_hook(
    estimator: Evaluating,
    metric_name: str,
    max_steps_without_increase: int,
    eval_dir: str | None = None,
    min_steps: int = 0,
    run_every_secs: float | None = 60,
    run_every_steps: int | None = None,
) -> SessionRunHook:
    """Stops training when `metric_name` has not increased for `max_steps_without_increase`
    global steps, judged over the evaluations recorded in `eval_dir` (default
    `estimator.eval_dir()`) at steps >= `min_steps`.

    Example:
      >>> hook = stop_if_no_increase_hook(est, 'accuracy', 1000, run_every_steps=100,
      ...                                 run_every_secs=None)
    """
    fn = _no_improvement_fn(estimator, metric_name, max_steps_without_increase, eval_dir, min_steps, operator.gt)
    return make_early_stopping_hook(estimator, fn, run_every_secs, run_every_steps)


def stop_if_no_decrease_hook(
    estimator: Evaluating,
    metric_name: str,
    max_steps_without_decrease: int,
    eval_dir: str | None = None,
    min_steps: int = 0,
    run_every_secs: float | None = 60,
    run_every_steps: int | None = None,
) -> SessionRunHook:
    """Stops training when `metric_name` (e.g. `'loss'`) has not decreased for
    `max_steps_without_decrease` global steps (see `stop_if_no_increase_hook`)."""
    fn = _no_improvement_fn(estimator, metric_name, max_steps_without_decrease, eval_dir, min_steps, operator.lt)
    return make_early_stopping_hook(estimator, fn, run_every_secs, run_every_steps)


def stop_if_higher_hook(
    estimator: Evaluating, metric_name: str, threshold: float, eval_dir: str | None = None,
    min_steps: int = 0, run_every_secs: float | None = 60, run_every_steps: int | None = None,
) -> SessionRunHook:
    """Stops training once an evaluation reports `metric_name` > `threshold`."""
    fn = _threshold_fn(estimator, metric_name, threshold, eval_dir, min_steps, operator.gt)
    return make_early_stopping_hook(estimator, fn, run_every_secs, run_every_steps)


def stop_if_lower_hook(
    estimator: Evaluating, metric_name: str, threshold: float, eval_dir: str | None = None,
    min_steps: int = 0, run_every_secs: float | None = 60, run_every_steps: int | None = None,
) -> SessionRunHook:
    """Stops training once an evaluation reports `metric_name` < `threshold`."""
    fn = _threshold_fn(estimator, metric_name, threshold, eval_dir, min_steps, operator.lt)
    return make_early_stopping_hook(estimator, fn, run_every_secs, run_every_steps)
