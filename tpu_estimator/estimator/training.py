"""The host side of `train()`: feeds loops, runs hooks, host calls, logs and checkpoints.

The one feeder (feeding/feeder.py, on its thread; train_feed.py is train()'s plan)
groups batches into loops; the loop
engine (estimator/engine.py) runs them with the hooks, the in-flight bound, the
output fetching and the preemption check; `_Training` is train()'s policy on it
(dispatch a loop's chunks, read it: NaN check, then the host calls the engine
runs, host_call's and then the summaries'; then log and save), with no loop
queued ahead.

One loop = `iterations_per_loop` steps in one compiled program ("scan"), or
the same steps dispatched one by one ("step"; XLA:CPU runs convolutions in
`lax.scan` slowly). Hooks, host calls, logging and checkpoints happen at loop
boundaries, and so does the preemption check: after a SIGTERM (see
preemption.py) the loop saves the step it reached and train() returns a
`TrainResult` with `preempted=True`.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import jax
import numpy as np

from tpu_estimator.api.checks import message
from tpu_estimator.api.mode_keys import ModeKeys
from tpu_estimator.errors import NanLossDuringTrainingError
from tpu_estimator.checkpoint.manager import check_writable
from tpu_estimator.estimator import hook_runner, liveness, preemption, progress, train_feed
from tpu_estimator.estimator.engine import Done, Engine, HostCall
from tpu_estimator.estimator.runtime import Runtime
from tpu_estimator.estimator.schedule import LoopSchedule
from tpu_estimator.feeding import feeder
from tpu_estimator.feeding.device import batch_specs
from tpu_estimator.feeding.feeder import Chunk
from tpu_estimator.feeding.input_state import get_input_state
from tpu_estimator.hooks.cadence import Cadence
from tpu_estimator.hooks.listener import check_listeners, save_with_listeners
from tpu_estimator.hooks.nan_tensor import handles_non_finite_loss
from tpu_estimator.api.session_run_hook import RunContext
from tpu_estimator.parallel.distributed import lost_host_timeout_s
from tpu_estimator.summary.train_summaries import TrainSummaries, hook_values

if TYPE_CHECKING:
    from tpu_estimator.estimator.core import Core

log = logging.getLogger("tpu_estimator")


def _join(fetched: list[tuple[bool, Any]]) -> Any:
    """Host outputs of one loop's programs, joined along a leading step axis. Each entry is
    (single step?, outputs): a single step's outputs gain the axis, a scan's have it."""
    parts = []
    for single, group in itertools.groupby(fetched, key=lambda entry: entry[0]):
        trees = [tree for _, tree in group]
        join = np.stack if single else np.concatenate
        parts.append(jax.tree.map(lambda *xs: join([np.asarray(x) for x in xs]), *trees))
    if len(parts) == 1:
        return parts[0]
    return jax.tree.map(lambda *xs: np.concatenate(xs), *parts)


def check_steps(steps: Any, max_steps: Any) -> None:
    """The original's argument rules for train(steps=, max_steps=)."""
    if steps is not None and max_steps is not None:
        raise ValueError(
            message(
                "Give at most one of `steps` (relative) and `max_steps` (absolute).",
                f"steps={steps!r}, max_steps={max_steps!r}",
            )
        )
    for name, value in (("steps", steps), ("max_steps", max_steps)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(message(f"`{name}` must be a positive int or None.", f"{name}={value!r}"))
        if value <= 0:
            raise ValueError(message(f"Must specify {name} > 0.", f"{name}={value!r}"))


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """What one train() call did: the global step it ended at (saved, unless training
    diverged), and whether a preemption notice (SIGTERM) stopped it early."""

    global_step: int
    preempted: bool = False


def train(
    core: "Core",
    input_fn: Any,
    *,
    hooks: Sequence[Any] | None,
    steps: int | None,
    max_steps: int | None,
    saving_listeners: Sequence[Any] | None,
) -> TrainResult:
    """Implements `TPUEstimator.train` (see there).

    model_dir is checked writable first. On any error Orbax's manager is closed
    (waiting for the saves started), so that no thread of it outlives the call.
    """
    check_steps(steps, max_steps)
    hooks = hook_runner.check_hooks(hooks, "hooks")
    listeners = check_listeners(saving_listeners)
    check_writable(core.model_dir)
    liveness.watch_hosts(lost_host_timeout_s(core.config.cluster))
    with preemption.Watch() as watch:
        try:
            result = _train(core, input_fn, hooks, listeners, steps, max_steps, watch)
        except BaseException as e:
            # A collective failed because a process is gone: say which (without closing Orbax,
            # whose pending commit would wait on the lost process until JAX's deadline).
            liveness.raise_if_lost(e)
            core.close_checkpointer()
            raise
    if watch.signalled and not result.preempted:  # after the last loop: training was complete
        result = dataclasses.replace(result, preempted=True)
    if result.preempted:
        log.warning(
            "Preempted: training stopped at global step %d, saved in %s. Run train() again "
            "(in a new job) to resume from it.", result.global_step, core.latest_checkpoint(),
        )
    return result


def _train(
    core: "Core",
    input_fn: Any,
    hooks: list[Any],
    listeners: list[Any],
    steps: int | None,
    max_steps: int | None,
    watch: preemption.Watch,
) -> TrainResult:
    restore = core.find_checkpoint(None)
    start = restore.step if restore is not None else 0
    if max_steps is not None and start >= max_steps:
        log.info("Skipping training: global step %d already reached max_steps=%d.", start, max_steps)
        return TrainResult(start)
    last = start + steps if steps is not None else max_steps
    runtime = core.runtime(ModeKeys.TRAIN)
    batches, iterator = core.open_input(runtime, input_fn, restore=restore)
    initial_input_state = get_input_state(iterator)
    first = next(batches, None)
    if first is None:
        log.warning("input_fn yielded no batch: nothing to train.")
        return TrainResult(start)
    state = core.state_for(runtime, first, batches.axes, restore, train=True)
    spec = runtime.spec
    specs = {
        "stacked": batch_specs(batches.axes, leading=1, replicated=runtime.layout.replicated_input),
        "single": batch_specs(batches.axes, replicated=runtime.layout.replicated_input),
    }
    schedule = LoopSchedule(core.config.tpu_config.iterations_per_loop_parsed, start, last)
    all_hooks = [*hooks, *spec.hooks]
    if jax.process_index() == 0:
        all_hooks.extend(spec.chief_hooks)
    all_hooks.extend(progress.hooks_for("train", None if last is None else last - start, start))
    plan = train_feed.TrainPlan(
        schedule, specs, runtime, core.loop_strategy, iterator, start_step=int(jax.device_get(state.step))
    )
    loop = _Training(core, runtime, Engine(core, all_hooks, watch), listeners, schedule)
    with feeder.open_feed(itertools.chain([first], batches), plan) as feed:
        return loop.run(state, feed, initial_input_state, saved=restore is not None)


@dataclasses.dataclass
class LoopResult:
    """One loop's outcome on the host: the new state and each step's outputs, in order."""

    state: Any
    first_step: int  # the global step before the loop
    steps: int
    losses: np.ndarray
    host_call: Any
    summaries: Any
    input_state: Any

    @property
    def step(self) -> int:
        """The global step after the loop."""
        return self.first_step + self.steps

    @property
    def finite(self) -> bool:
        return bool(np.all(np.isfinite(self.losses)))


@dataclasses.dataclass
class _Queued:
    """One loop's programs, dispatched: the state after them and each program's outputs."""

    state: Any
    first_step: int
    outs: list[tuple[bool, Any]]  # (single step?, device outputs) per program
    steps: int
    input_state: Any
    started: float


class _Training:
    """train()'s policy on the loop engine (estimator/engine.py): no loop queued ahead (the
    next needs this one's state); per loop the named steps below."""

    ahead = 0

    def __init__(self, core: "Core", runtime: Runtime, engine: Engine, listeners: list[Any],
                 schedule: LoopSchedule) -> None:
        self.core, self.runtime, self.engine = core, runtime, engine
        self.hooks, self.listeners = engine.hooks, listeners
        self.schedule = schedule
        cfg = core.config
        self.save_cadence = Cadence(cfg.save_checkpoints_steps, cfg.save_checkpoints_secs)
        self.log_cadence = Cadence(cfg.log_step_count_steps)
        self.examples_per_step = runtime.layout.global_batch_size or 0
        self.saved_step: int | None = None
        self.summaries = TrainSummaries(core.model_dir, cfg.save_summary_steps, self.examples_per_step)
        self.state: Any = None
        self.step = 0
        self.input_state: Any = None
        self.restored = self.notice = False  # notice: a preemption notice stopped it

    def run(self, state: Any, feed: Iterator[Chunk], input_state: Any, *, saved: bool) -> TrainResult:
        self.state, self.step, self.input_state = state, int(jax.device_get(state.step)), input_state
        self.restored = saved
        diverged = False
        try:
            for done, ctx in self.engine.run(feeder.loops(feed), self):
                result: LoopResult = done.result
                if not result.finite:  # a NanTensorHook(fail_on_nan_loss=False) warned
                    diverged = True  # keep the last good checkpoint
                    ctx.request_stop()
                    continue
                self.log(result)
                if self.notice or self.save_cadence.due(result.step):
                    self.save_cadence.mark(result.step)
                    if self.save(self.state, result.step, self.input_state):
                        ctx.request_stop()
        except BaseException:
            self.core.remember(self.state)
            self.flush_quietly()  # the error in flight is the one the caller sees
            raise
        self.core.remember(self.state)
        self.summaries.flush()
        self.end(self.state, self.step, self.input_state, diverged=diverged)
        return TrainResult(self.step, self.notice)

    def flush_quietly(self) -> None:
        """The summaries written so far, while another error ends train(): a failure to write
        them is logged, not raised over that error (which names what went wrong first)."""
        try:
            self.summaries.flush()
        except Exception as e:  # noqa: BLE001 - logged; the original error is raised
            log.warning("Summaries were not all written while train() ended on an error: %s", e)

    # --- the engine's policy ---------------------------------------------------------

    def begin(self) -> None:
        """Listeners' `begin`, the start step saved (if new); hooks may read the start step in
        `after_create_session`."""
        for lis in self.listeners:
            lis.begin()
        if self.restored:  # restored from this step's checkpoint
            self.saved_step = self.step
        self.save(self.state, self.step, self.input_state)
        self.save_cadence.start(self.step)
        self.log_cadence.start(self.step)
        self.core.remember(self.state)

    def dispatch(self, loop: Iterator[Chunk]) -> _Queued:
        """Dispatches the chunks of one loop as they arrive; each program's outputs start
        moving to the host while the device runs the later ones."""
        state, input_state = self.state, self.input_state
        queued = _Queued(state, self.step, [], 0, input_state, time.monotonic())
        for chunk in loop:
            state = self._queue(chunk, state, queued)
            input_state = chunk.extra.input_state
        queued.state, queued.input_state = state, input_state
        return queued

    def _queue(self, chunk: Chunk, state: Any, queued: _Queued) -> Any:
        """Dispatches one chunk's programs after `state`; returns the state after them. The
        queued programs hold the chunk's input; nothing else does once this returns."""
        data, chunk.data = chunk.data, None
        submit = self.engine.submit
        if chunk.stacked:
            state, out = self.runtime.program("scan")(state, data)
            queued.outs.append((False, submit(out, holds=data)))
            queued.steps += chunk.steps
            return state
        for batch, next_step in zip(data, chunk.extra.next_steps):  # one program per step
            state, out = self.runtime.program("step")(state, batch)
            state = state.replace(step=next_step)
            queued.outs.append((True, submit(out, holds=batch)))
            queued.steps += 1
        return state

    def read(self, queued: _Queued) -> Done:
        """The loop's outputs on the host; the NaN check, then (run by the engine, before the
        hooks) host_call on its steps and the loop's summaries."""
        joined = _join(self.engine.fetch(queued.outs))  # on the host: no extra device work
        self.schedule.report(queued.steps, time.monotonic() - queued.started)
        result = LoopResult(
            queued.state, queued.first_step, queued.steps, joined["loss"], joined["host_call"],
            joined["summaries"], queued.input_state,
        )
        self.state, self.step, self.input_state = result.state, result.step, result.input_state
        self.check_finite(result)
        summaries = HostCall(self.summaries.after_loop, (result.first_step, result.losses, result.summaries,
                                                         result.state))
        values = hook_values(result.losses, result.summaries, result.step, result.state)
        return Done(values, result.step, result, [*self.host_calls(result), summaries])

    def preempted(self, done: Done, ctx: RunContext) -> None:
        """A preemption notice (every process at the same boundary): this step is saved and
        the loop ends."""
        log.warning("Preemption notice: stopping at global step %d to save it.", done.step)
        self.notice = True
        ctx.request_stop()

    # --- the named steps -------------------------------------------------------------

    def check_finite(self, result: LoopResult) -> None:
        """Raises NanLossDuringTrainingError on a non-finite loss, unless a hook handles it."""
        if result.finite or handles_non_finite_loss(self.hooks):
            return
        losses = result.losses
        bad = result.first_step + 1 + int(np.argmin(np.isfinite(losses)))
        raise NanLossDuringTrainingError(
            f"Model diverged with loss = {losses[~np.isfinite(losses)][0]} at global "
            f"step {bad}. The last checkpoint (step {self.core.checkpointer.latest_step()}) is kept."
        )

    def host_calls(self, result: LoopResult) -> list[HostCall]:
        """host_call_fn on every `experimental_host_call_every_n_steps`-th step's tensors."""
        fn = self.runtime.spec.host_call_fn
        outputs = result.host_call
        if fn is None or outputs is None:
            return []
        every = self.core.config.tpu_config.experimental_host_call_every_n_steps
        k = len(jax.tree.leaves(outputs)[0]) if jax.tree.leaves(outputs) else 0
        return [HostCall(fn, jax.tree.map(lambda x, i=i: x[i], outputs)) for i in range(0, k, every)]

    def log(self, result: LoopResult) -> None:
        """Every `log_step_count_steps`: the loss and the rates, in the log and as summaries."""
        if not self.log_cadence.due(result.step):
            return
        secs, steps = self.log_cadence.mark(result.step)
        rate = (steps or 0) / max(secs or 0.0, 1e-9)
        log.info(
            "loss = %.6g, step = %d (%.3g steps/sec, %.4g examples/sec)",
            result.losses[-1], result.step, rate, rate * self.examples_per_step,
        )
        self.summaries.rates(result.step, rate)

    def save(self, state: Any, step: int, input_state: Any) -> bool:
        """Saves `step` once, with listeners around it; True if a listener asks to stop."""
        if step == self.saved_step:
            return False
        self.saved_step = step
        return save_with_listeners(self.core.checkpointer, step, state, self.listeners, self.core, input_state)

    def end(self, state: Any, step: int, input_state: Any, *, diverged: bool) -> None:
        """The final save (not after divergence), committed; listeners' and hooks' `end`."""
        if not diverged:
            self.save(state, step, input_state)
        self.core.checkpointer.wait()  # `end` sees it as latest_checkpoint()
        if not diverged:  # the next call starts from this state while that checkpoint is ours
            self.core.remember(state, committed=True)
        for lis in self.listeners:
            lis.end(self.core, step)
        self.engine.end()
