"""Reads and exports against a store that stays away (run as a script by test_store_away_reads.py).

`python tests/cloud/store_away_reads_job.py EMULATOR_URL GS_BASE TIMEOUT_S` puts a proxy
(store_proxy.py) in front of the emulator, trains the small cloud model for 4 steps
(checkpoint 4) with `RunConfig(storage_timeout_s=TIMEOUT_S)`, then, each on a new
estimator, makes the store stay away during one call:

  * "latest_checkpoint": 503 to every request from the call on;
  * "restore": `evaluate()`, every connection dropped from the restore's first read of
    the array data (TensorStore's `manifest.ocdbt`) on;
  * "get_variable_value": 503 to every request from the call on;
  * "export": `export_saved_model` to gs://, every connection dropped from its first upload;
  * "eval_results": `read_eval_results` (what BestExporter and early stopping read), 503s.

Prints one JSON line `RESULT {case: {error, message, seconds}}` (`seconds`: from the
store going away to the raise), then leaves with os._exit: the calls given up on leave
their clients' retries running on background threads (docs/cluster.md).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.abspath(os.path.join(_HERE, "..", "..")))
sys.path.insert(0, _HERE)

from store_proxy import StoreProxy  # noqa: E402


def _forget_the_outage(proxy: StoreProxy, uri: str) -> None:
    """The store is back: one answered probe (a wait of a few probe intervals) lets the next
    case's deadline count from its own outage, not from the previous one."""
    from tpu_estimator import storage

    proxy.back()
    done = threading.Event()
    threading.Timer(3 * storage.probe_interval(storage.timeout_s()), done.set).start()
    storage.wait_for(done, uri=uri, what="checking that the store is back")


def main(upstream: str, base: str, timeout_s: float) -> None:
    proxy = StoreProxy(upstream)
    os.environ.update({"STORAGE_EMULATOR_HOST": proxy.url, "TENSORSTORE_GCS_HTTP_URL": proxy.url})
    import cloud_model as cm
    import tpu_estimator as te
    from tpu_estimator.checkpoint import listing
    from tpu_estimator.summary.eval_results import read_eval_results

    listing.write_bytes(base, "warm", b"x")  # the gcsfs client made first (~1 s cold), as in a long run
    model_dir = f"{base}/run"
    cfg = te.RunConfig(
        model_dir=model_dir, tpu_config=te.TPUConfig(iterations_per_loop=1), save_checkpoints_steps=4,
        save_summary_steps=None, tf_random_seed=0, log_step_count_steps=None, storage_timeout_s=timeout_s,
    )

    def estimator() -> te.TPUEstimator:
        return te.TPUEstimator(cm.model_fn, config=cfg, train_batch_size=16, eval_batch_size=16)

    estimator().train(cm.train_input_fn, max_steps=4)

    def at_once(kind: str, method: str, path: str) -> bool:
        return True

    def tensorstore_data(kind: str, method: str, path: str) -> bool:
        return method == "GET" and "manifest.ocdbt" in path

    def upload(kind: str, method: str, path: str) -> bool:
        return kind == "upload"

    cases = {
        "latest_checkpoint": (at_once, "503", lambda est: est.latest_checkpoint()),
        "restore": (tensorstore_data, "gone", lambda est: est.evaluate(cm.eval_input_fn, steps=1)),
        "get_variable_value": (at_once, "503", lambda est: est.get_variable_value("Dense_0/kernel")),
        "export": (upload, "gone", lambda est: est.export_saved_model(f"{base}/export", cm.receiver_fn)),
        "eval_results": (at_once, "503", lambda est: read_eval_results(est.eval_dir())),
    }
    out = {}
    for case, (when, how, call) in cases.items():
        est = estimator()
        proxy.go_away(when, how)
        try:
            call(est)
        except Exception as e:  # noqa: BLE001 - reported
            out[case] = {"error": type(e).__name__, "message": str(e)}
        else:
            out[case] = {"error": None, "message": ""}
        out[case]["seconds"] = None if proxy.went_at is None else round(time.monotonic() - proxy.went_at, 2)
        _forget_the_outage(proxy, model_dir)
    print("RESULT " + json.dumps(out), flush=True)
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]))
