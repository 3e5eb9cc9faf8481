"""examples/digits.py (the demo's job) run as a program with its output piped, as CI or `> log`
would: training logs TF1's `loss = ..., step = ...` lines (no terminal, no progress bar), and
the export, served, answers TF Serving's `:classify` with the class labels. TensorFlow is made
unimportable in it (`sys.modules["tensorflow"] = None`), as in the demo's install (the
`examples` extra has no TensorFlow): no SavedModel is written."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "digits.py"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "TPU_ESTIMATOR_PROGRESS")}
    root = str(EXAMPLE.parents[1])
    env["PYTHONPATH"] = os.pathsep.join([root, env["PYTHONPATH"]]) if env.get("PYTHONPATH") else root
    model_dir = tmp_path_factory.mktemp("digits")
    code = (
        "import runpy, sys\n"
        "sys.modules['tensorflow'] = None\n"
        f"sys.argv = [{str(EXAMPLE)!r}, '--model_dir', {str(model_dir)!r}]\n"
        f"runpy.run_path({str(EXAMPLE)!r}, run_name='__main__')\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True, text=True, timeout=600, env=env, cwd=str(model_dir),
    )


def test_the_demo_succeeds(run):
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    assert "exported and served model agree with predict(): True" in run.stdout


def test_training_logs_loss_and_step_when_not_on_a_terminal(run):
    steps = [int(s) for s in re.findall(r"^INFO:tpu_estimator:loss = [0-9.e+-]+, step = (\d+) ", run.stderr,
                                        re.M)]
    assert steps == [100, 200, 300, 400, 500, 600], run.stderr[-3000:]


def test_classify_answers_labels(run):
    line = next(l for l in run.stdout.splitlines() if l.startswith(":classify"))
    labels = re.findall(r":classify (\S*) ([0-9.]+)", line)
    assert len(labels) == 6
    assert all(label.isdigit() for label, _ in labels), line  # TF Serving's "" when classes are missing
