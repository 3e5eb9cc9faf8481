"""train(): gradient averaging, the hook-step table, host_call, no recompilation, input errors."""

from __future__ import annotations

import numpy as np
import pytest

import tpu_estimator as te
from tests.estimator.models import batches_fn, compiled_programs, estimator
from tpu_estimator.loops.compiles import count_compiles


class StepRecorder(te.SessionRunHook):
    def __init__(self):
        self.steps, self.losses = [], []

    def before_run(self, run_context):
        return te.SessionRunArgs("loss")

    def after_run(self, run_context, run_values):
        self.steps.append(run_values.global_step)
        self.losses.append(run_values.results)


def test_eight_replicas_match_one_device_on_the_same_global_batches(tmp_path, data):
    x, y = data
    inp = batches_fn(x[:128], y[:128])
    many = estimator(tmp_path / "many", ipl=4).train(inp, max_steps=8)
    one = estimator(tmp_path / "one", ipl=4, use_tpu=False).train(inp, max_steps=8)
    assert many.num_replicas == 8 and one.num_replicas == 1
    for name in many.get_variable_names():
        np.testing.assert_allclose(
            many.get_variable_value(name), one.get_variable_value(name), rtol=2e-5, atol=2e-6
        )
    assert many.get_variable_value("global_step") == 8


@pytest.mark.parametrize(
    "ipl, start, kwargs, expected",
    [
        (4, 0, dict(steps=10), [4, 8, 10]),
        (4, 3, dict(steps=10), [7, 11, 13]),
        (4, 3, dict(max_steps=10), [7, 10]),
        (40, 0, dict(steps=12), [12]),
    ],
)
def test_hooks_run_at_loop_boundaries(tmp_path, data, ipl, start, kwargs, expected):
    x, y = data
    inp = batches_fn(x, y, repeat=2)
    if start:
        estimator(tmp_path, ipl=start).train(inp, max_steps=start)
    hook = StepRecorder()
    estimator(tmp_path, ipl=ipl).train(inp, hooks=[hook], **kwargs)
    assert hook.steps == expected
    assert all(np.isfinite(v) for v in hook.losses)


def test_max_steps_already_reached_returns_at_once(tmp_path, data):
    x, y = data
    est = estimator(tmp_path).train(batches_fn(x, y), max_steps=4)
    hook = StepRecorder()
    assert est.train(batches_fn(x, y), max_steps=4, hooks=[hook]) is est
    assert hook.steps == []


def test_training_stops_when_the_input_ends(tmp_path, data):
    x, y = data
    est = estimator(tmp_path, ipl=4).train(batches_fn(x[:160], y[:160]))  # 10 batches
    assert est.get_variable_value("global_step") == 10


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(steps=1, max_steps=2), ValueError, "at most one of `steps`"),
        (dict(steps=0), ValueError, "steps > 0"),
        (dict(max_steps=-1), ValueError, "max_steps > 0"),
        (dict(steps=1.5), TypeError, "`steps` must be a positive int"),
    ],
)
def test_steps_arguments_are_checked(tmp_path, kwargs, error, match):
    with pytest.raises(error, match=match):
        estimator(tmp_path).train(lambda params: iter([]), **kwargs)


