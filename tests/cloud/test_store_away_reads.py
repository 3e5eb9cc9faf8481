"""A store that stays away during reads and exports: `latest_checkpoint()`, a restore,
`get_variable_value`, `export_saved_model` to gs:// and the eval-results log each raise
CheckpointStorageError naming the gs:// path within RunConfig(storage_timeout_s) plus
its probe intervals, not after the clients' own retries (gcsfs ~31 s, TensorStore ~15 min).

The job (store_away_reads_job.py) runs in its own process behind a proxy that answers
503 to every request, or drops every connection, from a chosen request on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tpu_estimator import storage

JOB = os.path.join(os.path.dirname(__file__), "store_away_reads_job.py")
TIMEOUT_S = 2.0
# One probe interval (a tenth of the deadline, at least 0.2 s) for the probe that finds the
# store away, one for the wait's poll, and slack for a loaded 2-core machine.
MARGIN_S = storage.probe_interval(TIMEOUT_S) * 2 + 2.0
WHAT = {
    "latest_checkpoint": ("run", "opening the checkpoints of model_dir"),
    "restore": ("run/4", "reading the checkpoint's metadata"),
    "get_variable_value": ("run", "opening the checkpoints of model_dir"),
    "export": ("export/", "(export_saved_model)"),
    "eval_results": ("run/eval/eval_results.jsonl", "reading eval_results.jsonl"),
}


@pytest.fixture(scope="module")
def results(gcs_server, gs_module_dir):
    out = subprocess.run([sys.executable, JOB, gcs_server, gs_module_dir, str(TIMEOUT_S)],
                         capture_output=True, text=True, timeout=300)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.parametrize("case", list(WHAT))
def test_a_store_that_stays_away_ends_the_call_within_the_deadline(results, gs_module_dir, case):
    r = results[case]
    where, what = WHAT[case]
    assert r["error"] == "CheckpointStorageError", r
    assert f"path='{gs_module_dir}/{where}" in r["message"], r
    assert what in r["message"], r
    assert "did not answer for 2 s (storage_timeout_s)" in r["message"], r
    assert "storage_timeout_s=" in r["message"]  # the fix names the setting
    # (from the request that found the store away: the deadline counts from the first
    # failure seen after the store's last answer, which comes after it; storage.py)
    assert TIMEOUT_S <= r["seconds"] <= TIMEOUT_S + MARGIN_S, r
