"""A DLRM-style click model with 26 embedding tables sharded over 8 CPU devices.

    pip install 'tpu_estimator[examples]'   # the model server and httpx, its HTTP client
    python examples/dlrm.py [--quick] [--model_dir runs/dlrm] [--steps N]

Synthetic Criteo-like data (13 dense features, 26 categorical ones with
vocabularies from 10 to 1,000,000 ids, a few of them multivalent), a bottom MLP
on the dense features, the pairwise dot products of its output and every
embedding (DLRM's interaction), a top MLP and a sigmoid. The tables are
`TPUEstimator(embedding_config_spec=...)` tables: each of the 8 devices holds
1/8 of every table's rows and Adagrad slots, `model_fn` receives the looked-up
activations in `features[name]`, and the dense layers train with Adam. The run
trains, evaluates (loss, accuracy, AUC), exports, starts the model server on
the export and asks it for predictions over HTTP, which must equal
`est.predict()`'s. `--quick` shrinks the run for a test: 8 of the categorical
features (the multivalent ones among them; vocabularies 10 ... 10,000) and 60 steps.
"""

from __future__ import annotations

import argparse
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

import tpu_estimator as te  # noqa: E402
from tpu_estimator import metrics  # noqa: E402
from tpu_estimator.serving.model_store import ModelStore  # noqa: E402
from tpu_estimator.serving.server import ServerThread  # noqa: E402

NUM_DENSE = 13
CATEGORICAL = [f"C{i}" for i in range(1, 27)]
MULTIVALENT = {"C3": 3, "C7": 4, "C12": 2}  # ids per example (padded with -1); the others 1
# --quick's features: fewer tables to compile (each is routed on its own); both combiners, the
# multivalent features, rows of 16 (looked up as they are) and 32 (projected to 16).
QUICK = ["C1", "C3", "C7", "C12", "C16", "C20", "C23", "C26"]
INTERACTION_DIM = 16  # the bottom MLP's output and every embedding, for the dot products


def vocabularies(quick: bool) -> dict[str, int]:
    """Feature -> ids: 10 ... 1,000,000 (26 features), spaced geometrically, as Criteo's;
    with --quick 10 ... 10,000 (QUICK's 8 features)."""
    names, top = (QUICK, 1e4) if quick else (CATEGORICAL, 1e6)
    return {name: int(v) for name, v in zip(names, np.geomspace(10, top, len(names)))}


def dimension(vocabulary_size: int) -> int:
    """Bigger tables get wider rows: 16, 32 or 64."""
    return 16 if vocabulary_size < 1_000 else 32 if vocabulary_size < 100_000 else 64


def embedding_spec(vocab: dict[str, int]) -> te.EmbeddingConfigSpec:
    return te.EmbeddingConfigSpec(
        feature_to_config_dict={name: te.FeatureConfig(name) for name in vocab},
        table_to_config_dict={
            name: te.TableConfig(v, dimension(v), combiner="sum" if name == "C12" else "mean")
            for name, v in vocab.items()
        },
        optimization_parameters=te.AdagradParameters(learning_rate=0.05),
        partition_strategy="div",
    )


def hidden_score(ids: np.ndarray, salt: int) -> np.ndarray:
    """A fixed pseudo-random effect per id in [-0.5, 0.5) (0 for padding): what the tables learn."""
    h = (ids.astype(np.int64) * 2654435761 + salt * 97) % 1000
    return np.where(ids >= 0, h / 1000.0 - 0.5, 0.0)