def _host_call_steps(tmp_path, data, *, steps, tpu):
    """The steps (fed as a feature) that host_call saw, with the logits' shapes."""
    import optax, flax.linen as nn

    seen = []

    def host_fn(step, logits):
        seen.append((int(step[0]), logits.shape))

    def model_fn(features, labels, mode, params):
        logits = nn.Dense(3)(features["x"])
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
        step = features["step"]
        return te.TPUEstimatorSpec(
            mode, loss=loss, train_op=optax.sgd(0.1), host_call=(host_fn, [step, logits])
        )

    x, y = data

    def input_fn(params):
        b = params["batch_size"]
        for i in range(steps):
            j = i % (len(x) // b)
            yield {"x": x[j * b : (j + 1) * b], "step": np.full((b,), i + 1, np.int32)}, y[j * b : (j + 1) * b]

    estimator(tmp_path, model_fn=model_fn, tpu_config=tpu).train(input_fn, steps=steps)
    return seen


def test_host_call_sees_every_nth_step_with_global_batch_shapes(tmp_path, data):
    tpu = te.TPUConfig(iterations_per_loop=4, experimental_host_call_every_n_steps=2)
    seen = _host_call_steps(tmp_path, data, steps=10, tpu=tpu)
    # Loops of 4, 4, 2 steps; within each loop steps 0, 2, ... call the host.
    assert [s for s, _ in seen] == [1, 3, 5, 7, 9]
    assert all(shape == (16, 3) for _, shape in seen)


@pytest.mark.parametrize("strategy", ["step", "scan"])
def test_host_call_sees_every_step_of_a_long_loop_in_order(tmp_path, data, strategy):
    # 40 steps in one loop: per-step dispatch fetches finished steps' outputs while
    # later ones run (beyond 16 in flight), scan in one program; both join the same way.
    tpu = te.TPUConfig(iterations_per_loop=40, loop_strategy=strategy)
    seen = _host_call_steps(tmp_path, data, steps=40, tpu=tpu)
    assert [s for s, _ in seen] == list(range(1, 41))
    assert all(shape == (16, 3) for _, shape in seen)


def test_second_train_and_evaluate_do_not_recompile(tmp_path, data):
    x, y = data
    est = estimator(tmp_path, ipl=4)
    with count_compiles() as first:
        est.train(batches_fn(x, y), steps=8)
        est.evaluate(batches_fn(x[:64], y[:64]))
    programs = compiled_programs(first.names)
    # 4 batches at iterations_per_loop=4: one on-device evaluation loop ("auto" on the MLP: scan)
    assert programs.get("evaluate_loop") == 1 and sum(programs.values()) >= 3, first.names
    assert all(n == 1 for n in programs.values()), first.names
    with count_compiles() as again:
        est.train(batches_fn(x, y), steps=8)
        est.evaluate(batches_fn(x[:64], y[:64]))
    assert again.count == 0, again.names


def test_an_input_thread_error_surfaces_as_itself(tmp_path, data):
    x, y = data

    class Boom(Exception):
        pass

    def input_fn(params):
        yield from batches_fn(x[:64], y[:64])(params)
        raise Boom("input broke")

    with pytest.raises(Boom, match="input broke"):
        estimator(tmp_path).train(input_fn, steps=10)


def test_a_changed_batch_shape_is_an_error_naming_the_feature(tmp_path, data):
    x, y = data

    def input_fn(params):
        yield {"x": x[:16]}, y[:16]
        yield {"x": x[:16, :4]}, y[:16]

    with pytest.raises(ValueError, match=r"`features/x` changed shape.*float32\[16, 4\] after float32\[16, 8\]"):
        estimator(tmp_path).train(input_fn, steps=2)


def test_batch_size_not_divisible_by_replicas_fails_when_the_mode_runs(tmp_path, data):
    x, y = data
    est = estimator(tmp_path, train_batch_size=12)
    with pytest.raises(ValueError, match=r"train_batch_size=12 with 8 replicas"):
        est.train(batches_fn(x, y), steps=1)


def test_dropout_is_reproducible_and_differs_per_replica(tmp_path, data):
    import flax.linen as nn
    import optax

    def model_fn(features, labels, mode, params):
        h = nn.Dropout(0.5, deterministic=mode != te.ModeKeys.TRAIN)(features["x"])
        logits = nn.Dense(3)(h)
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
        return te.TPUEstimatorSpec(mode, loss=loss, train_op=optax.sgd(0.1))

    x, y = data
    same = np.tile(x[:2], (8, 1))  # every replica gets the same two examples
    inp = lambda params: iter([({"x": same}, np.tile(y[:2], 8))] * 4)
    a = estimator(tmp_path / "a", model_fn=model_fn).train(inp, steps=4)
    b = estimator(tmp_path / "b", model_fn=model_fn).train(inp, steps=4)
    c = estimator(tmp_path / "c", model_fn=model_fn, seed=1).train(inp, steps=4)
    k = "Dense_0/kernel"
    np.testing.assert_array_equal(a.get_variable_value(k), b.get_variable_value(k))
    assert not np.allclose(a.get_variable_value(k), c.get_variable_value(k))


def test_a_time_based_loop_starts_small_and_grows_in_powers_of_two(tmp_path, data):
    x, y = data
    hook = StepRecorder()
    tpu = te.TPUConfig(iterations_per_loop="1s", loop_strategy="scan")
    estimator(tmp_path, tpu_config=tpu).train(batches_fn(x, y, repeat=3), steps=40, hooks=[hook])
    sizes = np.diff([0, *hook.steps])
    assert hook.steps[0] == 1 and hook.steps[-1] == 40
    assert all(s & (s - 1) == 0 for s in sizes[:-1]), sizes  # powers of two, few programs
    assert len(sizes) < 10


def test_a_loop_bigger_than_the_chunk_bound_is_fed_in_chunks(tmp_path, data, monkeypatch):
    from tpu_estimator.feeding import feeder

    x, y = data
    inp = batches_fn(x, y, repeat=2)
    whole = estimator(tmp_path / "whole", ipl=8).train(inp, steps=16)
    monkeypatch.setattr(feeder, "MAX_CHUNK_BYTES", 3 * 16 * 9 * 4)  # 3 batches per chunk
    hook = StepRecorder()
    chunked = estimator(tmp_path / "chunked", ipl=8).train(inp, steps=16, hooks=[hook])
    assert hook.steps == [8, 16]
    np.testing.assert_allclose(
        chunked.get_variable_value("Dense_1/kernel"), whole.get_variable_value("Dense_1/kernel"), rtol=1e-6
    )


def test_batch_axis_places_the_batch_dimension_of_each_input(tmp_path, data):
    import flax.linen as nn
    import optax

    seen = []

    def model_fn(features, labels, mode, params):
        seen.append(features["x"].shape)
        logits = nn.Dense(3)(features["x"].T)  # features arrive as [N_FEATURES, batch]
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
        return te.TPUEstimatorSpec(mode, loss=loss, train_op=optax.sgd(0.1))

    def batch_major(features, labels, mode, params):
        return model_fn({"x": features["x"].T}, labels, mode, params)

    x, y = data
    inp = batches_fn(x[:64], y[:64])

    def transposed(params):
        for feats, labels in inp(params):
            yield {"x": feats["x"].T}, labels

    a = estimator(tmp_path / "a", model_fn=model_fn, batch_axis=(1, 0)).train(transposed, steps=4)
    assert seen[-1] == (8, 2)  # per replica: 16 examples over 8 replicas, on axis 1
    b = estimator(tmp_path / "b", model_fn=batch_major).train(inp, steps=4)
    np.testing.assert_allclose(a.get_variable_value("Dense_0/kernel"), b.get_variable_value("Dense_0/kernel"), rtol=1e-6)
