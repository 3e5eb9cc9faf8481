"""The loop engine (estimator/engine.py) on its own, with a small policy over real arrays: the
hooks' order, loops queued ahead, the stop that drops the loop queued behind it, the host
calls a policy's `read` returns (run in order before `after_run`), and the preemption check at
a boundary. train/evaluate/predict run on it (their own tests)."""

from __future__ import annotations

import os
import signal

import jax.numpy as jnp
import numpy as np
import pytest

import tpu_estimator as te
from tpu_estimator.estimator.engine import Done, Engine, HostCall
from tpu_estimator.estimator.preemption import Watch


class Recorder(te.SessionRunHook):
    def __init__(self, log, stop_at=None):
        self.log, self.stop_at = log, stop_at

    def begin(self):
        self.log.append("begin")

    def after_create_session(self, session, coord):
        self.log.append("after_create_session")

    def before_run(self, run_context):
        self.log.append("before_run")
        return te.SessionRunArgs("total")

    def after_run(self, run_context, run_values):
        self.log.append(("after_run", run_values.results, run_values.global_step))
        if run_values.global_step == self.stop_at:
            run_context.request_stop()

    def end(self, session):
        self.log.append("end")


class Doubling:
    """Each loop is a list of ints; its programs double them on the device."""

    def __init__(self, engine, log, ahead, on_preempted=None):
        self.engine, self.log, self.ahead = engine, log, ahead
        self.on_preempted = on_preempted
        self.loops = 0

    def begin(self):
        self.log.append("policy.begin")

    def dispatch(self, loop):
        self.log.append(("dispatch", loop))
        return [self.engine.submit({"y": 2 * jnp.asarray(x)}) for x in loop]

    def read(self, queued):
        outs = self.engine.fetch(queued)
        self.loops += 1
        values = [int(o["y"]) for o in outs]
        assert all(isinstance(o["y"], np.ndarray) for o in outs)  # on the host
        return Done({"total": sum(values)}, self.loops, values)

    def preempted(self, done, ctx):
        self.log.append(("preempted", done.step))
        if self.on_preempted:
            self.on_preempted(ctx)


def _run(loops, ahead, stop_at=None, on_preempted=None, signal_before=None):
    log = []
    with Watch() as watch:
        engine = Engine(session=None, hooks=[Recorder(log, stop_at)], watch=watch)
        policy = Doubling(engine, log, ahead, on_preempted)
        read = []
        for done, ctx in engine.run(iter(loops), policy):
            read.append(done.result)
            if done.step == signal_before:
                os.kill(os.getpid(), signal.SIGTERM)  # recorded; acted on at the next boundary
        engine.end()
    return log, read


@pytest.mark.parametrize("ahead", [0, 1])
def test_hooks_order_and_loops_queued_ahead(ahead):
    log, read = _run([[1, 2], [3], [4, 5]], ahead)
    assert read == [[2, 4], [6], [8, 10]]
    assert log[:3] == ["begin", "policy.begin", "after_create_session"]
    assert log[-1] == "end"
    loop = log[3:-1]
    if ahead == 0:  # before_run, the loop queued, its values read back
        assert loop == ["before_run", ("dispatch", [1, 2]), ("after_run", 6, 1),
                        "before_run", ("dispatch", [3]), ("after_run", 6, 2),
                        "before_run", ("dispatch", [4, 5]), ("after_run", 18, 3)]
    else:  # loop L+1 is queued before loop L is read
        assert loop == [("dispatch", [1, 2]), "before_run", ("dispatch", [3]), ("after_run", 6, 1),
                        "before_run", ("dispatch", [4, 5]), ("after_run", 6, 2),
                        "before_run", ("after_run", 18, 3)]


def test_a_stop_drops_the_loop_queued_behind_it_unread():
    log, read = _run([[1], [2], [3], [4]], ahead=1, stop_at=2)
    assert read == [[2], [4]]  # loop 3 was queued, never read
    assert ("dispatch", [3]) in log and ("dispatch", [4]) not in log
    assert [e for e in log if isinstance(e, tuple) and e[0] == "after_run"] == [("after_run", 2, 1), ("after_run", 4, 2)]


def test_preemption_is_checked_at_each_boundary_after_the_hooks():
    log, read = _run([[1], [2], [3]], ahead=0, on_preempted=lambda ctx: ctx.request_stop(), signal_before=1)
    assert read == [[2], [4]]  # the notice came after loop 1: loop 2 is its boundary
    assert log.index(("after_run", 4, 2)) < log.index(("preempted", 2))

    class Stop(Exception):
        pass

    def raising(ctx):
        raise Stop("preempted")

    with pytest.raises(Stop):
        _run([[1], [2], [3]], ahead=1, on_preempted=raising, signal_before=1)


class WithHostCalls(Doubling):
    """Doubling whose `read` hands back one host call per step (by keyword, then by position),
    each result recorded through `then`; a host function raises on the value `fail_on`."""

    def __init__(self, engine, log, fail_on=None):
        super().__init__(engine, log, ahead=1)
        self.fail_on = fail_on

    def host_fn(self, y):
        self.log.append(("host_fn", y))
        if y == self.fail_on:
            raise KeyError(f"host_fn got {y}")
        return y + 1

    def read(self, queued):
        done = super().read(queued)
        def then(got):
            self.log.append(("then", got))

        calls = [HostCall(self.host_fn, {"y": y} if i % 2 == 0 else [y], then=then) for i, y in enumerate(done.result)]
        self.log.append("read")
        return Done(done.values, done.step, done.result, calls)


def test_host_calls_run_in_step_order_before_after_run_and_their_errors_propagate():
    log = []
    with Watch() as watch:
        engine = Engine(session=None, hooks=[Recorder(log)], watch=watch)
        for _ in engine.run(iter([[1, 2], [3]]), WithHostCalls(engine, log)):
            log.append("yielded")
    calls = [e for e in log if e == "read" or e == "yielded" or e[0] in ("host_fn", "then", "after_run")]
    assert calls == ["read", ("host_fn", 2), ("then", 3), ("host_fn", 4), ("then", 5), ("after_run", 6, 1),
                     "yielded", "read", ("host_fn", 6), ("then", 7), ("after_run", 6, 2), "yielded"]

    log = []
    with Watch() as watch:
        engine = Engine(session=None, hooks=[Recorder(log)], watch=watch)
        with pytest.raises(KeyError, match="host_fn got 4"):
            for _ in engine.run(iter([[1, 2, 3], [4]]), WithHostCalls(engine, log, fail_on=4)):
                log.append("yielded")
    assert ("host_fn", 6) not in log  # the calls after the failing one do not run,
    assert not any(e[0] == "after_run" for e in log if isinstance(e, tuple))  # nor the hooks' after_run
    assert "yielded" not in log
