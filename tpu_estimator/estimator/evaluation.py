"""The host side of `evaluate()`: runs eval loops, merges metrics exactly.

Batches run in loops of about `iterations_per_loop` (estimator/inference.py:
on-device programs over chunks of a loop, or queued per-batch programs, with the host
merging loop L while the devices run loop L+1), driven by the loop engine
(estimator/engine.py); this module is the policy: what a loop's outputs mean. Full batches run the model as
written; the loss of a batch is the mean of the replicas' losses. A padded
final batch runs per example (see `loops/evaluate.py`) and its padding rows
are dropped, so the loss and every metric count each real example once.

A SIGTERM stops it at the next loop boundary (on several processes, the same
one everywhere) with `PreemptedError`: no metrics recorded (estimator/preemption.py).
"""

from __future__ import annotations

import itertools
import logging
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import jax
import numpy as np

from tpu_estimator.api.checks import message
from tpu_estimator.api.mode_keys import ModeKeys
from tpu_estimator.estimator import hook_runner, inference, liveness, preemption, progress
from tpu_estimator.estimator.engine import Done, Engine, HostCall
from tpu_estimator.feeding.lockstep import real_rows
from tpu_estimator.metrics import Metric, merge_stacked
from tpu_estimator.parallel.distributed import lost_host_timeout_s
from tpu_estimator.paths import join
from tpu_estimator.summary.eval_results import record_eval

if TYPE_CHECKING:
    from tpu_estimator.estimator.core import Core

log = logging.getLogger("tpu_estimator")

_RESERVED = ("loss", "global_step")


def eval_dir(model_dir: str, name: str | None = None) -> str:
    """`model_dir/eval` or `model_dir/eval_<name>`: where evaluation summaries go."""
    return join(model_dir, "eval" if not name else f"eval_{name}")


def evaluate(
    core: "Core",
    input_fn: Any,
    *,
    steps: int | None,
    hooks: Sequence[Any] | None,
    checkpoint_path: str | None,
    name: str | None,
) -> dict[str, Any]:
    """Implements `TPUEstimator.evaluate` (see there)."""
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps <= 0):
        raise ValueError(message("Must specify steps > 0.", f"steps={steps!r}"))
    hooks = hook_runner.check_hooks(hooks, "hooks")
    liveness.watch_hosts(lost_host_timeout_s(core.config.cluster))
    try:
        return _evaluate(core, input_fn, steps, hooks, checkpoint_path, name)
    except Exception as e:
        liveness.raise_if_lost(e)  # a collective failed because a process is gone: say which
        raise


def _evaluate(core: "Core", input_fn: Any, steps: int | None, hooks: list[Any], checkpoint_path: str | None,
              name: str | None) -> dict[str, Any]:
    ref = core.find_checkpoint(checkpoint_path)
    runtime = core.runtime(ModeKeys.EVAL)
    batches, _ = core.open_input(runtime, input_fn)
    first = next(batches, None)
    if first is None:
        raise ValueError(message("evaluate() needs at least one batch of input.", "an empty input_fn"))
    state = core.state_for(runtime, first, batches.axes, ref, train=False)
    all_hooks = [*hooks, *runtime.spec.hooks, *progress.hooks_for("eval", steps)]
    global_step = int(jax.device_get(state.step))
    size = inference.loop_size(core.config.tpu_config.iterations_per_loop_parsed)
    plan = inference.InferencePlan(core.loop_strategy.inference, size, first, lambda b: b.tree, core.topology,
                                   batches.axes)
    acc = _Accumulator(runtime)
    inputs = itertools.islice(itertools.chain([first], batches), steps)
    with preemption.Watch(redeliver=True) as watch, inference.feed(inputs, first, plan) as loops:
        engine = Engine(core, all_hooks, watch)
        policy = _Evaluation(
            acc, engine, runtime.program, {"single": "eval", "loop": "eval_scan", "padded": "eval_examples"},
            (runtime.program_variables(state), state.step, state.rng), k=plan.k, global_step=global_step,
        )
        for _ in engine.run(loops, policy):
            pass  # the policy merged the loop; the engine ran its hooks
    results = acc.results()
    results["global_step"] = global_step
    engine.end()
    record_eval(eval_dir(core.model_dir, name), global_step, results)  # process 0: event file + eval_results.jsonl
    log.info("Evaluation at step %d: %s", global_step, results)
    return results


