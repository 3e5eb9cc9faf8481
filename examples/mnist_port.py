"""The TPU MNIST example of TensorFlow 1 (tensorflow/tpu, models/official/mnist/mnist_tpu.py), ported.

    pip install 'tpu_estimator[examples]'   # scikit-learn (its digits stand in for MNIST)
    python examples/mnist_port.py --model_dir runs/mnist_port --train_steps 300

Each function keeps the original's name and does what it did; docs/migrating.md
walks through the port line by line. The original read MNIST's TFRecords
from `--data_dir`; this port needs no download: `dataset()` makes
MNIST-shaped examples (28x28x1 floats in [0, 255], int labels) from
scikit-learn's 8x8 digits, upsampled. The rest runs as the original did on 8
TPU cores, here on 8 (fake) CPU devices: train, evaluate, predict 10 test
images; then (not in the original) export for serving.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import sys

# Eight CPU devices (the original's --num_shards=8), set before JAX is imported.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import flax.linen as nn  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

import tpu_estimator as te  # noqa: E402
from tpu_estimator import metrics  # noqa: E402

log = logging.getLogger("mnist_port")


def metric_fn(labels, logits):
    """Runs on the host over each global batch; the states merge over the whole evaluation."""
    accuracy = metrics.accuracy(labels, logits.argmax(axis=1))
    return {"accuracy": accuracy}


def model_fn(features, labels, mode, params):
    """model_fn constructs the ML model used to predict handwritten digits."""
    # Normalize from [0, 255] to [0.0, 1.0]
    image = features / 255.0

    tf1_init = dict(kernel_init=nn.initializers.glorot_uniform())  # TF1 layers' default
    y = nn.Conv(features=32, kernel_size=(5, 5), padding="SAME", **tf1_init)(image)
    y = nn.relu(y)
    y = nn.max_pool(y, window_shape=(2, 2), strides=(2, 2), padding="SAME")
    y = nn.Conv(features=32, kernel_size=(5, 5), padding="SAME", **tf1_init)(y)
    y = nn.relu(y)
    y = nn.max_pool(y, window_shape=(2, 2), strides=(2, 2), padding="SAME")
    y = y.reshape(y.shape[0], -1)  # Flatten
    y = nn.relu(nn.Dense(params["hidden_units"], **tf1_init)(y))
    y = nn.Dropout(0.4, deterministic=mode != te.ModeKeys.TRAIN)(y)

    logits = nn.Dense(10, **tf1_init)(y)

    if mode == te.ModeKeys.PREDICT:
        predictions = {
            "class_ids": logits.argmax(axis=1),
            "probabilities": nn.softmax(logits),
        }
        export_outputs = {  # not in the original: the signature `export_saved_model` writes
            "serving_default": te.PredictOutput(predictions),
        }
        return te.TPUEstimatorSpec(mode, predictions=predictions, export_outputs=export_outputs)

    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    if mode == te.ModeKeys.TRAIN:
        learning_rate = optax.exponential_decay(
            params["learning_rate"], transition_steps=100000, decay_rate=0.96
        )
        # inject_hyperparams: the learning rate is also written to TensorBoard.
        optimizer = optax.inject_hyperparams(optax.sgd)(learning_rate=learning_rate)
        # No CrossShardOptimizer: gradients are averaged over the replicas.
        return te.TPUEstimatorSpec(mode=mode, loss=loss, train_op=optimizer)

    if mode == te.ModeKeys.EVAL:
        return te.TPUEstimatorSpec(mode=mode, loss=loss, eval_metrics=(metric_fn, [labels, logits]))


@functools.cache
def dataset(split: str) -> tuple[np.ndarray, np.ndarray]:
    """MNIST-shaped (images [N, 28, 28, 1] float32 in [0, 255], labels [N] int32) of `split`.

    The original decoded TFRecords; here scikit-learn's 8x8 digits (0..16) are
    scaled to [0, 255], upsampled 3x and padded to 28x28. Splits: train
    (1,297), validation (300), test (200).
    """
    digits = load_digits()
    images = np.repeat(np.repeat(digits.images * (255.0 / 16.0), 3, axis=1), 3, axis=2)
    images = np.pad(images, ((0, 0), (2, 2), (2, 2)))[..., None].astype(np.float32)
    labels = digits.target.astype(np.int32)
    order = np.random.default_rng(0).permutation(len(labels))
    bounds = {"train": (0, 1297), "validation": (1297, 1597), "test": (1597, 1797)}[split]
    idx = order[slice(*bounds)]
    return images[idx], labels[idx]


def train_input_fn(params):
    """train_input_fn defines the input pipeline used for training."""
    batch_size = params["batch_size"]  # per host: the global batch on one host
    images, labels = dataset("train")
    rng = np.random.default_rng(0)
    while True:  # .repeat().shuffle(...).batch(batch_size, drop_remainder=True)
        order = rng.permutation(len(labels))
        for i in range(0, len(order) - batch_size + 1, batch_size):
            idx = order[i : i + batch_size]
            yield images[idx], labels[idx]


def eval_input_fn(params):
    """Every validation example: the final short batch is padded and masked, not dropped."""
    batch_size = params["batch_size"]
    images, labels = dataset("validation")
    for i in range(0, len(labels), batch_size):
        yield images[i : i + batch_size], labels[i : i + batch_size]


def predict_input_fn(params):
    # Take out top 10 samples from test data to make the predictions.
    images, _ = dataset("test")
    yield images[:10]


def serving_input_receiver_fn():
    """Not in the original: what the exported model receives (any batch size)."""
    image = te.TensorSpec((None, 28, 28, 1), np.float32)
    return te.ServingInputReceiver(features=image, receiver_tensors={"image": image})


def parse_flags(argv: list[str] | None = None) -> argparse.Namespace:
    """The original's absl flags (minus the Cloud TPU ones), with CPU-sized defaults."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model_dir", default="runs/mnist_port")
    p.add_argument("--batch_size", type=int, default=128,
                   help="Mini-batch size for the training: the global batch, not the per-shard batch.")
    p.add_argument("--train_steps", type=int, default=300, help="Total number of training steps.")
    p.add_argument("--eval_steps", type=int, default=None,
                   help="Batches to evaluate; default: every validation example. 0 skips evaluation.")
    p.add_argument("--learning_rate", type=float, default=0.05)
    p.add_argument("--hidden_units", type=int, default=1024, help="Width of the dense layer.")
    p.add_argument("--use_tpu", action=argparse.BooleanOptionalAction, default=True,
                   help="Use every accelerator device (here: the 8 CPU devices) rather than one CPU.")
    p.add_argument("--enable_predict", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--iterations", type=int, default=50, help="Number of iterations per training loop.")
    p.add_argument("--num_shards", type=int, default=8, help="Number of shards (devices).")
    p.add_argument("--export_dir", default=None, help="Export here after training (default: model_dir/export).")
    return p.parse_args(argv)


def make_estimator(flags: argparse.Namespace) -> te.TPUEstimator:
    run_config = te.RunConfig(
        model_dir=flags.model_dir,
        save_summary_steps=flags.iterations,
        tpu_config=te.TPUConfig(flags.iterations, flags.num_shards if flags.use_tpu else None),
    )
    return te.TPUEstimator(
        model_fn=model_fn,
        use_tpu=flags.use_tpu,
        train_batch_size=flags.batch_size,
        eval_batch_size=flags.batch_size,
        predict_batch_size=flags.batch_size,
        params={"learning_rate": flags.learning_rate, "hidden_units": flags.hidden_units},
        config=run_config,
    )


def main(argv: list[str] | None = None) -> dict:
    """Trains, evaluates, predicts and exports; returns what each gave."""
    flags = parse_flags(argv)
    estimator = make_estimator(flags)
    out: dict = {}
    # train() requires max_steps or steps, as TPUEstimator.train did.
    estimator.train(input_fn=train_input_fn, max_steps=flags.train_steps)
    if flags.eval_steps != 0:
        out["eval"] = estimator.evaluate(input_fn=eval_input_fn, steps=flags.eval_steps)
        log.info("Evaluation: %s", out["eval"])

    # Run prediction on top few samples of test data.
    if flags.enable_predict:
        out["predictions"] = list(estimator.predict(input_fn=predict_input_fn))
        for pred_dict in out["predictions"]:
            class_id = pred_dict["class_ids"]
            probability = pred_dict["probabilities"][class_id]
            log.info('Prediction is "%s" (%.1f%%).', class_id, 100 * probability)

    export_base = flags.export_dir or os.path.join(flags.model_dir, "export")
    out["export_dir"] = estimator.export_saved_model(export_base, serving_input_receiver_fn).decode()
    log.info("Exported to %s", out["export_dir"])
    return out


if __name__ == "__main__":
    logging.basicConfig()
    for name in ("mnist_port", "tpu_estimator"):  # the library logs to "tpu_estimator"
        logging.getLogger(name).setLevel(logging.INFO)
    result = main()
    sys.exit(0 if result.get("eval", {}).get("accuracy", 1.0) >= 0.9 else 1)
