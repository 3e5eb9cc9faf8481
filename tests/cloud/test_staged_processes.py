"""Staged saves of two processes on gs:// (checkpoint/process_parts.py): each process stages
into its own local directory and uploads its part; process 0 merges the OCDBT trees on the
store and commits. The job (processes_job.py) runs behind a counting proxy (store_proxy.py)
started here; the figures are in docs/cluster.md."""

from __future__ import annotations

import collections
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.parse

import jax
import numpy as np
import pytest

import cloud_model as cm
import tpu_estimator as te
from store_proxy import StoreProxy
from tpu_estimator.checkpoint import listing
from tpu_estimator.checkpoint.manager import Checkpointer

JOB = os.path.join(os.path.dirname(__file__), "processes_job.py")
NPROC = 2
TIMEOUT = 240


def _start(proxies: list[StoreProxy], model_dir: str, out: str) -> list[subprocess.Popen]:
    """The job's processes, process i's clients pointed at `proxies[i]`."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for i, proxy in enumerate(proxies):
        env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
        env.update(STORAGE_EMULATOR_HOST=proxy.url, TENSORSTORE_GCS_HTTP_URL=proxy.url)
        env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), env.get("PYTHONPATH", "")])
        procs.append(subprocess.Popen([sys.executable, JOB, model_dir, str(i), str(NPROC), str(port), out],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return procs


def _kill(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.wait()


@pytest.fixture(scope="module")
def two(gcs_server, gs_module_dir, tmp_path_factory):
    """Two processes train 8 steps (checkpoints 0, 4, 8), then evaluate with a new
    estimator and train it on to step 12: (model_dir, their results, the requests of each
    step directory up to checkpoint 8's commit marker)."""
    model_dir, out = f"{gs_module_dir}/two", str(tmp_path_factory.mktemp("two") / "out")
    proxy = StoreProxy(gcs_server)
    procs = _start([proxy] * NPROC, model_dir, out)
    try:
        logs = [p.communicate(timeout=TIMEOUT)[0] for p in procs]
    finally:
        _kill(procs)
        proxy.close()
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]
    log = [(kind, urllib.parse.unquote(path)) for kind, _, path in proxy.log]
    root = model_dir.split("/", 3)[3]
    # training ends with the upload of checkpoint 8's commit marker; evaluate() reads on
    end = [i for i, (kind, path) in enumerate(log) if kind == "upload" and f"{root}/8/commit_success.txt" in path]
    assert len(end) == 1, end
    by_step = collections.defaultdict(list)
    for kind, path in log[:end[0] + 1]:
        for step in (0, 4, 8):
            if f"{root}/{step}/" in path:
                by_step[step].append((kind, path))
    return model_dir, dict(np.load(f"{out}.npz")), by_step, out


def test_the_local_copies_are_removed(two):
    _, _, _, out = two
    for i in range(NPROC):  # each process's own TMPDIR (hosts share no disk), empty at exit
        assert not [n for n in os.listdir(f"{out}.tmp{i}") if n.startswith("tpu_estimator_staging_")], i


def test_a_save_uploads_each_file_once_and_a_constant_set(two):
    """Every file of the step uploaded once, by whichever process wrote it; besides, the merge on the store (a listing
    of the process trees, their manifests and nodes, the root manifest's absence) and the
    digests (one listing, the step metadata): no existence check, no deletion."""
    model_dir, _, by_step, _ = two
    for step in (0, 4, 8):
        files = listing.list_files(f"{model_dir}/{step}")
        uploads = collections.Counter(p.split("name=")[-1].split("&")[0].split(f"/{step}/", 1)[1]
                                      for k, p in by_step[step] if k == "upload")
        assert uploads == collections.Counter(set(files)), (step, uploads, sorted(files))
        rest = collections.Counter(k for k, _ in by_step[step] if k != "upload")
        assert rest["list"] == 2 and rest["download"] <= 3 * NPROC + 2, (step, rest)
        assert set(rest) <= {"list", "download"}, (step, rest)
        assert "state/ocdbt.process_1/manifest.ocdbt" in files and "commit_success.txt" in files


