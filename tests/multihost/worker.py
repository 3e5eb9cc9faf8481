"""One process of the multi-host test: `python worker.py <devices> <pid> <nproc> <port> <model_dir> <steps> <out>`."""

import os
import sys

devices, pid, nproc, port, model_dir, steps, out = sys.argv[1:8]
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
os.environ["JAX_PLATFORMS"] = "cpu"

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import tpu_estimator as te  # noqa: E402
from tests.final_state import FinalState  # noqa: E402

X = np.random.RandomState(0).randn(256, 8).astype(np.float32)
Y = (X.sum(1) > 0).astype(np.int32)
# WORKER_EMBEDDING=1: the inputs carry ids [n, 3] of a 37-row table sharded over every device
EMBEDDING = os.environ.get("WORKER_EMBEDDING") == "1"
IDS = np.random.RandomState(1).randint(-1, 37, (256, 3))
SPEC = te.EmbeddingConfigSpec(
    feature_to_config_dict={"ids": te.FeatureConfig("ids")},
    table_to_config_dict={"ids": te.TableConfig(37, 4, sharding="row")},
    optimization_parameters=te.AdagradParameters(0.5),
) if EMBEDDING else None


def inputs(rows):
    return {"x": X[rows], "ids": IDS[rows]} if EMBEDDING else X[rows]


def model_fn(features, labels, mode, params):
    if EMBEDDING:
        features = jnp.concatenate([features["x"], features["ids"]], axis=1)
    logits = nn.Dense(2)(nn.relu(nn.Dense(16)(features)))
    if mode == te.ModeKeys.PREDICT:
        return te.TPUEstimatorSpec(mode, predictions={"logits": logits})
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    if mode == te.ModeKeys.EVAL:
        fn = lambda y, z: {"accuracy": te.metrics.accuracy(y, z.argmax(-1))}
        return te.TPUEstimatorSpec(mode, loss=loss, eval_metrics=(fn, [labels, logits]))
    return te.TPUEstimatorSpec(mode, loss=loss, train_op=optax.adam(1e-2))


def eval_rows(input_context):
    """100 examples; on two hosts, 60 on host 0 and 40 on host 1 (uneven, with a short batch)."""
    rows = np.arange(100)
    if input_context.num_hosts == 2:
        rows = rows[:60] if input_context.host_id == 0 else rows[60:]
    return rows


def eval_input_fn(params, input_context):
    rows, b = eval_rows(input_context), params["batch_size"]
    for i in range(0, len(rows), b):
        yield inputs(rows[i : i + b]), Y[rows[i : i + b]]


def predict_input_fn(params, input_context):
    rows, b = eval_rows(input_context), params["batch_size"]
    for i in range(0, len(rows), b):
        yield inputs(rows[i : i + b])


def input_fn(params, input_context):
    b, n, h = params["batch_size"], input_context.num_hosts, input_context.host_id
    for i in range(0, len(X), b * n):  # this host's rows of each global batch
        rows = np.arange(i + h * b, i + (h + 1) * b)
        yield inputs(rows), Y[rows]


cluster = te.ClusterConfig(f"127.0.0.1:{port}", int(nproc), int(pid)) if int(nproc) > 1 else None
cfg = te.RunConfig(
    model_dir=model_dir, cluster=cluster, log_step_count_steps=None,
    tpu_config=te.TPUConfig(
        iterations_per_loop=2, loop_strategy="scan",
        per_host_input_for_training=te.InputPipelineConfig[os.environ.get("WORKER_INPUT_MODE", "PER_HOST_V1")],
        eval_training_input_configuration=te.InputPipelineConfig[
            os.environ.get("WORKER_EVAL_MODE", "PER_HOST_V1")
        ],
    ),
)
est = te.TPUEstimator(
    model_fn, config=cfg, train_batch_size=16, eval_batch_size=16, predict_batch_size=16, embedding_config_spec=SPEC
)
if os.environ.get("WORKER_EVAL_FIRST") == "1":  # evaluate the newest checkpoint before training on
    result = est.evaluate(eval_input_fn)
    np.savez(f"{out}.first.npz", step=result["global_step"], procs=jax.process_count(),
             eval_loss=result["loss"], eval_accuracy=result["accuracy"])

final = FinalState()
est.train(input_fn, max_steps=int(steps), hooks=[final])
result = est.evaluate(eval_input_fn)
logits = np.stack([p["logits"] for p in est.predict(predict_input_fn)])
np.save(f"{out}.predict{pid}.npy", logits)
flat = final.params_by_name()
if jax.process_index() == 0:
    if EMBEDDING:
        flat["table"] = est.get_variable_value("embedding/ids")
    np.savez(
        out, step=int(jax.device_get(final.state.step)), procs=jax.process_count(),
        eval_loss=result["loss"], eval_accuracy=result["accuracy"], **flat,
    )
print("worker done", pid, flush=True)
