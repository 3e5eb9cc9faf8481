"""A decoder-only transformer language model written as a TPUEstimator model_fn.

    pip install 'tpu_estimator[examples]'   # the model server and httpx, its HTTP client
    python examples/transformer_lm.py [--quick] [--size 100m] [--model_dir runs/lm] [--steps N]

GPT-style: token and position embeddings, pre-LayerNorm blocks of causal
multi-head attention and a GELU MLP, logits through the tied token embedding.
It trains on 8 (fake CPU) devices on a synthetic language whose next token
follows from the current one (a sparse Markov chain: each token has two
successors, so the best perplexity is 2 where an untrained model's is about
the vocabulary size), evaluates perplexity (exp of the mean token loss) before
and after training, exports, starts the model server on the export and asks
it for the next token over HTTP, which must equal `est.predict()`'s.

Sizes: `--quick` (vocabulary 64, 2 layers of width 64: a test runs it) and
`--size 100m` (vocabulary 32,768, 12 layers of width 768, sequences of 512:
~110M parameters, the benchmark's model). The large-model options of
`TPUConfig` are set by flags when this JAX version of the package has them:
`--parameter_sharding fsdp`, `--precision_policy mixed_bfloat16`,
`--remat_policy full`.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import shutil
import sys

# Eight CPU devices (unless the caller chose a count), set before JAX is imported.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import flax.linen as nn  # noqa: E402
import httpx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import tpu_estimator as te  # noqa: E402
from tpu_estimator.serving.model_store import ModelStore  # noqa: E402
from tpu_estimator.serving.server import ServerThread  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Size:
    vocab: int
    width: int
    layers: int
    heads: int
    seq_len: int
    batch: int  # global batch (sequences)

    @property
    def parameters(self) -> int:
        """Parameters of the model (embeddings, blocks, final LayerNorm)."""
        block = 4 * self.width * self.width + 4 * self.width + 2 * 4 * self.width * self.width + 5 * self.width + 4 * self.width
        return self.vocab * self.width + self.seq_len * self.width + self.layers * block + 2 * self.width

    def train_flops_per_token(self) -> float:
        """Model FLOPs of one training token (forward + backward: 6 per parameter-token, plus
        attention's scores and weighted sum, 12 * layers * width * seq_len), as MaxText counts."""
        return 6.0 * self.parameters + 12.0 * self.layers * self.width * self.seq_len


SIZES = {
    "quick": Size(vocab=64, width=64, layers=2, heads=4, seq_len=32, batch=64),
    "100m": Size(vocab=32768, width=768, layers=12, heads=12, seq_len=512, batch=32),
}


def decoder(tokens: jax.Array, size: Size) -> jax.Array:
    """Logits [batch, seq_len, vocab] of each next token (layers created inline, as in TF1)."""
    embed = nn.Embed(size.vocab, size.width, embedding_init=nn.initializers.normal(0.02), name="embed")
    positions = nn.Embed(size.seq_len, size.width, embedding_init=nn.initializers.normal(0.01), name="positions")
    x = embed(tokens) + positions(jnp.arange(tokens.shape[1]))[None]
    mask = nn.make_causal_mask(tokens)
    for i in range(size.layers):
        h = nn.LayerNorm(name=f"block{i}_ln1")(x)
        x = x + nn.MultiHeadDotProductAttention(size.heads, name=f"block{i}_attention")(h, mask=mask)
        h = nn.LayerNorm(name=f"block{i}_ln2")(x)
        h = nn.Dense(4 * size.width, name=f"block{i}_up")(h)
        x = x + nn.Dense(size.width, name=f"block{i}_down")(nn.gelu(h))
    return embed.attend(nn.LayerNorm(name="final_ln")(x)).astype(jnp.float32)


def model_fn(features, labels, mode, params):
    logits = decoder(features["tokens"], params["size"])
    if mode == te.ModeKeys.PREDICT:
        last = logits[:, -1]
        predictions = {"next_token": last.argmax(-1), "log_probs": jax.nn.log_softmax(last)}
        return te.TPUEstimatorSpec(mode, predictions=predictions)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    if mode == te.ModeKeys.TRAIN:
        schedule = optax.warmup_cosine_decay_schedule(0.0, params["learning_rate"], 10, params["steps"])
        return te.TPUEstimatorSpec(mode, loss=loss, train_op=optax.adamw(schedule, weight_decay=0.01))
    return te.TPUEstimatorSpec(mode, loss=loss)


def successors(vocab: int) -> np.ndarray:
    """[vocab, 2]: the two tokens that may follow each token (the synthetic language)."""
    rng = np.random.RandomState(1)
    return np.stack([rng.permutation(vocab), rng.permutation(vocab)], 1)


def sequences(size: Size, count: int, seed: int) -> np.ndarray:
    """[count, seq_len + 1] int32 token sequences of the language."""
    succ = successors(size.vocab)
    rng = np.random.RandomState(seed)
    out = np.empty((count, size.seq_len + 1), np.int32)
    out[:, 0] = rng.randint(0, size.vocab, count)
    choice = rng.randint(0, 2, (count, size.seq_len))
    for t in range(size.seq_len):
        out[:, t + 1] = succ[out[:, t], choice[:, t]]
    return out


def make_input_fn(size: Size, batches: int, seed: int, *, labels: bool = True):
    def input_fn(params):
        b = params["batch_size"]
        for i in range(batches):
            seq = sequences(size, b, seed * 100_003 + i)
            features = {"tokens": seq[:, :-1]}
            yield (features, seq[:, 1:]) if labels else features

    return input_fn


def perplexity(result: dict) -> float:
    return math.exp(result["loss"])


def serve_and_ask(export_base: str, tokens: np.ndarray) -> np.ndarray:
    """The model server's next tokens for `tokens` (TF Serving's REST `:predict`)."""
    with ServerThread(ModelStore(export_base, poll_seconds=0), "lm") as server:
        body = {"inputs": {"tokens": tokens.tolist()}}
        reply = httpx.post(f"{server.url}/v1/models/lm:predict", json=body, timeout=300)
        reply.raise_for_status()
    return np.asarray(reply.json()["outputs"]["next_token"])


def large_model_options(args: argparse.Namespace) -> dict:
    """The TPUConfig options of the flags that were given (each needs a package that has it)."""
    options = {
        "parameter_sharding": args.parameter_sharding,
        "precision_policy": args.precision_policy,
        "remat_policy": args.remat_policy,
    }
    return {k: v for k, v in options.items() if v is not None}


def run(argv: list[str] | None = None) -> dict:
    """Trains, evaluates, exports and serves (printing as it goes); what it saw, for tests."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model_dir", default="runs/transformer_lm")
    parser.add_argument("--size", choices=sorted(SIZES), default="quick")
    parser.add_argument("--quick", action="store_true", help="the quick size and a short run (for the test)")
    parser.add_argument("--steps", type=int, default=None, help="training steps (default 300; --quick 60)")
    parser.add_argument("--learning_rate", type=float, default=3e-3)
    parser.add_argument("--parameter_sharding", default=None, help="e.g. fsdp")
    parser.add_argument("--precision_policy", default=None, help="e.g. mixed_bfloat16")
    parser.add_argument("--remat_policy", default=None, help="e.g. full")
    args = parser.parse_args(argv)
    size = SIZES["quick" if args.quick else args.size]
    steps = args.steps or (60 if args.quick else 300)
    shutil.rmtree(args.model_dir, ignore_errors=True)

    config = te.RunConfig(
        model_dir=args.model_dir, tf_random_seed=0, save_checkpoints_steps=steps, save_summary_steps=20,
        tpu_config=te.TPUConfig(iterations_per_loop=20, **large_model_options(args)),
    )
    est = te.TPUEstimator(
        model_fn, config=config, params={"size": size, "learning_rate": args.learning_rate, "steps": steps},
        train_batch_size=size.batch, eval_batch_size=size.batch, predict_batch_size=size.batch,
    )
    print(f"{est.num_replicas} replicas; {size.parameters / 1e6:.1f}M parameters; model_dir={est.model_dir}")
    before = est.evaluate(make_input_fn(size, 4, seed=7), steps=4)  # held-out sequences, fresh model
    est.train(make_input_fn(size, steps, seed=1), max_steps=steps)
    after = est.evaluate(make_input_fn(size, 4, seed=7), steps=4)
    for name, r in (("before training", before), (f"after {steps} steps", after)):
        print(f"evaluation {name}: loss={r['loss']:.4f} perplexity={perplexity(r):.2f}")

    export_base = os.path.join(args.model_dir, "export")
    receiver = te.build_raw_serving_input_receiver_fn({"tokens": te.TensorSpec((None, size.seq_len), np.int32)})
    export_dir = est.export_saved_model(export_base, receiver)
    print(f"exported to {export_dir.decode()}")
    tokens = sequences(size, 8, seed=99)[:, :-1]
    predicted = np.array([p["next_token"] for p in est.predict(lambda params: iter([{"tokens": tokens}]))])
    served = serve_and_ask(export_base, tokens)
    allowed = successors(size.vocab)[tokens[:, -1]]
    print("predicted next tokens " + " ".join(map(str, predicted)))
    print("served next tokens    " + " ".join(map(str, served)))
    agree = bool(np.array_equal(served, predicted))
    print(f"the server agrees with predict(): {agree}; "
          f"{int((predicted[:, None] == allowed).any(1).sum())}/8 predictions are successors the language allows")
    return {
        "before": before, "after": after, "steps": steps, "size": size, "export_dir": export_dir.decode(),
        "tokens": tokens, "predicted": predicted, "served": served, "agree": agree, "allowed": allowed,
    }


def main(argv: list[str] | None = None) -> int:
    out = run(argv)
    return 0 if out["agree"] and perplexity(out["after"]) < 0.5 * perplexity(out["before"]) else 1


if __name__ == "__main__":
    sys.exit(main())
