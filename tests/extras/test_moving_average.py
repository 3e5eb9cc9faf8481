"""TPUConfig(moving_average_decay=...): averaged weights as a StateComponent (model/components.py).

After each step `avg = decay * avg + (1 - decay) * params` from the initial parameters;
training uses the raw parameters, evaluate/predict/export the averages; checkpointed,
resumed exactly, read as `moving_average/<name>`; 8 devices equal 1 device.
"""

from __future__ import annotations

import numpy as np
import pytest

import tpu_estimator as te
from tests.estimator.models import batches_fn, estimator, make_data

NAMES = ["Dense_0/bias", "Dense_0/kernel", "Dense_1/bias", "Dense_1/kernel"]
X, Y = make_data(256)
TRAIN = batches_fn(X, Y, repeat=100)
EVAL = batches_fn(X[:64], Y[:64])


def averaged(model_dir, decay, *, steps, use_tpu=True, calls=1, ipl=2, input_fn=TRAIN):
    est = None
    for _ in range(calls):  # a new estimator per call: each resumes from the checkpoint
        est = estimator(model_dir, use_tpu=use_tpu, tpu_config=te.TPUConfig(ipl, moving_average_decay=decay))
        est.train(input_fn, steps=steps // calls)
    return est


def weights(est, prefix=""):
    return {n: est.get_variable_value(prefix + n) for n in NAMES}


def forward(w, x):
    h = np.maximum(x @ w["Dense_0/kernel"] + w["Dense_0/bias"], 0)
    return h @ w["Dense_1/kernel"] + w["Dense_1/bias"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Step by step (one step per call): the raw parameters after each step, and the run."""
    d = tmp_path_factory.mktemp("ema")
    raw, avg = [], []
    for _ in range(3):
        est = averaged(d, 0.75, steps=1, ipl=1)
        raw.append(weights(est))
        avg.append(weights(est, "moving_average/"))
    return d, est, raw, avg


def test_averages_follow_the_formula(trained, tmp_path):
    _, _, raw, avg = trained
    initial = weights(averaged(tmp_path, 1.0, steps=1, ipl=1), "moving_average/")  # decay 1: stays initial
    expected = initial
    for step in range(3):
        expected = {n: 0.75 * expected[n] + 0.25 * raw[step][n] for n in NAMES}
        for n in NAMES:
            np.testing.assert_allclose(avg[step][n], expected[n], rtol=1e-5, atol=1e-6)
    assert not np.allclose(avg[-1]["Dense_0/kernel"], raw[-1]["Dense_0/kernel"])  # averages differ


def test_list_variables_names_the_averages(trained):
    d, _, _, _ = trained
    listed = dict(te.list_variables(str(d)))
    for n in NAMES:
        assert listed["moving_average/" + n] == listed[n]


def test_evaluate_predict_and_export_use_the_averages(trained, tmp_path):
    d, est, _, avg = trained
    logits = forward(avg[-1], X[:64])
    out = est.evaluate(EVAL)
    shifted = logits - logits.max(1, keepdims=True)
    loss = np.mean(np.log(np.exp(shifted).sum(1)) - shifted[np.arange(64), Y[:64]])
    np.testing.assert_allclose(out["loss"], loss, rtol=1e-4)
    predicted = np.stack([p["logits"] for p in est.predict(batches_fn(X[:64], None))])
    np.testing.assert_allclose(predicted, logits, rtol=1e-4, atol=1e-5)

    def receiver():
        spec = te.TensorSpec((None, X.shape[1]), np.float32)
        return te.ServingInputReceiver({"x": spec}, {"x": spec})

    export = est.export_saved_model(str(tmp_path / "export"), receiver)
    served = te.load_exported(export).signatures["serving_default"](x=X[:64])
    np.testing.assert_allclose(np.asarray(served["logits"]), logits, rtol=1e-4, atol=1e-5)


def test_resume_is_exact_and_eight_devices_equal_one(tmp_path):
    same = batches_fn(X[:16], Y[:16], repeat=100)  # one batch: a restarted input_fn gives the same steps
    once = weights(averaged(tmp_path / "once", 0.9, steps=4, input_fn=same), "moving_average/")
    twice = weights(averaged(tmp_path / "twice", 0.9, steps=4, calls=2, input_fn=same), "moving_average/")
    one = weights(averaged(tmp_path / "one", 0.9, steps=4, use_tpu=False, input_fn=same), "moving_average/")
    for n in NAMES:
        np.testing.assert_array_equal(twice[n], once[n])
        np.testing.assert_allclose(one[n], once[n], rtol=1e-5, atol=1e-6)


def test_a_checkpoint_without_averages_is_an_error_naming_the_setting(tmp_path):
    estimator(tmp_path).train(TRAIN, steps=2)
    est = estimator(tmp_path, tpu_config=te.TPUConfig(2, moving_average_decay=0.9))
    with pytest.raises(ValueError, match="moving_average_decay"):
        est.evaluate(EVAL)
    with pytest.raises(ValueError, match="moving_average_decay"):
        est.train(TRAIN, steps=2)


@pytest.mark.parametrize(
    "decay, error", [(1.5, ValueError), (-0.1, ValueError), ("0.9", TypeError), (True, TypeError)]
)
def test_moving_average_decay_is_checked(decay, error):
    with pytest.raises(error, match="moving_average_decay"):
        te.TPUConfig(moving_average_decay=decay)


def test_a_model_without_settings_never_imports_the_extras_or_embedding_packages(tmp_path):
    """train, evaluate, predict, export and the variable reader of a plain model import no
    component's package (they run the components' hooks generically)."""
    import subprocess
    import sys

    code = (
        "import sys, numpy as np, tpu_estimator as te\n"
        "from tests.estimator.models import batches_fn, estimator, make_data\n"
        "x, y = make_data(64)\n"
        f"est = estimator({str(tmp_path / 'run')!r}, use_tpu=False)\n"
        "est.train(batches_fn(x, y, repeat=2), steps=2)\n"
        "est.evaluate(batches_fn(x, y))\n"
        "list(est.predict(batches_fn(x[:16], None)))\n"
        f"path = est.export_saved_model({str(tmp_path / 'export')!r}, "
        "te.build_raw_serving_input_receiver_fn({'x': x[:1]}))\n"
        "names = [n for n, _ in te.list_variables(est.model_dir)] + [n for n, _ in te.list_variables(path)]\n"
        "assert 'Dense_0/kernel' in names, names\n"
        "print(sorted(m for m in sys.modules if m.startswith(('tpu_estimator.extras', 'tpu_estimator.embedding'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines()[-1] == "[]", out.stdout.splitlines()[-1]


def test_turning_the_averages_off_continues_from_the_raw_weights(tmp_path):
    est = averaged(tmp_path, 0.9, steps=2)
    raw = weights(est)
    plain = estimator(tmp_path)
    assert plain.evaluate(EVAL)["global_step"] == 2
    plain.train(TRAIN, steps=2)
    assert plain.get_variable_value("global_step") == 4
    assert "moving_average/Dense_0/kernel" not in dict(te.list_variables(str(tmp_path)))
    assert not np.allclose(weights(plain)["Dense_0/kernel"], raw["Dense_0/kernel"])
