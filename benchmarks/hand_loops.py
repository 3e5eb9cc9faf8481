"""The hand-written references of `benchmarks/loops.py`: train, evaluate and predict loops
as a competent JAX user writes them, in two forms each.

  per-step  one jitted program per batch; each batch `device_put` from the host
            as it comes (sharded over the devices); the host waits for the
            devices every 16 programs (measured faster here than never waiting:
            an unbounded queue holds every placed batch).
  scan      one jitted program per block of `ipl` batches (`lax.scan` for train
            and evaluate, `lax.map` for predict), the block `np.stack`ed and
            placed with one `device_put`. Overlapped as a user would write it:
            block L+1 is stacked and placed while block L runs (dispatch is
            asynchronous), and the host reads block L's outputs (train: its
            losses, as the estimator checks them) only once block L+1 is
            queued, never draining the devices between blocks.

Why the scan block is stacked inside the timed region: the estimator gets the
same host batches one by one from an iterator and must stack or place them
itself, so prestacking the references' blocks outside the clock would time
less work than the estimator does. Stacking block L+1 during block L is the
best a user can do with one thread, so it is what this reference does.

State is donated; parameters and optimizer state are replicated and every
batch is sharded on its leading axis (`workloads.DataParallel`), so with 8
devices each reference is the same global batch in data parallelism.

Evaluate accumulates (loss sum, correct, count) on the device, carried and
donated, and fetches it once at the end (the fastest a user can do: nothing
per batch goes to the host). Predict computes classes (argmax) and
probabilities, copies them to the host asynchronously as soon as a program is
dispatched, and collects them per batch, in order, once later ones are queued.
"""

from __future__ import annotations

import collections
import time
from typing import Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from jax.sharding import PartitionSpec as P

from workloads import DataParallel, Net, xent

MODES = ("train", "evaluate", "predict")
KINDS = ("per-step", "scan")
# Training on several devices is also written with `jax.shard_map` (each device's step on its
# slice of the batch, gradients `pmean`ed): the form the estimator's own programs take,
# where XLA:CPU ran the jit + NamedSharding form at about half the speed.
SHARD_MAP_KINDS = ("per-step/shard_map", "scan/shard_map")
WAIT_EVERY = 16  # per-step: programs queued before the host waits for the devices


def stacked_blocks(batches: list, k: int, place: Callable) -> Iterator:
    """Blocks of `k` batches, stacked on the host and placed, produced lazily (the caller
    asks for block L+1 after dispatching block L, so the two overlap)."""
    for i in range(0, len(batches), k):
        yield place(jax.tree.map(lambda *xs: np.stack(xs), *batches[i : i + k]))


def reference(workload: dict, batches: list, mode: str, kind: str, dp: DataParallel) -> Callable[[], float]:
    """A hand-written `kind` loop of `mode` over `batches`, compiled: returns `timed(n)`,
    which runs it over the first `n` batches (default all) and returns the seconds.

    Scan programs are compiled ahead of time (`lower().compile()`) and not run, so the
    caller's first `timed(ipl)` is a probe of one block without its compilation;
    `timed.prepare(k)` compiles a shorter block to probe first (on XLA:CPU a
    convolution's gradient inside `lax.scan` can be ~25x slower: one block of such a
    loop is already long, and the caller can leave a far slower form out)."""
    net, tx = Net(workload["net"]), optax.adam(1e-3)
    params = net.init(jax.random.PRNGKey(0), batches[0][0])["params"]
    params = dp.put_replicated(params)
    logits_of = lambda p, x: net.apply({"params": p}, x)
    epoch = {"train": _train, "evaluate": _evaluate, "predict": _predict}[mode]
    run, prepare = epoch(logits_of, tx, params, batches, kind, workload["ipl"], dp)
    if kind.startswith("per-step"):
        run(2)  # warm-up: compiles
    else:
        prepare(workload["ipl"])  # compiles, runs nothing

    def timed(n: int = len(batches)) -> float:
        t = time.perf_counter()
        run(n)
        return time.perf_counter() - t

    timed.prepare = prepare  # prepare(k): compile (scan) for a block of k batches
    return timed


class AheadOfTime:
    """A jitted function compiled ahead of time for each input shape (`prepare`), so that
    the first timed call of a shape does not compile; called like the function."""

    def __init__(self, jitted: Callable) -> None:
        self.jitted, self.by_shape = jitted, {}

    def prepare(self, *args) -> None:
        self.by_shape[_shapes(args)] = self.jitted.lower(*args).compile()

    def __call__(self, *args):
        key = _shapes(args)
        if key not in self.by_shape:
            self.prepare(*args)
        return self.by_shape[key](*args)


def _shapes(args) -> tuple:
    return tuple(x.shape for x in jax.tree.leaves(args))


def _block(batches, k, dp):
    return next(stacked_blocks(batches[:k], k, dp.put_block))


