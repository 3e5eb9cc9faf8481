"""train() starts from the state in memory only while the checkpoint it finds is the one it saved."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from tests.estimator.models import batches_fn, estimator, make_data
from tpu_estimator.estimator import runtime as runtime_module


@pytest.fixture
def restores(monkeypatch):
    """The restores from a checkpoint (`Runtime.load_state` with a checkpoint), counted."""
    calls: list[int] = []
    load_state = runtime_module.Runtime.load_state

    def counting(self, batch, axes, ref):
        if ref is not None:
            calls.append(ref.step)
        return load_state(self, batch, axes, ref)

    monkeypatch.setattr(runtime_module.Runtime, "load_state", counting)
    return calls


def _variables(est):
    return {name: est.get_variable_value(name) for name in est.get_variable_names()}


def test_a_second_call_continues_from_memory(tmp_path, data, restores):
    x, y = data
    est = estimator(tmp_path, ipl=2)
    est.train(batches_fn(x, y), steps=4)
    est.train(batches_fn(x, y), steps=4)
    assert restores == []  # its own step 4, unchanged: no restore
    assert est.get_variable_value("global_step") == 8


def test_a_step_another_run_wrote_again_is_restored(tmp_path, data, restores):
    """Another run rewrote model_dir's newest step (same step number, other values) between two
    calls: the second call restores it, and ends where a fresh estimator starting from it ends."""
    x, y = data
    ours = estimator(tmp_path / "ours", ipl=2)
    ours.train(batches_fn(x, y), steps=4)

    other_x, other_y = make_data(len(x), seed=1)  # another run: the same model, other data
    estimator(tmp_path / "other", ipl=2).train(batches_fn(other_x, other_y), steps=4)
    shutil.rmtree(tmp_path / "ours" / "4")
    shutil.copytree(tmp_path / "other" / "4", tmp_path / "ours" / "4")
    shutil.copytree(tmp_path / "ours", tmp_path / "fresh")

    restores.clear()
    ours.train(batches_fn(x, y), steps=4)
    assert restores == [4]
    fresh = estimator(tmp_path / "fresh", ipl=2)
    fresh.train(batches_fn(x, y), steps=4)
    got, want = _variables(ours), _variables(fresh)
    assert got.keys() == want.keys() and got["global_step"] == 8
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    # evaluate() after it starts from the state in memory (each saved its step 8 itself)
    restores.clear()
    assert ours.evaluate(batches_fn(x, y), steps=2) == fresh.evaluate(batches_fn(x, y), steps=2)
    assert restores == []
