"""Trains on gs:// and is killed mid-save (run as a script by test_staged_save.py).

`python tests/cloud/kill_mid_save_job.py EMULATOR_URL MODEL_DIR` puts a proxy
(store_proxy.py) in front of the emulator that holds, unanswered, the upload of
checkpoint 4's `commit_success.txt` and every request after it, trains the small cloud
model (a checkpoint every 4 steps) and prints `HELD` once that upload is held: every
other file of the step has been uploaded; the test then SIGKILLs this process.
"""

from __future__ import annotations

import os
import sys
import threading
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.abspath(os.path.join(_HERE, "..", "..")))
sys.path.insert(0, _HERE)

from store_proxy import StoreProxy  # noqa: E402


def main(upstream: str, model_dir: str) -> None:
    proxy = StoreProxy(upstream)
    os.environ.update({"STORAGE_EMULATOR_HOST": proxy.url, "TENSORSTORE_GCS_HTTP_URL": proxy.url})
    marker = f"{model_dir.split('/', 3)[3]}/4/commit_success.txt"
    proxy.go_away(lambda kind, method, path: kind == "upload" and path.endswith(marker), "hold")

    def report() -> None:
        while not proxy.held:
            time.sleep(0.05)
        print("HELD", flush=True)

    threading.Thread(target=report, daemon=True).start()
    import cloud_model as cm

    cm.estimator(model_dir).train(cm.train_input_fn, max_steps=cm.TOTAL_STEPS)
    print("NOT HELD: train() ended", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
