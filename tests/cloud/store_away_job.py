"""A store that stays away mid-save (run as a script by test_store_away.py).

`python tests/cloud/store_away_job.py EMULATOR_URL GS_BASE TIMEOUT_S [CASES]` puts a proxy
(store_proxy.py) in front of the emulator and trains the small cloud model with
`RunConfig(storage_timeout_s=TIMEOUT_S)` twice, on fresh directories under GS_BASE:

  * "503": from checkpoint 4's save on (a listener's before_save), every request is
    answered 503 (the store is up but refuses everything): the save itself meets it;
  * "gone": after checkpoint 4's save started (after_save), the proxy drops every
    connection unanswered (the store is gone): the background save and the wait meet it;
  * "marker": from the upload of checkpoint 4's `commit_success.txt` on (its data and
    metadata uploaded, the marker not), every request is answered 503: a save cut
    just before its commit (`step_4_files`: the files of `<model_dir>/4` once the store
    is back; `latest_after`: 0, or 4 if the upload thread's retry of the marker landed);
  * "exit" (last, if at all): as "gone", but the store stays away after train() raised,
    and the process then ends by itself (`raised_at`: time.time() at the raise, for the
    caller to measure how long the exit took: nothing may wait on the store much longer).

Prints one JSON line `RESULT {case: {error, message, seconds, requests, ...}}`: the
exception type train() raised, its message, the seconds from the store going away to
the raise, the requests sent to the store meanwhile (answered 503 or dropped), and
`latest_after`: the newest checkpoint a new estimator finds once the store is back.
The process ends normally (no os._exit: the clients' retries are bounded by the
deadline, docs/cluster.md). TIMEOUT_S `none` leaves the setting out (the default;
also how the code before the setting behaved, for a comparison run).
"""

from __future__ import annotations

import json
import os
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.abspath(os.path.join(_HERE, "..", "..")))
sys.path.insert(0, _HERE)

from store_proxy import StoreProxy  # noqa: E402


def run(case: str, proxy: StoreProxy, model_dir: str, timeout_s: float | None) -> dict:
    import cloud_model as cm
    import tpu_estimator as te

    went: dict[str, float] = {}

    class GoAway(te.CheckpointSaverListener):
        def before_save(self, session, global_step_value):
            if case == "503" and global_step_value == 4:
                went["at"], went["arrived"] = time.monotonic(), proxy.arrived
                proxy.fail_every = 1  # every request from now on: 503
            if case == "marker" and global_step_value == 4:
                went["arrived"] = proxy.arrived
                marker = f"{model_dir.split('/', 3)[3]}/4/commit_success.txt"
                proxy.go_away(lambda kind, method, path: kind == "upload" and path.endswith(marker), "503")

        def after_save(self, session, global_step_value):
            if case in ("gone", "exit") and global_step_value == 4:
                went["at"], went["arrived"] = time.monotonic(), proxy.arrived
                proxy.gone = True  # the store is gone: every connection dropped unanswered

    deadline = {} if timeout_s is None else {"storage_timeout_s": timeout_s}
    cfg = te.RunConfig(
        model_dir=model_dir, tpu_config=te.TPUConfig(iterations_per_loop=1), save_checkpoints_steps=4,
        save_summary_steps=1, tf_random_seed=0, log_step_count_steps=None, **deadline,
    )
    est = te.TPUEstimator(cm.model_fn, config=cfg, train_batch_size=16, eval_batch_size=16)
    try:
        est.train(cm.train_input_fn, max_steps=12, saving_listeners=[GoAway()])
    except Exception as e:  # noqa: BLE001 - reported
        first = e.__context__ if isinstance(e.__context__, te.CheckpointStorageError) else None
        if case == "marker" and proxy.went_at is not None:
            went["at"] = proxy.went_at
        out = {"error": type(e).__name__, "message": str(e),
               "while_handling": str(first) if first is not None else None,
               "seconds": round(time.monotonic() - went["at"], 2) if "at" in went else None,
               "requests": proxy.arrived - went["arrived"] if went else None,
               "raised_at": time.time()}
    else:
        out = {"error": None, "message": "", "seconds": None, "requests": None}
    if case == "exit":
        return out  # the store stays away: the process must still end by itself
    # The store comes back: which checkpoint does a new estimator find?
    proxy.back()
    if case == "marker":
        from tpu_estimator.checkpoint import listing

        out["step_4_files"] = sorted(listing.list_files(f"{model_dir}/4"))
    fresh = te.TPUEstimator(cm.model_fn, config=cfg, train_batch_size=16, eval_batch_size=16)
    latest = fresh.latest_checkpoint()
    out["latest_after"] = None if latest is None else int(latest.rsplit("/", 1)[-1])
    return out


def main(upstream: str, base: str, timeout_s: float | None, cases: list[str]) -> None:
    proxy = StoreProxy(upstream)
    os.environ.update({"STORAGE_EMULATOR_HOST": proxy.url, "TENSORSTORE_GCS_HTTP_URL": proxy.url})
    out = {}
    for case in cases:
        proxy.fail_every = 0
        start = time.monotonic()
        out[case] = run(case, proxy, f"{base}/{case}", timeout_s)
        out[case]["call_seconds"] = round(time.monotonic() - start, 1)
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], None if sys.argv[3] == "none" else float(sys.argv[3]),
         sys.argv[4].split(",") if len(sys.argv) > 4 else ["503", "gone"])
