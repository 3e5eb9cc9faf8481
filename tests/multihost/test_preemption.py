"""Preemption on two processes: a SIGTERM to one of them stops both at the same step
(JAX's preemption sync point), both save it and return from train() normally."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.multihost.test_two_processes import _port

WORKER = os.path.join(os.path.dirname(__file__), "preempt_worker.py")
TIMEOUT = 90


def test_sigterm_to_one_process_stops_both_at_the_same_step_saved(tmp_path):
    port, out, model_dir, total = _port(), tmp_path / "out", tmp_path / "m", 400
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), env.get("PYTHONPATH", "")])
    procs = [
        subprocess.Popen(
            [sys.executable, WORKER, str(i), str(port), str(model_dir), str(total), str(out)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for i in range(2)
    ]
    try:
        deadline = time.monotonic() + TIMEOUT
        while not all(os.path.exists(f"{out}.started{i}") for i in range(2)):
            if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
                pytest.fail("the workers did not start training:\n" + "\n".join(
                    p.communicate(timeout=5)[0][-3000:] if p.poll() is not None else "(running)" for p in procs))
            time.sleep(0.05)
        procs[1].send_signal(signal.SIGTERM)  # one host gets the notice
        logs = [p.communicate(timeout=TIMEOUT)[0] for p in procs]
    except subprocess.TimeoutExpired:
        pytest.fail("the preempted processes did not end")
    finally:
        for p in procs:  # jax.distributed catches SIGTERM: SIGKILL
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]
    results = [json.loads((tmp_path / f"out.{i}.json").read_text()) for i in range(2)]
    assert [r["process_count"] for r in results] == [2, 2]
    assert all(r["preempted"] for r in results), results
    stopped = [r["steps"][-1] for r in results]
    assert stopped[0] == stopped[1] < total, results  # the same step on both hosts
    assert results[0]["steps"] == results[1]["steps"]
    assert results[0]["latest"] == results[1]["latest"] == str(model_dir / str(stopped[0]))
    assert (model_dir / str(stopped[0]) / "state").is_dir()
    assert "Preempted: training stopped at global step" in logs[0] + logs[1]


EVAL_WORKER = os.path.join(os.path.dirname(__file__), "preempt_eval_worker.py")


@pytest.mark.parametrize("call, nproc", [("evaluate", 2)])  # predict on 4: scripts/failure_campaign.py
def test_sigterm_to_one_process_during_inference_raises_preempted_on_all(tmp_path, call, nproc):
    """The agreement travels through JAX's preemption sync point, asked once per loop."""
    port, out, model_dir = _port(), tmp_path / "out", tmp_path / "m"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), env.get("PYTHONPATH", "")])
    procs = [
        subprocess.Popen(
            [sys.executable, EVAL_WORKER, str(i), str(nproc), str(port), str(model_dir), call, str(out)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for i in range(nproc)
    ]
    try:
        deadline = time.monotonic() + TIMEOUT
        while not all(os.path.exists(f"{out}.started{i}") for i in range(nproc)):
            if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
                pytest.fail("the workers did not start:\n" + "\n".join(
                    p.communicate(timeout=5)[0][-3000:] if p.poll() is not None else "(running)" for p in procs))
            time.sleep(0.05)
        sent = time.monotonic()
        procs[-1].send_signal(signal.SIGTERM)
        logs = [p.communicate(timeout=TIMEOUT)[0] for p in procs]
        took = time.monotonic() - sent
    except subprocess.TimeoutExpired:
        pytest.fail(f"the preempted {call}() did not end")
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]
    results = [json.loads((tmp_path / f"out.{i}.json").read_text()) for i in range(nproc)]
    assert all(r["error"] and f"{call}() was preempted (SIGTERM)" in r["error"] for r in results), results
    assert len({r["error"] for r in results}) == 1, results  # the same batch everywhere
    assert len({r["loops"] for r in results}) == 1, results
    assert not any(r["eval_dir"] for r in results)  # no metrics recorded
    assert took < 30, took  # promptly: within a few loops (2 batches of ~20 ms each)
