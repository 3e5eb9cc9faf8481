"""The host side of `predict()`: a generator of predictions in input order.

Batches run in loops of up to `iterations_per_loop` (estimator/inference.py),
driven by the loop engine (estimator/engine.py; this module is the policy):
the caller consumes loop L's predictions while the devices run loop L+1.
A final short batch is padded to the batch size (one compiled program) and
the padding rows are dropped: exactly one prediction per input example.
Closing or abandoning the generator stops the input thread.

While the generator is open (from its first `next()` to its end or close), a
SIGTERM stops it at the next loop boundary (on several processes, the same
one everywhere) with `PreemptedError`; the predictions of that loop are not
handed out (estimator/preemption.py).
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import jax
import numpy as np

from tpu_estimator.api.checks import message
from tpu_estimator.api.mode_keys import ModeKeys
from tpu_estimator.estimator import hook_runner, inference, liveness, preemption, progress
from tpu_estimator.estimator.engine import Done, Engine
from tpu_estimator.parallel.distributed import lost_host_timeout_s

if TYPE_CHECKING:
    from tpu_estimator.estimator.core import Core


def predict(
    core: "Core",
    input_fn: Any,
    *,
    predict_keys: Sequence[str] | None,
    hooks: Sequence[Any] | None,
    checkpoint_path: str | None,
    yield_single_examples: bool,
) -> Iterator[Any]:
    """Implements `TPUEstimator.predict` (see there). Checks arguments before the first `next()`."""
    hooks = hook_runner.check_hooks(hooks, "hooks")
    if predict_keys is not None:
        if isinstance(predict_keys, str):
            predict_keys = [predict_keys]
        predict_keys = list(predict_keys)
    return _generate(core, input_fn, predict_keys, hooks, checkpoint_path, yield_single_examples)


def _generate(core, input_fn, predict_keys, hooks, checkpoint_path, single) -> Iterator[Any]:
    liveness.watch_hosts(lost_host_timeout_s(core.config.cluster))
    try:
        yield from _predictions(core, input_fn, predict_keys, hooks, checkpoint_path, single)
    except Exception as e:
        liveness.raise_if_lost(e)  # a collective failed because a process is gone: say which
        raise


def _predictions(core, input_fn, predict_keys, hooks, checkpoint_path, single) -> Iterator[Any]:
    ref = core.find_checkpoint(checkpoint_path)
    runtime = core.runtime(ModeKeys.PREDICT)
    batches, _ = core.open_input(runtime, input_fn)
    first = next(batches, None)
    if first is None:
        return
    state = core.state_for(runtime, first, batches.axes, ref, train=False)
    all_hooks = [*hooks, *runtime.spec.hooks, *progress.hooks_for("predict", None)]
    topo = core.topology
    global_step = int(jax.device_get(state.step))
    size = inference.loop_size(core.config.tpu_config.iterations_per_loop_parsed)
    plan = inference.InferencePlan(core.loop_strategy.inference, size, first, lambda b: b.features, topo,
                                   batches.axes[0])
    # several hosts: the outputs are gathered; this host keeps its rows, in its order
    rows_from = topo.host_id if runtime.placement.outputs == "gather" else None
    with preemption.Watch(redeliver=True) as watch, \
            inference.feed(itertools.chain([first], batches), first, plan) as loops:
        engine = Engine(core, all_hooks, watch)
        policy = _Prediction(
            predict_keys, rows_from, engine, runtime.program,
            {"single": "predict", "loop": "predict_scan", "padded": "predict"},
            (runtime.program_variables(state), state.step, state.rng), k=plan.k, global_step=global_step,
        )
        for done, _ in engine.run(loops, policy):
            for preds in done.result:  # the devices run the next loop meanwhile
                if single:
                    yield from _examples(preds)
                else:
                    yield preds
        engine.end()


class _Prediction(inference.InferencePolicy):
    """predict()'s policy: a loop's predictions, padding dropped, `predict_keys` selected."""

    call = "predict()"

    def __init__(self, keys: list[str] | None, rows_from: int | None, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.keys, self.rows_from = keys, rows_from

    def read(self, queued: inference.Dispatched) -> Done:
        outputs = []
        for fetched in self.fetch(queued):
            for step, out in fetched.per_step():
                preds = _select(out, self.keys)
                if self.rows_from is not None:
                    start = self.rows_from * step.size
                    preds = jax.tree.map(lambda x: np.asarray(x)[start : start + step.size], preds)
                outputs.append(jax.tree.map(lambda x: np.asarray(x)[: step.num_real], preds))
        self.batches += len(outputs)
        return Done({"global_step": self.global_step, "batches": self.batches}, self.global_step, outputs)


def _select(preds: Any, keys: list[str] | None) -> Any:
    if keys is None:
        return preds
    if not isinstance(preds, dict):
        raise ValueError(
            message(
                "predict_keys can only be used when model_fn's predictions are a dict.",
                f"predict_keys={keys!r} with predictions of type {type(preds).__name__}",
                "Return predictions={'name': array, ...} or pass predict_keys=None.",
            )
        )
    missing = [k for k in keys if k not in preds]
    if missing:
        raise ValueError(
            message(
                "Every predict_key must be a key of model_fn's predictions.",
                f"predict_keys={keys!r}; unknown {missing}; available {sorted(preds)}",
            )
        )
    return {k: preds[k] for k in keys}


def _examples(preds: Any) -> Iterator[Any]:
    if not isinstance(preds, dict):
        yield from np.asarray(preds)
        return
    sizes = {k: np.shape(v)[0] if np.ndim(v) else None for k, v in preds.items()}
    if len(set(sizes.values())) != 1 or None in sizes.values():
        raise ValueError(
            message(
                "With yield_single_examples=True every prediction must have the same batch "
                "size as its first dimension.",
                f"first dimensions {sizes}",
                "Use yield_single_examples=False to get whole batches.",
            )
        )
    n = next(iter(sizes.values()))
    for i in range(n):
        yield {k: v[i] for k, v in preds.items()}