class _Evaluation(inference.InferencePolicy):
    """evaluate()'s policy: each loop's outputs merged into the running loss and metrics."""

    call = "evaluate()"

    def __init__(self, acc: "_Accumulator", *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.acc = acc

    def read(self, queued: inference.Dispatched) -> Done:
        """Merges the loop; metric_fn on the host (when it does not trace) is its host calls."""
        calls = [call for fetched in self.fetch(queued) for call in self.acc.add(fetched)]
        self.batches += queued.num_steps
        values = {"loss": self.acc.loss_so_far(), "global_step": self.global_step, "batches": self.batches}
        return Done(values, self.global_step, host_calls=calls)


def _flat(state: Any, lead: int) -> Any:
    """`state` with its first `lead` axes (loop steps, replicas) made one."""
    return jax.tree.map(lambda x: np.reshape(x, (-1, *np.shape(x)[lead:])), state)


class _Accumulator:
    """Running loss and merged metric states over batches."""

    def __init__(self, runtime: Any) -> None:
        self.runtime = runtime
        self.loss_sum = 0.0
        self.count = 0
        self.states: dict[str, Metric] = {}

    def add(self, fetched: inference.Program) -> list[HostCall]:
        """Adds one program's outputs (one batch, or a loop's batches stacked); returns the
        host calls of metric_fn that merge the rest, per batch, in order."""
        if not fetched.stacked and fetched.steps[0].padded:
            return self._add_padded(fetched.steps[0], fetched.out)
        out, lead = fetched.out, 1 if fetched.stacked else 0
        rows = np.array([s.counts.sum() for s in fetched.steps], np.float64)  # full batches
        losses = np.asarray(out["loss"], np.float64).mean(axis=-1)  # each batch: mean over replicas
        self.loss_sum += float(np.sum(losses * rows))
        self.count += int(rows.sum())
        self._merge({k: merge_stacked(_flat(v, lead + 1)) for k, v in out["ops"].items()})
        if "states" in out:  # metric_fn ran in the program
            self._merge({k: merge_stacked(v) if lead else v for k, v in out["states"].items()})
            return []
        return self._metric_fn(jax.tree.map(np.asarray, one["tensors"]) for _, one in fetched.per_step())

    def _add_padded(self, step: inference.Step, out: dict[str, Any]) -> list[HostCall]:
        """A padded batch's per-example outputs: only the real rows count."""
        real = real_rows(step.counts, step.size)
        self.loss_sum += float(np.asarray(out["loss"], np.float64)[real].sum())
        self.count += int(real.sum())
        self._merge({k: merge_stacked(jax.tree.map(lambda x: np.asarray(x)[real], v)) for k, v in out["ops"].items()})
        return self._metric_fn([jax.tree.map(lambda x: np.asarray(x)[real], out["tensors"])])

    def _metric_fn(self, batches: Iterable[Any]) -> list[HostCall]:
        """metric_fn on the host, on each batch's tensors in `batches` (none, and `batches`
        not read, without one)."""
        metric_fn = self.runtime.spec.metric_fn
        if metric_fn is None:
            return []
        return [HostCall(metric_fn, tensors, then=self._merge_metric_fn) for tensors in batches]

    def _merge_metric_fn(self, got: Any) -> None:
        """What metric_fn returned for one batch: a dict of metric states, merged."""
        if not isinstance(got, dict):
            raise TypeError(
                message(
                    "metric_fn must return a dict of metric name -> tpu_estimator.metrics state.",
                    f"{type(got).__name__}",
                    "Return e.g. {'accuracy': metrics.accuracy(labels, predictions)}.",
                )
            )
        self._merge(got)

    def _merge(self, states: dict[str, Any]) -> None:
        for k, v in states.items():
            if k in _RESERVED:
                raise ValueError(
                    message(
                        f"A metric may not be named {k!r}: evaluate() reports it itself.",
                        f"metric name {k!r}",
                        "Rename the metric.",
                    )
                )
            if not isinstance(v, Metric):
                raise TypeError(
                    message(
                        "Each metric must be a tpu_estimator.metrics state (e.g. "
                        "metrics.accuracy(labels, predictions)).",
                        f"metric {k!r} of type {type(v).__name__}",
                        "Wrap a plain value with metrics.mean(value).",
                    )
                )
            self.states[k] = self.states[k].merge(v) if k in self.states else v

    def loss_so_far(self) -> float:
        return self.loss_sum / max(self.count, 1)

    def results(self) -> dict[str, Any]:
        out = {k: v.compute() for k, v in self.states.items()}
        out["loss"] = self.loss_so_far()
        return out
