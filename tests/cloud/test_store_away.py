"""A store that stays away: train() raises CheckpointStorageError naming the gs:// path
within RunConfig(storage_timeout_s) plus its probe interval, whichever writer meets it.

The job (store_away_job.py) runs in its own process behind a proxy that, mid-run,
answers 503 to every request, or drops every connection unanswered.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import sys

import pytest

from tpu_estimator import storage

JOB = os.path.join(os.path.dirname(__file__), "store_away_job.py")
TIMEOUT_S = 3.0
# The deadline, one probe interval (a tenth of it) for the probe that finds the store
# away, and slack for a loaded 2-core machine (the waits poll every interval).
MARGIN_S = storage.probe_interval(TIMEOUT_S) * 2 + 2.0


@pytest.fixture(scope="module")
def results(gcs_server, gs_module_dir):
    out = subprocess.run([sys.executable, JOB, gcs_server, gs_module_dir, str(TIMEOUT_S)],
                         capture_output=True, text=True, timeout=300)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.parametrize("case", ["503", "gone"])
def test_a_store_that_stays_away_ends_train_within_the_deadline(results, gs_module_dir, case):
    r = results[case]
    assert r["error"] == "CheckpointStorageError", r
    assert f"path='{gs_module_dir}/{case}'" in r["message"], r
    assert "did not answer for 3 s (storage_timeout_s)" in r["message"], r
    assert "storage_timeout_s=" in r["message"]  # the fix names the setting
    assert TIMEOUT_S <= r["seconds"] <= TIMEOUT_S + MARGIN_S, r


def test_a_store_that_answers_never_trips_the_deadline(gs_dir):
    """A wait 2.5 deadlines long on a healthy store: every probe is answered."""
    from tpu_estimator.checkpoint import listing

    listing.write_bytes(gs_dir, "x", b"x")  # the client made (~1 s), as a save would have it
    storage.set_timeout_s(2)  # a probe every 0.2 s
    try:
        done = threading.Event()
        threading.Timer(5, done.set).start()
        start = time.monotonic()
        storage.wait_for(done, uri=gs_dir, what="a long save")
        assert time.monotonic() - start >= 4.9
    finally:
        storage.set_timeout_s(None)
