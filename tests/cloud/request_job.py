"""Counts the requests of one train() call on gs:// (run as a script by test_requests.py).

`python tests/cloud/request_job.py EMULATOR_URL MODEL_DIR [FAIL_EVERY]` puts a
counting proxy (store_proxy.py) in front of the emulator, points the clients at
it (before they are imported), trains the small cloud model for 12 steps with a
checkpoint every 4 and summaries every step, then calls latest_checkpoint(),
get_variable_value and evaluate on a new estimator, and prints one JSON line:

  * `steps`: the requests of each step after the first, none pending (a
    listener waits for each background save to end, so that its requests are
    counted for the save and not for the next steps);
  * `saves`: the requests of each save (from before_save to the end of the
    background save), by kind, those naming the digests file, those naming a file of
    the step (`in_step`, by kind) and the number of files the step has (`files`);
  * `train_call`, `latest_checkpoint`, `get_variable_value`, `evaluate`: each
    call's requests by kind; `failed`: the 503s injected.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.parse
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.abspath(os.path.join(_HERE, "..", "..")))
sys.path.insert(0, _HERE)

from store_proxy import StoreProxy  # noqa: E402

DIGESTS = "tpu_estimator_digests.json"


def measure(proxy: StoreProxy, model_dir: str, *, steps: int = 12, every: int = 4) -> dict:
    """The requests of one train() call (`steps` steps, a save every `every`) on a fresh
    `model_dir`, then of latest_checkpoint(), get_variable_value and evaluate."""
    import cloud_model as cm
    import tpu_estimator as te

    marks: dict[str, Any] = {"steps": [], "saves": []}
    pending: dict[str, int] = {}

    class Steps(te.SessionRunHook):
        def before_run(self, run_context):
            pending["step"] = len(proxy.log)

        def after_run(self, run_context, run_values):
            if "step" in pending:
                marks["steps"].append(len(proxy.log) - pending.pop("step"))

    class Saves(te.CheckpointSaverListener):
        def before_save(self, session, global_step_value):
            pending["save"] = len(proxy.log)

        def after_save(self, session, global_step_value):
            session.checkpointer.wait()  # the background save's requests belong to the save
            log = proxy.log[pending.pop("save"):]
            marks["saves"].append({
                "step": global_step_value, "total": len(log), "kinds": _kinds(log),
                "digests": [f"{k} {m}" for k, m, p in log if DIGESTS in p],
                "in_step": _kinds([e for e in log if f"/{global_step_value}/" in urllib.parse.unquote(e[2])]),
                "others": sorted({f"{k} {urllib.parse.unquote(p)[:120]}" for k, _, p in log
                                  if f"/{global_step_value}/" not in urllib.parse.unquote(p)}),
                "listings": sum(1 for k, _, p in log if k == "list" and "delimiter=&" in p),
            })

    cfg = te.RunConfig(
        model_dir=model_dir, tpu_config=te.TPUConfig(iterations_per_loop=1),
        save_checkpoints_steps=every, save_summary_steps=1, tf_random_seed=0, log_step_count_steps=None,
    )
    est = te.TPUEstimator(cm.model_fn, config=cfg, train_batch_size=16, eval_batch_size=16)
    start = len(proxy.log)
    est.train(cm.train_input_fn, max_steps=steps, hooks=[Steps()], saving_listeners=[Saves()])
    marks["train_call"] = _kinds(proxy.log[start:])
    from tpu_estimator.checkpoint.listing import list_files

    for save in marks["saves"]:
        save["files"] = len(list_files(f"{model_dir}/{save['step']}"))
    fresh = te.TPUEstimator(cm.model_fn, config=cfg, train_batch_size=16, eval_batch_size=16)
    for name, fn in [
        ("latest_checkpoint", fresh.latest_checkpoint),
        ("get_variable_value", lambda: fresh.get_variable_value("global_step")),
        ("evaluate", lambda: fresh.evaluate(cm.eval_input_fn, steps=2)),
    ]:
        start = len(proxy.log)
        marks[name + "_result"] = str(fn())
        marks[name] = _kinds(proxy.log[start:])
    marks["failed"] = proxy.failed
    return marks


def _kinds(log: list) -> dict[str, int]:
    out: dict[str, int] = {"total": len(log)}
    for kind, _, _ in log:
        out[kind] = out.get(kind, 0) + 1
    return out


def main(upstream: str, model_dir: str, fail_every: int) -> None:
    proxy = StoreProxy(upstream, fail_every=fail_every)
    os.environ.update({"STORAGE_EMULATOR_HOST": proxy.url, "TENSORSTORE_GCS_HTTP_URL": proxy.url})
    try:
        print("RESULT " + json.dumps(measure(proxy, model_dir)), flush=True)
    finally:
        proxy.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 0)