def synthetic_batch(vocab: dict[str, int], batch_size: int, index: int) -> tuple[dict, np.ndarray]:
    """Batch `index` of the synthetic click log: always the same for the same index."""
    rng = np.random.RandomState(index)
    dense = np.log1p(rng.lognormal(0.0, 1.0, (batch_size, NUM_DENSE))).astype(np.float32)
    features, logit = {"dense": dense}, 1.5 * (dense[:, 0] - dense[:, 1])
    for salt, (name, v) in enumerate(vocab.items()):
        width = MULTIVALENT.get(name, 1)
        ids = np.minimum((v * rng.uniform(size=(batch_size, width)) ** 3).astype(np.int64), v - 1)  # frequent ids first
        if width > 1:  # a random number of ids per example, padded with -1
            ids[np.arange(width) >= rng.randint(1, width + 1, (batch_size, 1))] = -1
        features[name] = ids.astype(np.int32)
        if salt % 3 == 0:  # a third of the features carry signal
            logit += 2.0 * hidden_score(ids, salt).sum(1)
    labels = (rng.uniform(size=batch_size) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    return features, labels


def make_input_fn(vocab: dict[str, int], first: int, count: int, *, labels: bool = True):
    def input_fn(params):
        for i in range(first, first + count):
            features, y = synthetic_batch(vocab, params["batch_size"], i)
            yield (features, y) if labels else features

    return input_fn


def mlp(x, sizes: list[int], name: str):
    for i, size in enumerate(sizes):
        x = nn.Dense(size, name=f"{name}_{i}")(x)
        x = nn.relu(x) if i < len(sizes) - 1 else x
    return x


def model_fn(features, labels, mode, params):
    """DLRM: bottom MLP, dot-product interaction with the embeddings, top MLP."""
    bottom = nn.relu(mlp(features["dense"], [64, INTERACTION_DIM], "bottom"))
    vectors = [bottom]
    for name in params["categorical"]:
        e = features[name]  # [batch, dim]: the looked-up, combined ids
        vectors.append(e if e.shape[-1] == INTERACTION_DIM else nn.Dense(INTERACTION_DIM, name=f"project_{name}")(e))
    v = jnp.stack(vectors, axis=1)  # [batch, 1 + features, 16]
    dots = jnp.einsum("bid,bjd->bij", v, v)
    i, j = np.triu_indices(len(vectors), k=1)
    logit = mlp(jnp.concatenate([bottom, dots[:, i, j]], axis=1), [64, 32, 1], "top")[:, 0]
    probability = nn.sigmoid(logit)
    if mode == te.ModeKeys.PREDICT:
        return te.TPUEstimatorSpec(
            mode,
            predictions={"probability": probability},
            export_outputs={"serving_default": te.PredictOutput({"probability": probability})},
        )
    loss = optax.sigmoid_binary_cross_entropy(logit, labels).mean()
    if mode == te.ModeKeys.TRAIN:
        return te.TPUEstimatorSpec(mode, loss=loss, train_op=optax.adam(params["learning_rate"]))
    return te.TPUEstimatorSpec(mode, loss=loss, eval_metrics=(metric_fn, [labels, probability]))


def metric_fn(labels, probability):
    return {
        "accuracy": metrics.accuracy(labels, (probability > 0.5).astype(np.float32)),
        "auc": metrics.auc(labels, probability),
    }


def serving_receiver_fn(vocab: dict[str, int]):
    specs = {"dense": te.TensorSpec((None, NUM_DENSE), np.float32)}
    specs.update({name: te.TensorSpec((None, MULTIVALENT.get(name, 1)), np.int32) for name in vocab})
    return te.build_raw_serving_input_receiver_fn(specs)


def serve_and_ask(export_base: str, features: dict) -> np.ndarray:
    """Starts `tpu-estimator serve`'s server on the exports and POSTs `features` (TF Serving's
    columnar `inputs` form) to `:predict`; the served probabilities."""
    with ServerThread(ModelStore(export_base, poll_seconds=0), "dlrm") as server:
        body = {"inputs": {k: np.asarray(v).tolist() for k, v in features.items()}}
        reply = httpx.post(f"{server.url}/v1/models/dlrm:predict", json=body, timeout=120)
        reply.raise_for_status()
    return np.asarray(reply.json()["outputs"], np.float32)


def run(argv: list[str] | None = None) -> dict:
    """Trains, evaluates, exports and serves (printing as it goes); what it saw, for tests."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model_dir", default="runs/dlrm")
    parser.add_argument("--steps", type=int, default=None, help="training steps (default 400; --quick 60)")
    parser.add_argument("--quick", action="store_true", help="small vocabularies and run (for the test)")
    args = parser.parse_args(argv)
    shutil.rmtree(args.model_dir, ignore_errors=True)
    steps = args.steps or (60 if args.quick else 400)
    batch = 128 if args.quick else 1024
    vocab = vocabularies(args.quick)

    config = te.RunConfig(
        model_dir=args.model_dir,
        tf_random_seed=0,
        save_checkpoints_steps=steps,
        save_summary_steps=20,
        tpu_config=te.TPUConfig(iterations_per_loop=20),
    )
    est = te.TPUEstimator(
        model_fn, config=config, params={"learning_rate": 3e-3, "categorical": list(vocab)}, train_batch_size=batch,
        eval_batch_size=batch, predict_batch_size=batch, embedding_config_spec=embedding_spec(vocab),
    )
    rows = sum(vocab.values())
    print(f"{est.num_replicas} replicas; {len(vocab)} tables, {rows:,} rows; model_dir={est.model_dir}")

    before = est.evaluate(make_input_fn(vocab, 10**6, 4), steps=4)  # held-out batches, fresh model
    est.train(make_input_fn(vocab, 0, steps), max_steps=steps)
    after = est.evaluate(make_input_fn(vocab, 10**6, 4), steps=4)
    for name, r in (("before training", before), (f"after {steps} steps", after)):
        print(f"evaluation {name}: loss={r['loss']:.4f} accuracy={r['accuracy']:.4f} auc={r['auc']:.4f}")
    largest = max(vocab, key=vocab.get)
    print(f"table {largest}: {est.get_variable_value(f'embedding/{largest}').shape} (whole, from 8 shards)")

    export_base = os.path.join(args.model_dir, "export")
    export_dir = est.export_saved_model(export_base, serving_receiver_fn(vocab))
    print(f"exported to {export_dir.decode()}")
    features, labels = synthetic_batch(vocab, 8, 10**7)
    predicted = np.array([p["probability"] for p in est.predict(lambda params: iter([features]))])
    served = serve_and_ask(export_base, features)
    print("clicked   " + " ".join(f"{y:5.0f}" for y in labels))
    print("predicted " + " ".join(f"{p:5.3f}" for p in predicted))
    print("served    " + " ".join(f"{p:5.3f}" for p in served))
    agree = np.allclose(served, predicted, rtol=1e-4, atol=1e-5)
    print(f"the server agrees with predict(): {agree}")
    return {
        "before": before, "after": after, "steps": steps, "vocab": vocab, "export_dir": export_dir.decode(),
        "tables": {n[len("embedding/"):]: shape for n, shape in te.list_variables(est.model_dir)
                   if n.startswith("embedding/") and n.count("/") == 1},
        "features": features, "predicted": predicted, "served": served, "agree": agree,
    }


def main(argv: list[str] | None = None) -> int:
    out = run(argv)
    return 0 if out["agree"] and out["after"]["auc"] > max(out["before"]["auc"], 0.6) else 1


if __name__ == "__main__":
    sys.exit(main())
