"""Requests sent to the object store per training step, save, restore and evaluate.

Starts fake-gcs-server (as tests/cloud does) behind a counting proxy
(tests/cloud/store_proxy.py) and runs the small model of tests/cloud on gs://,
phase by phase; prints one JSON object: each phase's requests by kind.

    python benchmarks/store_requests.py [--fail-every N] [--steps 20]

Per step = the difference between a train() call of 1 + steps steps and one of 1
step (both with only their final save), divided by steps. Per save = the
difference between a call saving every 5 steps and one saving only at its end,
divided by the extra saves. `--fail-every 5` answers every 5th request with a 503.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import uuid

_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, _ROOT)
sys.path.insert(0, os.path.join(_ROOT, "tests", "cloud"))


def _phase(proxy, fn):
    before = proxy.snapshot()
    failed = proxy.failed
    out = fn()
    after = proxy.snapshot()
    counts = {k: after[k] - before[k] for k in after if after[k] - before[k]}
    counts["total"] = sum(counts.values())
    if proxy.fail_every:
        counts["injected_503"] = proxy.failed - failed
    return counts, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fail-every", type=int, default=0)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()

    from tests.cloud import conftest
    from store_proxy import StoreProxy

    server, upstream = conftest._start(os.path.join(tempfile.mkdtemp(), "server.log"))
    proxy = StoreProxy(upstream)
    os.environ.update({
        "STORAGE_EMULATOR_HOST": proxy.url, "TENSORSTORE_GCS_HTTP_URL": proxy.url,
        "TENSORSTORE_GCS_HTTP_VERSION": "1", "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator",
    })
    try:
        import cloud_model as cm
        import tpu_estimator as te

        model_dir = f"gs://{conftest.BUCKET}/{uuid.uuid4().hex[:8]}"

        def est(every):
            cfg = te.RunConfig(
                model_dir=model_dir, tpu_config=te.TPUConfig(iterations_per_loop=1),
                save_checkpoints_steps=every, save_summary_steps=1, tf_random_seed=0,
                log_step_count_steps=None,
            )
            return te.TPUEstimator(cm.model_fn, config=cfg, train_batch_size=16, eval_batch_size=16,
                                   predict_batch_size=16)

        n, every = args.steps, 5
        out: dict[str, object] = {}
        out["first train() (init, save 0 and 5)"], _ = _phase(proxy, lambda: est(10_000).train(cm.train_input_fn, max_steps=5))
        one, _ = _phase(proxy, lambda: est(10_000).train(cm.train_input_fn, steps=5))  # to 10
        many, _ = _phase(proxy, lambda: est(10_000).train(cm.train_input_fn, steps=n))  # to 10 + n
        out["train() call: restore + 5 steps + final save"] = one
        out[f"train() call: restore + {n} steps + final save"] = many
        out["per step (between saves)"] = {k: (many.get(k, 0) - one.get(k, 0)) / (n - 5) for k in one | many}
        proxy.fail_every = args.fail_every
        saving, _ = _phase(proxy, lambda: est(every).train(cm.train_input_fn, steps=n))
        saves = n // every  # the last coincides with the final save of `many`
        out[f"train() call: restore + {n} steps, a save every {every}"] = saving
        out["per save"] = {k: (saving.get(k, 0) - many.get(k, 0)) / (saves - 1) for k in saving | many}
        e = est(10_000)
        out["latest_checkpoint()"], _ = _phase(proxy, e.latest_checkpoint)
        out["get_variable_value (restore)"], _ = _phase(proxy, lambda: e.get_variable_value("global_step"))
        out["evaluate(steps=2)"], _ = _phase(proxy, lambda: e.evaluate(cm.eval_input_fn, steps=2))
        out["fail_every"] = args.fail_every
        print(json.dumps(out, indent=1, sort_keys=True))
    finally:
        proxy.close()
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
