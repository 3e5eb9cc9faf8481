"""A store that stays away: train() raises CheckpointStorageError naming the gs:// path
within RunConfig(storage_timeout_s) plus its probe interval, whichever writer meets it;
and the process that met it, the store still away, then exits by itself soon after.

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
from tpu_estimator.errors import CheckpointStorageError

JOB = os.path.join(os.path.dirname(__file__), "store_away_job.py")
TIMEOUT_S = 3.0
# The deadline, one probe interval (a tenth of it) for the probe that finds the store
# away, and slack for a loaded 2-core machine (the waits poll every interval).
MARGIN_S = storage.probe_interval(TIMEOUT_S) * 2 + 2.0
# After the raise, the clients' own calls end within gcsfs's longest backoff (16 s plus up
# to 1 s of jitter: a call asleep between tries when the deadline passes fails at its next
# try) and TensorStore's last retry (storage.client_retries: about one deadline after its
# first failed try, which came before the raise); plus slack for a loaded 2-core machine.
EXIT_BOUND_S = 17.0 + 5.0


@pytest.fixture(scope="module")
def results(gcs_server, gs_module_dir, tmp_path_factory):
    """The job's RESULT, plus `exit_seconds`: from the raise in the "exit" case (the store
    kept away) to the process's end (None: it had not ended EXIT_BOUND_S + 30 s later)."""
    err = tmp_path_factory.mktemp("store_away") / "stderr.txt"
    with open(err, "w") as stderr:
        proc = subprocess.Popen([sys.executable, JOB, gcs_server, gs_module_dir, str(TIMEOUT_S),
                                 "503,gone,marker,exit"], stdout=subprocess.PIPE, stderr=stderr, text=True)
        try:
            lines = []
            for line in proc.stdout:  # up to the RESULT line, printed once the cases ran
                if line.startswith("RESULT "):
                    lines.append(line)
                    break
            try:
                proc.wait(timeout=EXIT_BOUND_S + 30)
                exited_at = time.time()
            except subprocess.TimeoutExpired:
                exited_at = None
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert lines, err.read_text()[-3000:]
    out = json.loads(lines[-1][len("RESULT "):])
    raised_at = out["exit"].get("raised_at")
    out["exit_seconds"] = None if exited_at is None or raised_at is None else exited_at - raised_at
    out["returncode"] = proc.returncode
    return out


@pytest.mark.parametrize("case", ["503", "gone"])
def test_a_store_that_stays_away_ends_train_within_the_deadline(results, gs_module_dir, case):
    r = results[case]
    assert r["error"] == "CheckpointStorageError", r
    assert f"path='{gs_module_dir}/{case}'" in r["message"], r
    assert "did not answer for 3 s (storage_timeout_s)" in r["message"], r
    assert "storage_timeout_s=" in r["message"]  # the fix names the setting
    # The deadline counts from the first failure seen after the store's last answer, so not
    # before the fault ("seconds" counts from just before it; storage.py's docstring).
    assert TIMEOUT_S <= r["seconds"] <= TIMEOUT_S + MARGIN_S, r


def test_a_save_cut_at_its_commit_marker_raises_and_leaves_the_rest_uploaded(results, gs_module_dir):
    """A staged save on gs:// uploads its commit marker last (checkpoint/staging.py): cut
    there, train() raises within the deadline with every other file of the step on the
    store. Once the store is back, gcsfs's retry of the marker (still running in the
    upload thread) may land: a new estimator then takes step 4, whole and verified, else
    step 0. (A process killed before its marker: test_staged_save.py.)"""
    r = results["marker"]
    assert r["error"] == "CheckpointStorageError", r
    assert f"path='{gs_module_dir}/marker'" in r["message"], r
    assert TIMEOUT_S <= r["seconds"] <= TIMEOUT_S + MARGIN_S, r
    files = r["step_4_files"]
    assert {"_CHECKPOINT_METADATA", "tpu_estimator_digests.json", "state/manifest.ocdbt"} <= set(files), files
    assert r["latest_after"] in (0, 4), r  # latest_checkpoint() verified it against its digests


def test_the_process_that_met_the_error_exits_by_itself_soon_after(results):
    """The store stays away after train() raised: nothing the clients still run may hold
    the process at exit (TensorStore's default retries took up to ~15 min, gcsfs's ~31-36 s)."""
    r = results["exit"]
    assert r["error"] == "CheckpointStorageError", r
    assert results["exit_seconds"] is not None, (
        f"the job had not ended {EXIT_BOUND_S + 30:g} s after train() raised (killed)")
    print(f"exited {results['exit_seconds']:.1f} s after train() raised")  # (pytest -rA shows it)
    assert results["exit_seconds"] <= EXIT_BOUND_S, results["exit_seconds"]
    assert results["returncode"] == 0, results["returncode"]


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


