"""Requests to the object store: none per training step, a bounded set per save.

The training job (request_job.py) runs in its own process behind a counting proxy
(store_proxy.py) in front of the emulator; the figures are in docs/cluster.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

JOB = os.path.join(os.path.dirname(__file__), "request_job.py")
# docs/cluster.md: a save of the small model on gs:// is staged (checkpoint/staging.py):
# one upload per file of the step, nothing else on the step: 11 files whatever the model
# and its OCDBT data files (5-9 in the benchmark runs, more once in a loaded test run:
# their number varies with TensorStore's write batching); besides, the window of a save
# holds at most a deadline probe or two.
SAVE_BOUND = 30
OTHERS_BOUND = 3
EVALUATE_BOUND = 200


def _run(gs_dir: str, url: str) -> dict:
    out = subprocess.run([sys.executable, JOB, url, gs_dir], capture_output=True,
                         text=True, timeout=300)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


@pytest.fixture(scope="module")
def counted(gcs_server, gs_module_dir):
    return _run(gs_module_dir, gcs_server)


def test_training_steps_between_saves_send_no_request(counted):
    assert len(counted["steps"]) == 12
    assert counted["steps"] == [0] * 12  # summaries every step included


def test_a_save_sends_a_bounded_set_and_the_digests_in_one_upload(counted):
    assert [s["step"] for s in counted["saves"]] == [0, 4, 8, 12]
    for save in counted["saves"]:
        assert save["total"] <= SAVE_BOUND, save
        assert save["total"] - save["in_step"]["total"] <= OTHERS_BOUND, save
        # the digests: one upload, computed from the local copy, nothing read back
        assert save["digests"] == ["upload POST"], save
        # each file of the step uploaded once, no existence check, listing, read or delete
        assert save["in_step"] == {"total": save["files"], "upload": save["files"]}, save
    assert counted["latest_checkpoint_result"].endswith("/12")


def test_a_restore_reads_no_file_twice_for_its_digests(counted):
    # verification on gs:// is one listing and two small reads, whatever the checkpoint's size
    assert counted["get_variable_value_result"] == "12"
    assert counted["evaluate"]["total"] <= EVALUATE_BOUND, counted["evaluate"]
