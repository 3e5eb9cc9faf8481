"""`tpu_estimator.checkpoints_iterator`: TF's `tf.train.checkpoints_iterator` semantics.

The newest existing checkpoint first, then each new one once, in order; a
timeout ends the iteration unless `timeout_fn()` returns False. Checkpoints are
real Orbax steps written by `Checkpointer` (as train() writes them); the poll
interval is shortened from TF's 1 s to keep the tests fast.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import flax.linen as nn
import numpy as np
import optax
import pytest

import tpu_estimator as te
from tpu_estimator.checkpoint import iterator as iterator_module
from tpu_estimator.paths import join

sys.path.insert(0, os.path.dirname(__file__))
from iterator_helpers import save_steps  # noqa: E402


@pytest.fixture(autouse=True)
def fast_poll(monkeypatch):
    monkeypatch.setattr(iterator_module, "POLL_SECONDS", 0.05)


def test_newest_existing_checkpoint_first_then_stops_at_timeout(tmp_path):
    model_dir = str(tmp_path / "run")
    save_steps(model_dir, 10, 20, 30)
    assert list(te.checkpoints_iterator(model_dir, timeout=0.2)) == [join(model_dir, "30")]


def test_each_new_checkpoint_once_in_order(tmp_path):
    """A trainer thread writes the next step once the previous one was yielded."""
    model_dir = str(tmp_path / "run")  # does not exist yet: the iterator waits for it
    taken = threading.Event()
    trainer_error: list[BaseException] = []

    def trainer():
        try:
            for step in (5, 10, 15):
                taken.wait(timeout=30)
                taken.clear()
                time.sleep(0.1)  # a few polls see no new checkpoint (nothing yielded twice)
                save_steps(model_dir, step)
        except BaseException as e:  # noqa: BLE001 - reported below
            trainer_error.append(e)

    thread = threading.Thread(target=trainer)
    thread.start()
    seen = []
    taken.set()
    for path in te.checkpoints_iterator(model_dir, timeout=2):
        seen.append(path)
        taken.set()
    thread.join()
    assert not trainer_error
    assert seen == [join(model_dir, "5"), join(model_dir, "10"), join(model_dir, "15")]


def test_timeout_without_checkpoint_ends_the_iteration(tmp_path):
    start = time.monotonic()
    assert list(te.checkpoints_iterator(str(tmp_path / "never"), timeout=0.3)) == []
    assert 0.2 <= time.monotonic() - start < 5


def test_timeout_fn_false_waits_again_true_ends(tmp_path):
    model_dir = str(tmp_path / "run")
    calls = []

    def timeout_fn():
        calls.append(time.monotonic())
        if len(calls) == 1:
            save_steps(model_dir, 7)  # more checkpoints are coming: keep waiting
            return False
        return True

    assert list(te.checkpoints_iterator(model_dir, timeout=0.1, timeout_fn=timeout_fn)) == [
        join(model_dir, "7")
    ]
    assert len(calls) == 2


def test_min_interval_secs_spaces_the_yields(tmp_path):
    """Counted from the previous yield: the caller's work (here a save) counts toward it."""
    model_dir = str(tmp_path / "run")
    save_steps(model_dir, 1)
    it = te.checkpoints_iterator(model_dir, min_interval_secs=1.5, timeout=0.2)
    assert next(it) == join(model_dir, "1")
    start = time.monotonic()
    save_steps(model_dir, 2)
    assert next(it) == join(model_dir, "2")
    assert time.monotonic() - start >= 1.45
    it.close()


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"checkpoint_dir": 3}, TypeError, "checkpoint_dir"),
        ({"checkpoint_dir": "x", "timeout": -1}, ValueError, r"`timeout` must be a number >= 0"),
        ({"checkpoint_dir": "x", "min_interval_secs": -1}, ValueError, "min_interval_secs"),
        ({"checkpoint_dir": "x", "timeout_fn": True}, TypeError, "`timeout_fn` must be a callable"),
    ],
)
def test_bad_arguments_are_named_at_the_call(kwargs, error, match):
    with pytest.raises(error, match=match):
        te.checkpoints_iterator(**kwargs)


def model_fn(features, labels, mode, params):
    logits = nn.Dense(2)(features["x"])
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    return te.TPUEstimatorSpec(mode, loss=loss, train_op=optax.sgd(0.1))


def input_fn(params):
    rng = np.random.default_rng(0)
    for _ in range(4):
        x = rng.normal(size=(params["batch_size"], 3)).astype(np.float32)
        yield {"x": x}, (x[:, 0] > 0).astype(np.int32)


def test_the_continuous_evaluation_recipe_with_train(tmp_path):
    """docs/migrating.md's loop: an evaluator estimator on the trainer's model_dir evaluates each
    checkpoint the iterator yields (`evaluate(checkpoint_path=...)`); train() runs between two
    yields (the generator is lazy) and its new checkpoint comes next; `timeout_fn` ends the loop."""
    config = te.RunConfig(model_dir=str(tmp_path / "run"), tpu_config=te.TPUConfig(iterations_per_loop=2),
                          save_checkpoints_steps=2, log_step_count_steps=None)
    trainer = te.TPUEstimator(model_fn, config=config, train_batch_size=16, eval_batch_size=16)
    evaluator = te.TPUEstimator(model_fn, config=config, train_batch_size=16, eval_batch_size=16)
    trainer.train(input_fn, max_steps=4)

    def training_done():
        return int(os.path.basename(evaluator.latest_checkpoint())) >= 6

    evaluated = []
    for path in te.checkpoints_iterator(config.model_dir, timeout=0.2, timeout_fn=training_done):
        evaluated.append(evaluator.evaluate(input_fn, steps=1, checkpoint_path=path)["global_step"])
        if evaluated == [4]:
            trainer.train(input_fn, max_steps=6)
    assert evaluated == [4, 6]
