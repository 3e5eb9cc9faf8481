"""Staged saves on gs:// (checkpoint/staging.py): what is kept, what is deleted, where the
local copy goes, and a process killed before a step's commit marker. The requests they
send are counted in test_requests.py; a save cut at its marker by a store that stays
away in test_store_away.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest

import cloud_model as cm
import tpu_estimator as te
from tpu_estimator.checkpoint import listing
from tpu_estimator.checkpoint.manager import Checkpointer


@pytest.fixture(scope="module")
def kept_two(gs_module_dir):
    """12 steps with a checkpoint every 4 (0, 4, 8, 12) and keep_checkpoint_max=2."""
    model_dir = f"{gs_module_dir}/kept_two"
    cfg = te.RunConfig(model_dir=model_dir, tpu_config=te.TPUConfig(iterations_per_loop=4),
                       save_checkpoints_steps=4, keep_checkpoint_max=2, tf_random_seed=0,
                       log_step_count_steps=None)
    est = te.TPUEstimator(cm.model_fn, config=cfg, train_batch_size=16, eval_batch_size=16)
    est.train(cm.train_input_fn, max_steps=12)
    return est


def test_keep_checkpoint_max_deletes_the_older_steps_whole(kept_two):
    model_dir = kept_two.model_dir
    reader = Checkpointer(model_dir, read_only=True)
    try:
        assert reader.all_steps() == [8, 12]
    finally:
        reader.close()
    assert listing.list_files(f"{model_dir}/0") == {} and listing.list_files(f"{model_dir}/4") == {}
    kept = listing.list_files(f"{model_dir}/8")
    assert "commit_success.txt" in kept and "tpu_estimator_digests.json" in kept


def test_a_new_estimator_restores_the_newest_staged_step(kept_two):
    fresh = te.TPUEstimator(cm.model_fn, config=kept_two.config, train_batch_size=16, eval_batch_size=16)
    assert fresh.latest_checkpoint() == f"{kept_two.model_dir}/12"
    assert fresh.get_variable_value("global_step") == 12  # (bit-identical resumes: test_gcs.py)


def test_keep_every_n_hours_keeps_the_oldest_step_of_the_hour(kept_two):
    """(Runs after the two above: it trains on.) A new estimator with keep_checkpoint_max=1
    and keep_checkpoint_every_n_hours=1 trains to 16: 8 stays (the first of the hour, its
    commit time read from the store), 12 goes, 16 is the newest."""
    cfg = kept_two.config.replace(keep_checkpoint_max=1, keep_checkpoint_every_n_hours=1)
    est = te.TPUEstimator(cm.model_fn, config=cfg, train_batch_size=16, eval_batch_size=16)
    est.train(cm.train_input_fn, max_steps=16)
    reader = Checkpointer(kept_two.model_dir, read_only=True)
    try:
        assert reader.all_steps() == [8, 16]
    finally:
        reader.close()


def test_a_staging_directory_that_cannot_be_made_is_named_with_the_fix(gs_dir, tmp_path, monkeypatch):
    not_a_dir = tmp_path / "a_file"
    not_a_dir.write_text("x")
    monkeypatch.setattr(tempfile, "tempdir", str(not_a_dir))
    with pytest.raises(te.CheckpointStorageError, match=r"local staging directory.*a_file.*Set the TMPDIR"):
        Checkpointer(gs_dir)


def test_staging_directories_of_ended_processes_are_removed(gs_dir, tmp_path, monkeypatch):
    ended = subprocess.Popen(["true"])
    ended.wait()
    stale = tmp_path / f"tpu_estimator_staging_{ended.pid}_abc"
    (stale / "8" / "state").mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    checkpointer = Checkpointer(gs_dir)
    try:
        assert not stale.exists()
        assert len(list(tmp_path.glob("tpu_estimator_staging_*"))) == 1  # this process's own
    finally:
        checkpointer.close()
    assert list(tmp_path.glob("tpu_estimator_staging_*")) == []  # removed at close


def test_a_process_killed_before_its_commit_marker_leaves_no_step(gcs_server, gs_dir, tmp_path):
    """SIGKILL while checkpoint 4's commit marker is being uploaded (every other file of the
    step is on the store): no reader takes step 4; a new estimator restores step 0."""
    job = os.path.join(os.path.dirname(__file__), "kill_mid_save_job.py")
    log = tmp_path / "log.txt"
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, job, gcs_server, gs_dir], stdout=subprocess.PIPE,
                                stderr=err, text=True)
    try:
        line = ""
        deadline = time.monotonic() + 240
        while not line.startswith("HELD") and time.monotonic() < deadline and proc.poll() is None:
            line = proc.stdout.readline()
        assert line.startswith("HELD"), f"{line!r}; {log.read_text()[-3000:]}"
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    files = listing.list_files(f"{gs_dir}/4")
    assert "commit_success.txt" not in files and "state/manifest.ocdbt" in files, sorted(files)
    reader = Checkpointer(gs_dir, read_only=True)
    try:
        assert reader.all_steps() == [0]
    finally:
        reader.close()
    assert cm.estimator(gs_dir).latest_checkpoint() == f"{gs_dir}/0"
