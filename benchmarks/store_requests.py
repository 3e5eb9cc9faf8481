"""Requests sent to the object store per training step, save, restore and evaluate.

Starts fake-gcs-server (as tests/cloud does) behind a counting proxy
(tests/cloud/store_proxy.py), runs tests/cloud/request_job.py's measurement (the
small model of tests/cloud on gs://: train() of 12 steps with a save every 4 and
summaries every step, then latest_checkpoint(), get_variable_value, evaluate on a
new estimator) and prints one JSON object.

    python benchmarks/store_requests.py [--fail-every N]

`--fail-every 5` answers every 5th request with a 503 (not forwarded; the
clients retry); the counts are of the requests forwarded to the emulator.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid

_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, _ROOT)
sys.path.insert(0, os.path.join(_ROOT, "tests", "cloud"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fail-every", type=int, default=0)
    args = parser.parse_args()

    from tests.cloud import conftest
    from request_job import measure
    from store_proxy import StoreProxy

    server, upstream = conftest.start_emulator(os.path.join(tempfile.mkdtemp(), "server.log"))
    proxy = StoreProxy(upstream, fail_every=args.fail_every)
    os.environ.update(conftest.client_env(proxy.url))
    try:
        t = time.perf_counter()
        out = measure(proxy, f"gs://{conftest.BUCKET}/{uuid.uuid4().hex[:8]}")
        out["seconds"] = round(time.perf_counter() - t, 1)
        out["fail_every"] = args.fail_every
        print(json.dumps(out, indent=1, sort_keys=True))
    finally:
        proxy.close()
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
