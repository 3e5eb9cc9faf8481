"""One process of the inference preemption test:
`python preempt_eval_worker.py <pid> <nproc> <port> <model_dir> <call> <out>` (call: evaluate/predict).

The processes (2 CPU devices each) train 2 steps, then run `call` over an endless slow
input; after its first loop each writes `<out>.started<pid>`. The test sends SIGTERM to
one of them: every process must raise `PreemptedError` after the same batch. Each writes
`<out>.<pid>.json`.
"""

import json
import os
import sys
import time

pid, nproc, port, model_dir, call, out = sys.argv[1:7]
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ["JAX_PLATFORMS"] = "cpu"

import flax.linen as nn  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import tpu_estimator as te  # noqa: E402

X = np.random.RandomState(0).randn(256, 8).astype(np.float32)
Y = (X.sum(1) > 0).astype(np.int32)


def model_fn(features, labels, mode, params):
    logits = nn.Dense(2)(features)
    if mode == te.ModeKeys.PREDICT:
        return te.TPUEstimatorSpec(mode, predictions={"logits": logits})
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    return te.TPUEstimatorSpec(mode, loss=loss, train_op=optax.sgd(0.1))


def input_fn(params, input_context):
    b, n, h = params["batch_size"], input_context.num_hosts, input_context.host_id
    endless = params.get("endless", False)
    while True:
        for i in range(0, len(X), b * n):  # this host's rows of each global batch
            if endless:
                time.sleep(0.02)
            rows = slice(i + h * b, i + (h + 1) * b)
            yield (X[rows], Y[rows]) if call != "predict" or not endless else X[rows]
        if not endless:
            return


class Loops(te.SessionRunHook):
    """Counts batches; says when the call's first loop is done."""

    batches: list = []

    def after_run(self, run_context, run_values):
        self.batches.append(1)
        marker = f"{out}.started{pid}"
        if not os.path.exists(marker):
            open(marker, "w").close()


cluster = te.ClusterConfig(f"127.0.0.1:{port}", int(nproc), int(pid))
cfg = te.RunConfig(model_dir=model_dir, cluster=cluster, log_step_count_steps=None,
                   tpu_config=te.TPUConfig(iterations_per_loop=2))
est = te.TPUEstimator(model_fn, config=cfg, train_batch_size=8, eval_batch_size=8, predict_batch_size=8,
                      params={"endless": False})
est.train(input_fn, max_steps=2)
est = te.TPUEstimator(model_fn, config=cfg, train_batch_size=8, eval_batch_size=8, predict_batch_size=8,
                      params={"endless": True})
hook = Loops()
error = None
try:
    if call == "evaluate":
        est.evaluate(input_fn, hooks=[hook])
    else:
        for _ in est.predict(input_fn, hooks=[hook]):
            pass
except te.PreemptedError as e:
    error = str(e)
with open(f"{out}.{pid}.json", "w") as f:
    json.dump({"error": error, "loops": len(hook.batches), "eval_dir": os.path.exists(os.path.join(model_dir, "eval"))}, f)
print("worker done", pid, flush=True)
