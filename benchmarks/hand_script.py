"""The hand-written process of `one_process.py`: what a user's own JAX script imports and runs.

Imports numpy, JAX and Optax only (no Flax, no tpu_estimator), and runs one form per
process, as the outside harness of issue 21 did:

  scan  one jitted program per block of `ipl` stacked batches (`lax.scan` for train and
        evaluate, `lax.map` for predict); block L+1 is stacked and placed while block L
        runs, its outputs read once block L+1 is queued
  step  one jitted program per batch, `device_put` as it comes, the host waiting for the
        device every 16 programs

The network is the benchmarks' MLP 784-512-512-10 written as matrix products (Flax's
Dense initialisation: LeCun-normal kernels, zero biases), Adam(1e-3), state donated.
Each mode returns what the estimator's call returns: train nothing, evaluate the mean
loss and accuracy, predict per batch (classes, probabilities) on the host.
"""

from __future__ import annotations

import collections
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

KINDS = ("scan", "step")
WAIT_EVERY = 16


def init(key: jax.Array, sizes=(784, 512, 512, 10)) -> list:
    """[(kernel, bias)] per layer: LeCun-normal kernels (as flax.linen.Dense), zero biases."""
    layers = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        key, sub = jax.random.split(key)
        kernel = jax.nn.initializers.lecun_normal()(sub, (fan_in, fan_out), jnp.float32)
        layers.append((kernel, jnp.zeros((fan_out,), jnp.float32)))
    return layers


def logits_of(params: list, x: jax.Array) -> jax.Array:
    x = x.reshape(x.shape[0], -1)
    for i, (w, b) in enumerate(params):
        x = x @ w + b
        if i < len(params) - 1:
            x = jax.nn.relu(x)
    return x


def xent(logits, labels):
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels)


def blocks(items: list, k: int):
    """Blocks of `k` items stacked on the host and placed, made lazily (overlapping the last)."""
    for i in range(0, len(items), k):
        yield jax.device_put(jax.tree.map(lambda *xs: np.stack(xs), *items[i : i + k]))


def programs(kind: str, batches: list, ipl: int) -> dict[str, Callable[[], object]]:
    """The three modes of `kind`, each a call over all of `batches`."""
    tx = optax.adam(1e-3)
    params = init(jax.random.PRNGKey(0))
    box = [(params, tx.init(params))]
    xs = [x for x, _ in batches]

    def train_step(state, batch):
        p, opt = state
        x, y = batch
        loss, grads = jax.value_and_grad(lambda q: xent(logits_of(q, x), y).mean())(p)
        updates, opt = tx.update(grads, opt, p)
        return (optax.apply_updates(p, updates), opt), loss

    def stats(p, batch):  # (loss sum, correct, count) of one batch
        x, y = batch
        logits = logits_of(p, x)
        n = jnp.float32(y.shape[0])
        return jnp.stack([xent(logits, y).mean() * n, (logits.argmax(-1) == y).sum().astype(jnp.float32), n])

    def outputs(p, x):
        logits = logits_of(p, x)
        return logits.argmax(-1), jax.nn.softmax(logits)

    def result(acc) -> dict:
        loss_sum, correct, n = np.asarray(acc).tolist()
        return {"loss": loss_sum / n, "accuracy": correct / n}

    if kind == "scan":
        train_run = jax.jit(lambda s, blk: lax.scan(train_step, s, blk), donate_argnums=0)
        eval_run = jax.jit(lambda p, acc, blk: lax.scan(lambda a, b: (a + stats(p, b), None), acc, blk)[0],
                           donate_argnums=1)
        predict_run = jax.jit(lambda p, blk: lax.map(lambda x: outputs(p, x), blk))

        def train():
            state, pending = box[0], None
            for blk in blocks(batches, ipl):
                state, losses = train_run(state, blk)
                losses.copy_to_host_async()
                if pending is not None:
                    np.asarray(pending)  # block L's losses once block L+1 is queued
                pending = losses
            np.asarray(pending)
            box[0] = jax.block_until_ready(state)

        def evaluate():
            acc = jnp.zeros(3, jnp.float32)
            for blk in blocks(batches, ipl):
                acc = eval_run(box[0][0], acc, blk)
            return result(acc)

        def predict():
            out, pending = [], None
            for blk in blocks(xs, ipl):
                got = predict_run(box[0][0], blk)
                for leaf in got:
                    leaf.copy_to_host_async()
                if pending is not None:
                    out.extend(_split(pending))
                pending = got
            out.extend(_split(pending))
            return out
    else:
        train_run = jax.jit(train_step, donate_argnums=0)
        eval_run = jax.jit(lambda p, acc, b: acc + stats(p, b), donate_argnums=1)
        predict_run = jax.jit(outputs)

        def train():
            state = box[0]
            for i, b in enumerate(batches):
                state, _ = train_run(state, jax.device_put(b))
                if (i + 1) % WAIT_EVERY == 0:
                    jax.block_until_ready(state)
            box[0] = jax.block_until_ready(state)

        def evaluate():
            acc = jnp.zeros(3, jnp.float32)
            for i, b in enumerate(batches):
                acc = eval_run(box[0][0], acc, jax.device_put(b))
                if (i + 1) % WAIT_EVERY == 0:
                    jax.block_until_ready(acc)
            return result(acc)

        def predict():
            out, queued = [], collections.deque()
            for x in xs:
                got = predict_run(box[0][0], jax.device_put(x))
                for leaf in got:
                    leaf.copy_to_host_async()
                queued.append(got)
                if len(queued) > WAIT_EVERY:
                    out.append(tuple(map(np.asarray, queued.popleft())))
            out.extend(tuple(map(np.asarray, got)) for got in queued)
            return out

    return {"train": train, "evaluate": evaluate, "predict": predict}


def _split(out) -> list:
    classes, probs = np.asarray(out[0]), np.asarray(out[1])
    return [(classes[i], probs[i]) for i in range(classes.shape[0])]
