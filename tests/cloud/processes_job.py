"""One of several processes saving to gs:// (run as a script by test_staged_processes.py).

`python tests/cloud/processes_job.py MODEL_DIR PID NPROC PORT OUT` runs process PID of
NPROC (8 // NPROC CPU devices each) with its own local staging directory (TMPDIR
OUT.tmp<PID>: hosts share no disk), the clients pointed at the URL in
STORAGE_EMULATOR_HOST (the test's counting proxy). It trains the small cloud model for
8 steps, a checkpoint every 4, evaluates with the trained state in memory and again
with a new estimator (checkpoint 8 restored from the store onto these processes), then
trains that estimator on to step 12 (a save after a restore: checkpoint 12);
process 0 writes the parameters at step 8 and both losses to OUT.npz.
"""

from __future__ import annotations

import os
import sys

model_dir, pid, nproc, port, out = sys.argv[1:6]
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={8 // int(nproc)}"
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["TMPDIR"] = f"{out}.tmp{pid}"
os.makedirs(os.environ["TMPDIR"], exist_ok=True)
os.environ["TENSORSTORE_GCS_HTTP_URL"] = os.environ["STORAGE_EMULATOR_HOST"]

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)

import jax  # noqa: E402
import numpy as np  # noqa: E402

import cloud_model as cm  # noqa: E402
import tpu_estimator as te  # noqa: E402
from tests.final_state import FinalState  # noqa: E402

STEPS = 8
RESUMED = 12


cluster = te.ClusterConfig(f"127.0.0.1:{port}", int(nproc), int(pid))
cfg = te.RunConfig(
    model_dir=model_dir, cluster=cluster, tpu_config=te.TPUConfig(iterations_per_loop=2),
    save_checkpoints_steps=4, save_summary_steps=2, tf_random_seed=0, log_step_count_steps=None,
)


def phase(name: str) -> None:
    """With PHASE_MARKERS=1 (benchmarks/store_requests_processes.py): one existence check
    of `<bucket>/_phase/<name>/<pid>`, which the benchmark finds in its proxy's log."""
    if os.environ.get("PHASE_MARKERS") == "1":
        import fsspec

        fs, root = fsspec.core.url_to_fs(model_dir)
        fs.exists(f"{root.split('/', 1)[0]}/_phase/{name}/{pid}")


final = FinalState()
est = te.TPUEstimator(cm.model_fn, config=cfg, train_batch_size=16, eval_batch_size=16)
phase("train.start")
est.train(cm.train_input_fn, max_steps=STEPS, hooks=[final])
phase("train.end")
in_memory = est.evaluate(cm.eval_input_fn)["loss"]  # the trained state, no restore
phase("evaluate_in_memory.end")
flat = final.params_by_name()
fresh = te.TPUEstimator(cm.model_fn, config=cfg, train_batch_size=16, eval_batch_size=16)
phase("latest_checkpoint.start")
fresh.latest_checkpoint()
phase("latest_checkpoint.end")
restored = fresh.evaluate(cm.eval_input_fn)["loss"]
phase("evaluate_restored.end")
fresh.train(cm.train_input_fn, max_steps=RESUMED)  # restored, then saved again (checkpoint 12)
phase("resumed_train.end")
if jax.process_index() == 0:
    np.savez(f"{out}.npz", loss_in_memory=in_memory, loss_restored=restored, **flat)
print("job done", pid, "staging left:", os.listdir(os.environ["TMPDIR"]), flush=True)