def _train(logits_of, tx, params, batches, kind, ipl, dp):
    kind, _, form = kind.partition("/")
    mean = (lambda x: lax.pmean(x, "data")) if form == "shard_map" else (lambda x: x)

    def step(state, batch):
        p, opt = state
        x, y = batch
        loss, grads = jax.value_and_grad(lambda q: xent(logits_of(q, x), y).mean())(p)
        loss, grads = mean(loss), mean(grads)  # (shard_map: over the devices' slices)
        updates, opt = tx.update(grads, opt, p)
        return (optax.apply_updates(p, updates), opt), loss

    def local(fn, batch_spec):  # shard_map form: fn runs on each device's slice
        if form != "shard_map":
            return fn
        return jax.shard_map(fn, mesh=dp.mesh, in_specs=(P(), batch_spec), out_specs=(P(), P()))

    box = [dp.put_replicated((params, tx.init(params)))]
    rep = dp.replicated
    if kind == "per-step":
        run = jax.jit(local(step, P("data")), donate_argnums=0, out_shardings=(rep, rep))

        def epoch(n):
            state = box[0]
            for i, b in enumerate(batches[:n]):
                state, _ = run(state, dp.put_batch(b))
                if (i + 1) % WAIT_EVERY == 0:
                    jax.block_until_ready(state)
            box[0] = jax.block_until_ready(state)
    else:
        scanned = local(lambda s, blk: lax.scan(step, s, blk), P(None, "data"))
        run = AheadOfTime(jax.jit(scanned, donate_argnums=0, out_shardings=(rep, rep)))

        def epoch(n):
            state, pending = box[0], None
            for blk in stacked_blocks(batches[:n], ipl, dp.put_block):
                state, losses = run(state, blk)
                losses.copy_to_host_async()
                if pending is not None:
                    np.asarray(pending)  # the previous block's losses: block L+1 is queued
                pending = losses
            np.asarray(pending)
            box[0] = jax.block_until_ready(state)

        return epoch, lambda k: run.prepare(box[0], _block(batches, k, dp))
    return epoch, None


def _evaluate(logits_of, tx, params, batches, kind, ipl, dp):
    def stats(p, batch):  # (loss sum, correct, count) of one batch
        x, y = batch
        logits = logits_of(p, x)
        n = jnp.float32(y.shape[0])
        correct = (logits.argmax(-1) == y).sum().astype(jnp.float32)
        return jnp.stack([xent(logits, y).mean() * n, correct, n])

    rep = dp.replicated
    zero = lambda: dp.put_replicated(jnp.zeros(3, jnp.float32))
    if kind == "per-step":
        run = jax.jit(lambda p, acc, b: acc + stats(p, b), donate_argnums=1, out_shardings=rep)

        def epoch(n):
            acc = zero()
            for i, b in enumerate(batches[:n]):
                acc = run(params, acc, dp.put_batch(b))
                if (i + 1) % WAIT_EVERY == 0:
                    jax.block_until_ready(acc)
            return _eval_result(acc)
    else:
        body = lambda p, acc, blk: lax.scan(lambda a, b: (a + stats(p, b), None), acc, blk)[0]
        run = AheadOfTime(jax.jit(body, donate_argnums=1, out_shardings=rep))

        def epoch(n):
            acc = zero()
            for blk in stacked_blocks(batches[:n], ipl, dp.put_block):
                acc = run(params, acc, blk)  # block L+1 is stacked while this one runs
            return _eval_result(acc)

        return epoch, lambda k: run.prepare(params, zero(), _block(batches, k, dp))
    return epoch, None


def _eval_result(acc) -> dict:
    loss_sum, correct, n = np.asarray(acc).tolist()
    return {"loss": loss_sum / n, "accuracy": correct / n}


def _predict(logits_of, tx, params, batches, kind, ipl, dp):
    def outputs(p, x):
        logits = logits_of(p, x)
        return logits.argmax(-1), jax.nn.softmax(logits)

    rep = dp.replicated
    xs = [b[0] for b in batches]
    if kind == "per-step":
        run = jax.jit(outputs, out_shardings=(rep, rep))

        def epoch(n):
            results, queued = [], collections.deque()
            for x in xs[:n]:
                out = run(params, dp.put_batch(x))
                for leaf in out:
                    leaf.copy_to_host_async()
                queued.append(out)
                if len(queued) > WAIT_EVERY:
                    results.append(tuple(map(np.asarray, queued.popleft())))
            results.extend(tuple(map(np.asarray, out)) for out in queued)
            return results
    else:
        run = AheadOfTime(jax.jit(lambda p, blk: lax.map(lambda x: outputs(p, x), blk),
                                  out_shardings=(rep, rep)))

        def epoch(n):
            results, pending = [], None
            for blk in stacked_blocks(xs[:n], ipl, dp.put_block):
                out = run(params, blk)
                for leaf in out:
                    leaf.copy_to_host_async()
                if pending is not None:
                    results.extend(_split(pending))
                pending = out
            results.extend(_split(pending))
            return results

        return epoch, lambda k: run.prepare(params, _block(xs, k, dp))
    return epoch, None


def _split(out) -> list:
    """A block's stacked (classes, probabilities) as per-batch host arrays, in order."""
    classes, probs = np.asarray(out[0]), np.asarray(out[1])
    return [(classes[i], probs[i]) for i in range(classes.shape[0])]
