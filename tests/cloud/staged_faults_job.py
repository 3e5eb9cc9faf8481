"""One of N processes training on gs:// with staged saves, for the failure campaign.

`python tests/cloud/staged_faults_job.py MODEL_DIR PID NPROC PORT OUT MAX_STEPS` runs
process PID of NPROC (2 CPU devices each; NPROC=1: no cluster) with its own local
staging directory (TMPDIR=OUT.tmp<PID>: hosts share no disk) and its clients pointed at
STORAGE_EMULATOR_HOST (the campaign's proxy for this process). It trains the small
cloud model (grain input: its position is checkpointed) to MAX_STEPS, a checkpoint every
4 steps, `lost_host_timeout_s=10`, `storage_timeout_s=10`. It writes `OUT.started<PID>`
after its first loop and, at the end, `OUT.<PID>.json` ({"error": class or null,
"message": its first line, "end": time.time()}) and, on process 0 when train() returned,
`OUT.npz` (the final parameters, from the state in memory).

`STAGED_FAULT_LOCAL_AT=<step>` replaces this process's local staging directory by a
file just before that step's save, once the previous save's local copy is gone
(committed): a local disk that cannot be written, the save fails in the caller's
thread. The time of the fault goes to `OUT.fault`.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import sys
import tempfile
import time

model_dir, pid, nproc, port, out, max_steps = sys.argv[1:7]
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["TMPDIR"] = f"{out}.tmp{pid}"
os.makedirs(os.environ["TMPDIR"], exist_ok=True)
tempfile.tempdir = None  # (TMPDIR read again)
os.environ["TENSORSTORE_GCS_HTTP_URL"] = os.environ["STORAGE_EMULATOR_HOST"]

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)

import jax  # noqa: E402
import numpy as np  # noqa: E402

import cloud_model as cm  # noqa: E402
import tpu_estimator as te  # noqa: E402
from tests.final_state import FinalState  # noqa: E402


class Started(te.SessionRunHook):
    def after_run(self, run_context, run_values):
        marker = f"{out}.started{pid}"
        if not os.path.exists(marker):
            open(marker, "w").close()


class LocalDiskFails(te.CheckpointSaverListener):
    """Before the save of step STAGED_FAULT_LOCAL_AT: the staging directory becomes a file."""

    def before_save(self, session, global_step_value):
        if str(global_step_value) != os.environ.get("STAGED_FAULT_LOCAL_AT"):
            return
        for root in glob.glob(os.path.join(os.environ["TMPDIR"], f"tpu_estimator_staging_{os.getpid()}_*")):
            deadline = time.monotonic() + 120  # the previous step's upload done (its copy removed)
            while [n for n in os.listdir(root) if n.isdigit()] and time.monotonic() < deadline:
                time.sleep(0.05)
            shutil.rmtree(root)
            open(root, "w").close()
        with open(f"{out}.fault", "w") as f:
            f.write(str(time.time()))
        print("local staging directory replaced by a file", flush=True)


cluster = (te.ClusterConfig(f"127.0.0.1:{port}", int(nproc), int(pid), lost_host_timeout_s=10.0)
           if int(nproc) > 1 else None)
cfg = te.RunConfig(
    model_dir=model_dir, cluster=cluster, tpu_config=te.TPUConfig(iterations_per_loop=2),
    save_checkpoints_steps=4, save_summary_steps=2, tf_random_seed=0, log_step_count_steps=None,
    storage_timeout_s=10.0,
)
final = FinalState()
error = None
try:
    est = te.TPUEstimator(cm.model_fn, config=cfg, train_batch_size=16)
    est.train(cm.train_input_fn, max_steps=int(max_steps), hooks=[final, Started()],
              saving_listeners=[LocalDiskFails()])
except Exception as e:  # noqa: BLE001 - reported to the campaign, then raised
    error = e
record = {"error": None if error is None else type(error).__name__,
          "message": None if error is None else str(error).strip().splitlines()[0][:300],
          "end": time.time()}
with open(f"{out}.{pid}.json", "w") as f:
    json.dump(record, f)
if error is not None:
    raise error
if jax.process_index() == 0:
    np.savez(f"{out}.npz", **final.params_by_name())
print("job done", pid, flush=True)