def test_restored_onto_two_processes_and_onto_one(two):
    """The two processes' evaluation of checkpoint 8 restored from the store equals theirs
    of the trained state in memory; on this process (8 devices) the checkpoint gives the
    trained parameters exactly; the two processes' save after that restore (checkpoint 12)
    is committed, and its whole state (optimizer slots included) reads back here."""
    model_dir, results, _, _ = two
    np.testing.assert_array_equal(results["loss_restored"], results["loss_in_memory"])
    names = [n for n in results if not n.startswith("loss")]
    assert len(names) == 4, names
    for name in names:
        np.testing.assert_array_equal(te.load_variable(f"{model_dir}/8", name), results[name], err_msg=name)
    # the two processes then trained on from checkpoint 8 and saved 12 (before the fix,
    # process 1 waited 600 s for a metadata directory only process 0 makes, and the save failed)
    est = te.TPUEstimator(cm.model_fn, config=te.RunConfig(model_dir=model_dir), train_batch_size=16)
    assert est.latest_checkpoint() == f"{model_dir}/12"
    reader = Checkpointer(model_dir, read_only=True)
    try:
        raw = reader.restore_raw(12)
    finally:
        reader.close()
    assert int(raw["step"]) == 12
    params = sorted(a.shape for a in jax.tree.leaves(raw["params"]))
    slots = sorted(a.shape for a in jax.tree.leaves(raw["opt_state"]) if np.ndim(a))
    assert len(params) == 4 and slots == sorted(params * 2), (params, slots)  # Adam's mu and nu


def test_a_process_killed_before_its_part_is_up_leaves_no_step(gcs_server, gs_dir, tmp_path):
    """SIGKILL of process 1 while the upload of its part of checkpoint 0 is held (its own
    proxy holds it; process 0's requests go through): process 0 uploads its part and waits
    at the barrier, never committing step 0; readers take no step."""
    free, holding = StoreProxy(gcs_server), StoreProxy(gcs_server)
    target = f"{gs_dir.split('/', 3)[3]}/0/state/ocdbt.process_1/"
    holding.go_away(lambda kind, method, path: kind == "upload" and target in path, "hold")
    procs = _start([free, holding], gs_dir, str(tmp_path / "out"))
    try:
        deadline = time.monotonic() + TIMEOUT
        while not holding.held and time.monotonic() < deadline and all(p.poll() is None for p in procs):
            time.sleep(0.05)
        assert holding.held, [p.poll() for p in procs]
        procs[1].send_signal(signal.SIGKILL)
        procs[1].wait()
        time.sleep(3)  # time enough for process 0 to commit, if it did not wait for process 1
        assert procs[0].poll() is None
        files = listing.list_files(f"{gs_dir}/0")
        assert "state/ocdbt.process_0/manifest.ocdbt" in files and "commit_success.txt" not in files, files
    finally:
        _kill(procs)
        free.close()
        holding.close()
    assert "commit_success.txt" not in listing.list_files(f"{gs_dir}/0")
    reader = Checkpointer(gs_dir, read_only=True)
    try:
        assert reader.all_steps() == []
    finally:
        reader.close()
    assert cm.estimator(gs_dir).latest_checkpoint() is None


def test_each_process_uploads_only_its_own_part():
    from tpu_estimator.checkpoint.process_parts import part

    names = ["_CHECKPOINT_METADATA", "commit_success.txt", "input/metadata", "state/_METADATA",
             "state/_sharding", "state/manifest.ocdbt", "state/d/ab", "state/array_metadatas/process_0",
             "state/array_metadatas/process_1", "state/array_metadatas/process_10",
             "state/ocdbt.process_0/manifest.ocdbt", "state/ocdbt.process_0/d/cd",
             "state/ocdbt.process_1/manifest.ocdbt", "state/ocdbt.process_1/d/ef",
             "state/ocdbt.process_10/d/gh"]
    # process 0: all but its local root tree (merged on the store); the marker is left
    # out by the upload itself (staging._put)
    assert part(names, 0) == [n for n in names if n not in ("state/manifest.ocdbt", "state/d/ab")]
    assert part(names, 1) == ["state/array_metadatas/process_1", "state/ocdbt.process_1/manifest.ocdbt",
                              "state/ocdbt.process_1/d/ef"]
