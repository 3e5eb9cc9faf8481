"""One process of the lost-host runs: `python lost_host_worker.py <pid> <nproc> <port> <model_dir> <phase> <deadline_s> <out> [max_steps]`.

The processes (2 CPU devices each) train (phase "train": to `max_steps`, over a slow
input; endless when max_steps is 0) or evaluate a slow input after 2 steps (phase
"evaluate"; `max_steps` batches, endless when 0). After its first loop each writes `<out>.started<pid>`; at the end
`<out>.<pid>.npz` holds the final parameters. The test / campaign kills or signals one.
"""

import os
import signal
import sys
import time

pid, nproc, port, model_dir, phase, deadline, out = sys.argv[1:8]
max_steps = int(sys.argv[8]) if len(sys.argv) > 8 else 0
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ["JAX_PLATFORMS"] = "cpu"

import flax.linen as nn  # noqa: E402
import grain  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import tpu_estimator as te  # noqa: E402

X = np.random.RandomState(0).randn(512, 8).astype(np.float32)
Y = (X.sum(1) > 0).astype(np.int32)


def model_fn(features, labels, mode, params):
    logits = nn.Dense(2)(nn.relu(nn.Dense(16)(features)))
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    return te.TPUEstimatorSpec(mode, loss=loss, train_op=optax.adam(1e-2))


def input_fn(params, input_context):
    """This host's rows, endless, checkpointable (grain): a restart resumes the input too."""
    b, n, h = params["batch_size"], input_context.num_hosts, input_context.host_id
    xs, ys = X[h::n], Y[h::n]

    def read(idx):
        if params["slow"]:
            time.sleep(0.05)
        return xs[idx], ys[idx]

    return grain.MapDataset.range(len(xs)).repeat().batch(b).map(read).to_iter_dataset()


class KillAtSave(te.CheckpointSaverListener):
    """LOST_HOST_KILL_AT_SAVE=<step>: this process kills itself as the save of that step begins."""

    def before_save(self, session, global_step_value):
        if str(global_step_value) == os.environ.get("LOST_HOST_KILL_AT_SAVE"):
            os.kill(os.getpid(), signal.SIGKILL)


class Started(te.SessionRunHook):
    def after_run(self, run_context, run_values):
        marker = f"{out}.started{pid}"
        if not os.path.exists(marker):
            open(marker, "w").close()


cluster = te.ClusterConfig(f"127.0.0.1:{port}", int(nproc), int(pid), lost_host_timeout_s=float(deadline))
cfg = te.RunConfig(model_dir=model_dir, cluster=cluster, log_step_count_steps=None, save_checkpoints_steps=4,
                   tpu_config=te.TPUConfig(iterations_per_loop=2))


def est(slow):
    return te.TPUEstimator(model_fn, config=cfg, train_batch_size=8, eval_batch_size=8, params={"slow": slow})


if phase == "train":
    e = est(slow=True)
    e.train(input_fn, max_steps=max_steps or 10**6, hooks=[Started()], saving_listeners=[KillAtSave()])
else:
    est(slow=False).train(input_fn, max_steps=2)
    e = est(slow=True)
    results = e.evaluate(input_fn, steps=max_steps or None, hooks=[Started()])
    print("eval", {k: float(v) for k, v in results.items()}, flush=True)
print("preempted" if e.preempted else "done", e.latest_checkpoint(), flush=True)
np.savez(f"{out}.{pid}.npz", **{k: e.get_variable_value(k) for k in e.get_variable_names()})