@pytest.fixture()
def slow_store(gcs_server, monkeypatch):
    """A proxy in front of the emulator that every gcsfs client of this process goes
    through (STORAGE_EMULATOR_HOST is read per request), and a 2 s deadline."""
    from store_proxy import StoreProxy

    proxy = StoreProxy(gcs_server)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
    storage.set_timeout_s(2)  # a probe every 0.2 s, each given 3 s to answer
    try:
        yield proxy
    finally:
        storage.set_timeout_s(None)
        proxy.back()
        proxy.close()


def test_a_slow_store_that_then_goes_away_is_given_the_whole_deadline(slow_store, gs_dir):
    """Each answer takes 1.5 s (longer than a probe interval) through a wait that ends with
    its probe unanswered; then every connection is dropped: the next wait raises no sooner
    than the deadline after the fault. (Before, the deadline counted from when the slow
    probe was sent, and such a wait raised 1.0-1.1 s after the fault; with staged saves in CI,
    1.36 s and 2.53 s after it for a 3 s deadline.)"""
    slow_store.delay_s = 1.5  # slow but healthy
    done = threading.Event()

    def end_the_wait() -> None:  # 1.3 s after its second probe was sent (answered at 1.5 s)
        while slow_store.arrived < 2:
            time.sleep(0.01)
        time.sleep(1.3)
        done.set()

    threading.Thread(target=end_the_wait, daemon=True).start()
    storage.wait_for(done, uri=gs_dir, what="a slow save")  # answered: it does not raise
    slow_store.gone = True  # a probe is in flight: dropped when its 1.5 s are up
    fault = time.monotonic()
    with pytest.raises(CheckpointStorageError, match=r"did not answer for 2 s \(storage_timeout_s\) "
                       r"while waiting after the fault"):
        storage.wait_for(threading.Event(), uri=gs_dir, what="waiting after the fault")
    took = time.monotonic() - fault
    print(f"raised {took:.2f} s after the fault")  # (pytest -rA shows it)
    assert 2.0 <= took <= 2.0 + storage.probe_interval(2) * 2 + 2.0, took


def test_a_store_away_for_less_than_the_deadline_does_not_trip_it(slow_store, gs_dir):
    """Every connection dropped for 1.4 s of a 2 s deadline, then answered again: the wait
    goes on until its work is done."""
    done = threading.Event()
    threading.Timer(3.5, done.set).start()
    threading.Timer(0.3, lambda: setattr(slow_store, "gone", True)).start()
    threading.Timer(1.7, lambda: setattr(slow_store, "gone", False)).start()
    start = time.monotonic()
    storage.wait_for(done, uri=gs_dir, what="a save through an outage")
    assert time.monotonic() - start >= 3.4


def test_the_clients_own_retries_add_up_to_the_deadline():
    """TensorStore's backoff (no jitter) sums to the clients' deadline, which leaves the
    waits about two probe intervals to raise first."""
    for timeout in (1, 3, 10, 120, 600):
        retries = storage.client_retries(timeout)
        initial = float(retries["initial_delay"].rstrip("s"))
        longest = float(retries["max_delay"].rstrip("s"))
        delays = [min(initial * 2**i, longest) for i in range(retries["max_retries"])]
        budget = storage.client_deadline(timeout)
        assert budget >= timeout + 2 * storage.probe_interval(timeout)
        assert sum(delays) >= budget > sum(delays[:-1]), (timeout, retries)
    assert storage.client_retries(120) == {"max_retries": 9, "initial_delay": "1s", "max_delay": "30s"}


def test_gcsfs_requests_end_at_the_deadline_and_go_on_once_the_store_is_back(gcs_server, gs_dir):
    """gcsfs's own retries (6 tries over ~31-36 s) end at the first try after the clients'
    deadline; any answer resets it."""
    import fsspec
    from store_proxy import StoreProxy

    BUCKET = gs_dir.removeprefix("gs://").split("/")[0]  # the emulator's bucket (conftest.py)

    proxy = StoreProxy(gcs_server)
    storage.set_timeout_s(1)
    try:
        storage.bound_clients()
        fs = fsspec.filesystem("gs", endpoint_url=proxy.url)  # with the middleware (fsspec's config)
        assert fs.info(BUCKET)["name"].rstrip("/") == BUCKET
        proxy.gone = True
        start = time.monotonic()
        with pytest.raises(storage.StoreAwayError, match=r"did not answer for 1 s \(storage_timeout_s\)"):
            fs.info(f"{BUCKET}/nothing-here")
        took = time.monotonic() - start
        # gcsfs's tries at ~0, 1-2, 3-5 s: the first after the deadline (2.4 s) fails; slack
        # for a loaded machine. Without the middleware: ~31-36 s.
        assert storage.client_deadline(1) <= took <= 12, took
        proxy.gone = False
        fs.invalidate_cache()
        with pytest.raises(FileNotFoundError):  # answered (404): the store is back
            fs.info(f"{BUCKET}/nothing-here")
    finally:
        storage.set_timeout_s(None)
        proxy.close()
