"""The one host loop of train(), evaluate() and predict(): loops in; host calls, hooks, preemption around.

A mode hands the `Engine` its loops (an iterator: each item is what one loop
runs, as that mode's feeder grouped it) and a `Policy`: how to queue a loop's
programs (`dispatch`) and what a loop's outputs mean (`read`). The engine does
the rest, the same for every mode:

* hooks: every hook's `begin`, then the policy's `begin`, then every hook's
  `after_create_session`; per loop one `before_run` (just before the loop is
  queued, or, with a loop queued ahead, just before the next one is) and one
  `after_run` with the values the policy read; `end` from `Engine.end`, which
  the mode calls when its loop is over (train() saves first). Hook order as in
  hook_runner.py.
* pipelining: `Policy.ahead` loops stay queued on the devices while the host
  reads the oldest (0 for train(): the next loop needs the state this one
  computes; 1 for evaluate()/predict(): the devices run loop L+1 while the host
  merges metrics or hands predictions out). When a hook asks to stop, the
  loops already queued behind it are dropped unread: results cover exactly the
  loops up to the stop.
* preemption: at every loop boundary, on every process, after the hooks'
  `after_run`, the engine asks the `Watch` (estimator/preemption.py); when it
  says so, `Policy.preempted` acts (train() saves and stops; evaluate() and
  predict() raise PreemptedError).
* host calls: a policy's `read` returns, with the loop's `Done`, its host calls
  (`HostCall`: a function, fetched outputs as its arguments, and what to do
  with its result), and the engine runs them in that order (step order), on
  the host loop's thread, right after `read` and before the hooks' `after_run`:
  train()'s host_call on every n-th step, then the loop's summaries;
  evaluate()'s metric_fn per batch when it does not trace (its states merged).
  An error from one propagates as itself; the calls after it, the hooks'
  `after_run` and the preemption check do not run.
* outputs: `submit` starts copying a dispatched program's outputs to the host
  (`copy_to_host_async`) and keeps at most `inflight.MAX_IN_FLIGHT` programs,
  holding at most `inflight.max_input_bytes()` of device input (two feeder
  chunks), queued; `fetch` reads them (waiting only for what is not yet copied).
* feeding: every mode's loops come from the one feeder (feeding/feeder.py), each
  loop an iterator of chunks that `Policy.dispatch` queues as they arrive.

`run` is a generator of (`Done`, RunContext) per loop, yielded after the hooks
and the preemption check: the mode does its own per-loop work there (train()
logs and saves, predict() hands predictions out) and may `request_stop()` on
the context; the engine stops after that loop.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from typing import Any, Callable, Iterable, Iterator, Protocol, Sequence

import jax

from tpu_estimator.api.session_run_hook import RunContext, Session, SessionRunHook
from tpu_estimator.estimator import hook_runner, inflight
from tpu_estimator.estimator.preemption import Watch
from tpu_estimator.feeding import feeder


@dataclasses.dataclass
class Done:
    """One loop read back: the values hooks may fetch, the global step they see, and the
    mode's own result of the loop (`result`)."""

    values: dict[str, Any]
    step: int
    result: Any = None
    host_calls: Sequence["HostCall"] = ()  # run in order before the hooks' after_run


@dataclasses.dataclass(frozen=True)
class HostCall:
    """A host-side function on fetched outputs: a user's on one step's (train()'s host_call,
    evaluate()'s metric_fn when it does not trace), or a mode's own on the loop's that must
    follow them (train()'s summaries). `fn(**args)` for a dict, else `fn(*args)`; `then`, if
    given, takes what it returns (evaluate() merges the metric states)."""

    fn: Callable[..., Any]
    args: Any
    then: Callable[[Any], None] | None = None

    def __call__(self) -> None:
        got = self.fn(**self.args) if isinstance(self.args, dict) else self.fn(*self.args)
        if self.then is not None:
            self.then(got)


class Policy(Protocol):
    """What one mode decides; the engine does the looping (see the module docstring)."""

    ahead: int  # loops queued on the devices before the oldest is read

    def begin(self) -> None:
        """Between the hooks' `begin` and `after_create_session` (train() saves its start step)."""

    def dispatch(self, loop: Any) -> Any:
        """Queues one loop's programs (each through `Engine.submit`); returns its handle."""

    def read(self, queued: Any) -> Done:
        """The loop's outputs on the host (`Engine.fetch`), what they mean, and the host calls
        to run on them (`Done.host_calls`)."""

    def preempted(self, done: Done, ctx: RunContext) -> None:
        """A preemption notice reached this loop boundary (on every process)."""


class Engine:
    """Runs one call's loops: hooks, the in-flight bound, output fetching, host calls,
    preemption checks."""

    def __init__(self, session: Session, hooks: Sequence[SessionRunHook], watch: Watch) -> None:
        self.session, self.hooks, self.watch = session, list(hooks), watch
        self._in_flight: collections.deque = collections.deque()

    def submit(self, out: Any, holds: Any = None) -> Any:
        """A program just dispatched with the device input `holds`: its outputs start moving to
        the host, and the host waits while more than MAX_IN_FLIGHT programs, or more input
        bytes than `inflight.max_input_bytes()`, are queued. Returns `out`."""
        leaves = jax.tree.leaves(out)
        for leaf in leaves:
            leaf.copy_to_host_async()
        if leaves:
            inflight.bound(self._in_flight, leaves[0], feeder.nbytes(holds))
        return out

    @staticmethod
    def fetch(outs: Any) -> Any:
        """Programs' outputs (any pytree of them) as host arrays; waits for them."""
        return jax.device_get(outs)

    def run(self, loops: Iterable[Any], policy: Policy) -> Iterator[tuple[Done, RunContext]]:
        """`loops` through `policy`; yields each loop read back, after its hooks (see above)."""
        hook_runner.call_all(self.hooks, "begin")
        policy.begin()
        hook_runner.call_all(self.hooks, "after_create_session", self.session, None)
        loops = iter(loops)
        queued = collections.deque(policy.dispatch(loop) for loop in itertools.islice(loops, policy.ahead))
        while True:
            following = next(loops, None)
            if following is None and not queued:
                return
            ctx = RunContext(session=self.session)
            requests = [h.before_run(ctx) for h in self.hooks]
            if following is not None:
                queued.append(policy.dispatch(following))
            done = policy.read(queued.popleft())
            for call in done.host_calls:
                call()
            hook_runner.after_run(self.hooks, ctx, requests, done.values, done.step)
            if self.watch.reached():
                policy.preempted(done, ctx)
            yield done, ctx
            if ctx.stop_requested:
                return  # the loops queued behind this one are dropped unread

    def end(self) -> None:
        """Every hook's `end`, once the mode's loop is over."""
        hook_runner.call_all(self.hooks, "end", self.session)
