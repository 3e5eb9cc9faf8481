"""Two processes on 127.0.0.1 (4 CPU devices each) train, evaluate and predict like one
process with 8 devices, and each restores the other's checkpoint."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from tests.multihost.multihost_procs import finish

WORKER = os.path.join(os.path.dirname(__file__), "worker.py")
TIMEOUT = 60


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(nproc: int, model_dir, steps: int, out) -> dict:
    devices = 8 // nproc
    port = _port()
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS",)}
    env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), env.get("PYTHONPATH", "")])
    procs = [
        subprocess.Popen(
            [sys.executable, WORKER, str(devices), str(i), str(nproc), str(port), str(model_dir), str(steps), str(out)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for i in range(nproc)
    ]
    logs = finish(procs, TIMEOUT, "multi-process training")
    return dict(np.load(out))


@pytest.fixture(scope="module")
def one_host(tmp_path_factory):
    """(results, folder) of one process with 8 devices, 4 steps, every input mode PER_HOST_V1:
    the reference of the tests below, run once for all of them (each started its own, the same
    run). Its model_dir, folder / "b", is continued by two processes in the first test."""
    base = tmp_path_factory.mktemp("one_host")
    with pytest.MonkeyPatch.context() as mp:
        for variable in ("WORKER_INPUT_MODE", "WORKER_EVAL_MODE", "WORKER_EMBEDDING", "WORKER_EVAL_FIRST"):
            mp.delenv(variable, raising=False)
        return run(1, base / "b", 4, base / "one.npz"), base


def test_two_processes_match_one_and_share_checkpoints(tmp_path, one_host):
    two = run(2, tmp_path / "a", 4, tmp_path / "two.npz")
    one, base = one_host
    assert (two["procs"], one["procs"]) == (2, 1)
    for k in set(one) - {"procs"}:  # parameters, and evaluate() over uneven hosts
        np.testing.assert_allclose(two[k], one[k], rtol=1e-5, atol=1e-6, err_msg=k)
    # predictions: each host gets its own rows, in its input order
    per_host = [np.load(f"{tmp_path / 'two.npz'}.predict{i}.npy") for i in range(2)]
    assert [len(p) for p in per_host] == [60, 40]
    np.testing.assert_allclose(
        np.concatenate(per_host), np.load(f"{base / 'one.npz'}.predict0.npy"), rtol=1e-5, atol=1e-6
    )
    # each continues the other's checkpoint; one process first evaluates the checkpoint of
    # two as it was saved (read whatever topology saved it)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WORKER_EVAL_FIRST", "1")
        one_from_two = run(1, tmp_path / "a", 6, tmp_path / "c.npz")
    evaluated = dict(np.load(tmp_path / "c.npz.first.npz"))
    assert (evaluated["procs"], evaluated["step"]) == (1, 4)
    for k in ("eval_loss", "eval_accuracy"):
        np.testing.assert_allclose(evaluated[k], two[k], rtol=1e-5, atol=1e-6, err_msg=k)
    two_from_one = run(2, base / "b", 6, tmp_path / "d.npz")
    assert one_from_two["step"] == two_from_one["step"] == 6
    for k in set(one) - {"procs"}:
        np.testing.assert_allclose(one_from_two[k], two_from_one[k], rtol=1e-5, atol=1e-6, err_msg=k)


@pytest.mark.parametrize(
    "variable, mode, nproc",
    [("WORKER_INPUT_MODE", "BROADCAST", 4), ("WORKER_EVAL_MODE", "SLICED", 2)],
)
def test_input_from_host_zero_matches_one_host(tmp_path, monkeypatch, one_host, variable, mode, nproc):
    # BROADCAST (train, eval, predict) / SLICED (eval, predict): input_fn runs on host 0
    # only; the other hosts receive its batches (raw buffers behind a typed header).
    monkeypatch.setenv(variable, mode)
    two = run(nproc, tmp_path / "a", 4, tmp_path / "two.npz")
    one, base = one_host  # one process, PER_HOST_V1
    for k in set(one) - {"procs"}:  # BROADCAST: every replica saw the whole batch, same mean gradient
        np.testing.assert_allclose(two[k], one[k], rtol=1e-5, atol=1e-6, err_msg=k)
    expected = np.load(f"{base / 'one.npz'}.predict0.npy")
    for i in range(nproc):  # each host yields the predictions of host 0's input
        np.testing.assert_allclose(np.load(f"{tmp_path / 'two.npz'}.predict{i}.npy"), expected, rtol=1e-5, atol=1e-6)


def test_embedding_tables_over_two_processes_match_one(tmp_path, monkeypatch):
    """The tables' rows sharded over the 8 devices of two processes: ids looked up across
    hosts (routed to their owners or all-gathered, per table); trains, evaluates (uneven hosts) and predicts as one."""
    monkeypatch.setenv("WORKER_EMBEDDING", "1")
    two = run(2, tmp_path / "a", 4, tmp_path / "two.npz")
    one = run(1, tmp_path / "b", 4, tmp_path / "one.npz")
    assert two["table"].shape == (37, 4)
    for k in set(one) - {"procs"}:
        np.testing.assert_allclose(two[k], one[k], rtol=1e-5, atol=1e-6, err_msg=k)
    per_host = [np.load(f"{tmp_path / 'two.npz'}.predict{i}.npy") for i in range(2)]
    np.testing.assert_allclose(
        np.concatenate(per_host), np.load(f"{tmp_path / 'one.npz'}.predict0.npy"), rtol=1e-5, atol=1e-6
    )
