"""Preemption outside train(), one process: a SIGTERM during evaluate(), predict() or
train_and_evaluate()'s evaluation stops the call at the next loop boundary with
`PreemptedError`, nothing written; a SIGTERM the call never acted on reaches the previous
handler when it ends. (Several processes: tests/multihost/test_preemption.py.)"""

from __future__ import annotations

import os
import signal

import pytest

import tpu_estimator as te
from tests.estimator.models import batches_fn, estimator, make_data

X, Y = make_data(16 * 12)  # 12 batches of 16: 3 loops of ipl=4


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("m")
    estimator(model_dir).train(batches_fn(X, Y), max_steps=4)
    return model_dir


@pytest.fixture
def outer():
    """A SIGTERM handler around the test: records what reaches it (never pytest's death)."""
    got: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
    try:
        yield got
    finally:
        signal.signal(signal.SIGTERM, previous)


class TermAfter(te.SessionRunHook):
    """Sends this process SIGTERM after loop `n` (1-based); or in `end` when n is None."""

    def __init__(self, n):
        self.n, self.loops = n, 0

    def after_run(self, run_context, run_values):
        self.loops += 1
        if self.loops == self.n:
            os.kill(os.getpid(), signal.SIGTERM)

    def end(self, session):
        if self.n is None:
            os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_during_evaluate_raises_and_records_nothing(trained, outer):
    est = estimator(trained)
    with pytest.raises(te.PreemptedError, match=r"evaluate\(\) was preempted \(SIGTERM\) after 4 batches .*"
                       r"global step 4; nothing was written \(no metrics recorded"):
        est.evaluate(batches_fn(X, Y), hooks=[TermAfter(1)])
    assert outer == []  # acted on, not passed on
    assert not (trained / "eval").exists()
    assert est.evaluate(batches_fn(X, Y))["global_step"] == 4  # the handler is gone: a normal run
    assert (trained / "eval" / "eval_results.jsonl").exists()


def test_sigterm_after_the_last_loop_of_evaluate_returns_and_reaches_the_previous_handler(trained, outer):
    results = estimator(trained).evaluate(batches_fn(X, Y), hooks=[TermAfter(None)], name="late")
    assert results["global_step"] == 4 and outer == [signal.SIGTERM]
    assert (trained / "eval_late" / "eval_results.jsonl").exists()


def test_sigterm_during_predict_stops_the_generator(trained, outer):
    gen = estimator(trained).predict(batches_fn(X, None), hooks=[TermAfter(2)])
    got = []
    with pytest.raises(te.PreemptedError, match=r"predict\(\) was preempted \(SIGTERM\) after 8 batches"):
        for p in gen:
            got.append(p)
    assert len(got) == 4 * 16  # the first loop's predictions; not the second's
    assert outer == []


def test_sigterm_while_predict_is_suspended_reaches_the_previous_handler_on_close(trained, outer):
    gen = estimator(trained).predict(batches_fn(X, None))
    next(gen)
    os.kill(os.getpid(), signal.SIGTERM)  # the caller is between next() calls
    assert outer == []
    gen.close()
    assert outer == [signal.SIGTERM]


def test_sigterm_during_train_and_evaluate_evaluation_raises(tmp_path, outer):
    est = estimator(tmp_path)
    spec = te.EvalSpec(batches_fn(X, Y), steps=None, hooks=[TermAfter(1)])
    with pytest.raises(te.PreemptedError, match=r"evaluate\(\) was preempted"):
        te.train_and_evaluate(est, te.TrainSpec(batches_fn(X, Y, repeat=10), max_steps=4), spec)
    assert est.latest_checkpoint().endswith("/4") and not (tmp_path / "eval").exists()
    assert outer == []
