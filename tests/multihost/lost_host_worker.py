"""One process of the lost-host runs: `python lost_host_worker.py <pid> <nproc> <port> <model_dir> <phase> <deadline_s> <out> [max_steps]`.

The processes (2 CPU devices each) train (phase "train": until `max_steps`, 8 by default,
with a slow endless input when max_steps is 0) or evaluate an endless slow input after 2
steps (phase "evaluate"). After its first loop each writes `<out>.started<pid>`; at the end
`<out>.<pid>.npz` holds the final parameters. The test / campaign kills or signals one.
"""

import os
import sys
import time

pid, nproc, port, model_dir, phase, deadline, out = sys.argv[1:8]
max_steps = int(sys.argv[8]) if len(sys.argv) > 8 else 0
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ["JAX_PLATFORMS"] = "cpu"

import flax.linen as nn  # noqa: E402
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
    b, n, h = params["batch_size"], input_context.num_hosts, input_context.host_id
    while True:
        for i in range(0, len(X), b * n):  # this host's rows of each global batch
            if params["slow"]:
                time.sleep(0.05)
            yield X[i + h * b : i + (h + 1) * b], Y[i + h * b : i + (h + 1) * b]


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
    e = est(slow=max_steps == 0)
    e.train(input_fn, max_steps=max_steps or 10**6, hooks=[Started()])
else:
    est(slow=False).train(input_fn, max_steps=2)
    e = est(slow=True)
    e.evaluate(input_fn, hooks=[Started()])
print("preempted" if e.preempted else "done", e.latest_checkpoint(), flush=True)
np.savez(f"{out}.{pid}.npz", **{k: e.get_variable_value(k) for k in e.get_variable_names()})
