"""The main job: train, evaluate, export and predict scikit-learn's 8x8 digits on 8 CPU devices.

    pip install 'tpu_estimator[examples]'   # scikit-learn, and the server for :classify
    bash scripts/demo.sh            # or: python examples/digits.py --model_dir runs/digits

A TF1-style `model_fn` (layers created inline) and `input_fn`s, handed to
`TPUEstimator`, replicated over 8 (fake) CPU devices. Summaries land in
`--model_dir` (view with `tensorboard --logdir runs/digits`). The export is
served (`tpu-estimator serve`'s server) and asked TF Serving's `:classify`,
which answers each class's label and score. When stderr is not a terminal (no
progress bar), training logs `loss = ..., step = ...` lines as TF1 did.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys

# Eight CPU devices, set before JAX is imported.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import flax.linen as nn  # noqa: E402
import httpx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

import tpu_estimator as te  # noqa: E402
from tpu_estimator import metrics  # noqa: E402
from tpu_estimator.serving.model_store import ModelStore  # noqa: E402
from tpu_estimator.serving.server import ServerThread  # noqa: E402


def model_fn(features, labels, mode, params):
    """A small MLP over the 64 pixels; layers are created inline, as in TF1."""
    x = features["image"].reshape(features["image"].shape[0], -1)
    x = nn.relu(nn.Dense(128)(x))
    x = nn.Dropout(0.1, deterministic=mode != te.ModeKeys.TRAIN)(x)
    logits = nn.Dense(10)(x)
    if mode == te.ModeKeys.PREDICT:
        probabilities = nn.softmax(logits)
        # TF Serving's :classify labels each score with its class: every class's id per row.
        classes = jnp.broadcast_to(jnp.arange(10), probabilities.shape)
        return te.TPUEstimatorSpec(
            mode,
            predictions={"classes": logits.argmax(-1), "probabilities": probabilities},
            export_outputs={
                "serving_default": te.ClassificationOutput(scores=probabilities, classes=classes)
            },
        )
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    if mode == te.ModeKeys.TRAIN:
        return te.TPUEstimatorSpec(mode, loss=loss, train_op=optax.adam(params["learning_rate"]))
    return te.TPUEstimatorSpec(mode, loss=loss, eval_metrics=(metric_fn, [labels, logits]))


def metric_fn(labels, logits):
    """Runs on the host over the whole global batch."""
    return {
        "accuracy": metrics.accuracy(labels, logits.argmax(-1)),
        "top_2_accuracy": metrics.top_k_accuracy(labels, logits, k=2),
    }


def make_input_fn(images, labels, *, epochs=1, shuffle=False, seed=0):
    """An input_fn yielding (features, labels) batches of params['batch_size']."""

    def input_fn(params):
        b = params["batch_size"]
        rng = np.random.RandomState(seed)
        for _ in range(epochs):
            order = rng.permutation(len(images)) if shuffle else np.arange(len(images))
            stop = len(order) - len(order) % b if shuffle else len(order)  # training: whole batches
            for i in range(0, stop, b):
                idx = order[i : i + b]
                feats = {"image": images[idx]}
                yield feats if labels is None else (feats, labels[idx])

    return input_fn


def ascii_digit(image: np.ndarray) -> list[str]:
    shades = " .:-=+*#%@"
    return ["".join(shades[int(v * 9.99)] * 2 for v in row) for row in image]


def classify_served(export_base: str, images: np.ndarray) -> list[list[list]]:
    """Starts `tpu-estimator serve`'s server on the exports and asks TF Serving's `:classify`;
    per image, `[[label, score], ...]` for the 10 classes."""
    with ServerThread(ModelStore(export_base, poll_seconds=0), "digits") as server:
        body = {"examples": [{"image": image.tolist()} for image in images]}
        reply = httpx.post(f"{server.url}/v1/models/digits:classify", json=body, timeout=120)
        reply.raise_for_status()
    return reply.json()["results"]


def log_training_when_piped() -> None:
    """No progress bar shows when stderr is not a terminal (a file, a pipe, CI): log training's
    `loss = ..., step = ...` lines instead, as TF1's tf.logging did at INFO."""
    if not logging.getLogger().handlers and not sys.stderr.isatty():
        logging.basicConfig(format="%(levelname)s:%(name)s:%(message)s")
        logging.getLogger("tpu_estimator").setLevel(logging.INFO)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model_dir", default="runs/digits")
    parser.add_argument("--max_steps", type=int, default=600)
    parser.add_argument("--fresh", action="store_true", help="delete model_dir first")
    args = parser.parse_args(argv)
    if args.fresh:
        shutil.rmtree(args.model_dir, ignore_errors=True)

    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)  # [1797, 8, 8] in [0, 1]
    x_train, x_test, y_train, y_test = train_test_split(
        images, digits.target.astype(np.int32), test_size=0.2, random_state=0
    )

    config = te.RunConfig(
        model_dir=args.model_dir,
        tf_random_seed=0,
        save_checkpoints_steps=200,
        save_summary_steps=50,
        tpu_config=te.TPUConfig(iterations_per_loop=50),
    )
    est = te.TPUEstimator(
        model_fn,
        config=config,
        params={"learning_rate": 3e-3},
        train_batch_size=128,
        eval_batch_size=64,
        predict_batch_size=64,
    )
    print(f"{est.num_replicas} replicas; model_dir={est.model_dir}")

    est.train(make_input_fn(x_train, y_train, epochs=10_000, shuffle=True), max_steps=args.max_steps)
    result = est.evaluate(make_input_fn(x_test, y_test))
    print(f"evaluation on {len(x_test)} test digits: " + ", ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(result.items())))

    receiver_fn = te.build_raw_serving_input_receiver_fn(
        {"image": te.TensorSpec((None, 8, 8), np.float32)}
    )
    export_base = os.path.join(args.model_dir, "export")
    export_dir = est.export_saved_model(export_base, receiver_fn)
    print(f"exported to {export_dir.decode()}")

    predictions = [int(p["classes"]) for p in est.predict(make_input_fn(x_test[:6], None))]
    served = te.load_exported(export_dir.decode()).signatures["serving_default"](image=x_test[:6])
    classified = classify_served(export_base, x_test[:6])
    top = [max(scored, key=lambda label_score: label_score[1]) for scored in classified]
    rows = [ascii_digit(img) for img in x_test[:6]]
    for line in range(8):
        print("   ".join(r[line] for r in rows))
    print("   ".join(f"pred {p} true {t}".ljust(16) for p, t in zip(predictions, y_test[:6])))
    print("   ".join(f":classify {label} {score:.2f}".ljust(16) for label, score in top))
    agree = np.array_equal(np.asarray(served["scores"]).argmax(-1), predictions) and [
        int(label) for label, _ in top] == predictions
    print(f"exported and served model agree with predict(): {agree}")
    print(f"serve it: tpu-estimator serve --model_base_path {export_base} --model_name digits; then POST "
          "http://127.0.0.1:8501/v1/models/digits:classify")
    return 0 if result["accuracy"] >= 0.95 and agree else 1


if __name__ == "__main__":
    log_training_when_piped()
    sys.exit(main())
