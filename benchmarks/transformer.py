"""The transformer LM's training step: TPUEstimator.train vs hand-written JAX, and MFU.

    .venv/bin/python benchmarks/transformer.py [--size cpu] [--devices 8] [--rounds 5]
        [--parameter_sharding fsdp] [--precision_policy mixed_bfloat16] [--remat_policy full]
        [--batch N] [--peak_tflops 989] [--no-marginal] [--canonical-dense]
        [--hand scan,per-step]

The model of examples/transformer_lm.py (a `--size`: "cpu" is small enough for
this 2-core machine; "100m" the ~110M-parameter one for an accelerator), the
same host token batches for every contender, AdamW. Contenders, interleaved
over `--rounds` rounds (one timed call each per round, after a warm-up call):

  estimator  TPUEstimator.train(steps=N) with the example's model_fn and the
             TPUConfig options given (one compiled loop of `--ipl` steps)
  scan       hand-written: jit(lax.scan(step)) over blocks of `--ipl` batches
  per-step   hand-written: one jitted step per batch

The hand-written steps shard the parameters as the estimator's options say:
replicated, or with `--parameter_sharding fsdp` every array of at least 4,096
elements split over all devices on its largest divisible dimension (XLA
gathers them where used: the usual jit + NamedSharding FSDP). Printed:
tokens/s of each, the ratio estimator / faster hand-written per round (median
and range; target >= 0.97), model FLOPs per second (6 per parameter-token plus
attention) and, with `--peak_tflops` (the device's dense peak for the compute
dtype; e.g. 989 for an H100's bf16), model FLOPs utilization.

Two ratios, both "hand-written / estimator" (1.0: as fast; the faster of scan and
per-step is the hand-written time, per round):

  per call   whole calls of `--steps` steps: the estimator's train() includes its fixed
             cost per call (input opening, the final checkpoint that TF's train() commits
             before returning, ...), which the hand loops do not pay.
  per step   the marginal cost of a step, without any fixed cost per call: each contender
             is also timed on calls of 2 x `--steps` steps in the same rounds, and its
             per-step time is (T(2S) - T(S)) / S, S = `--steps`, from the same round's two
             calls; the ratio is the hand-written per-step time over the estimator's. What
             is the same in both calls (compiles are done in the warm-up; the final save of
             the same state) cancels; what grows with the steps (the programs, the input
             fed, the loops' host work) stays. Noisier than the per-call ratio (a difference
             of two timings); `--no-marginal` skips the 2S calls (a third of the time).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "examples", "transformer_lm.py")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="cpu", help="cpu, quick or 100m")
    p.add_argument("--devices", type=int, default=8, help="fake CPU devices (ignored on an accelerator)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=16, help="training steps per timed call")
    p.add_argument("--ipl", type=int, default=8, help="iterations_per_loop and the scan block")
    p.add_argument("--parameter_sharding", default=None)
    p.add_argument("--precision_policy", default=None)
    p.add_argument("--remat_policy", default=None)
    p.add_argument("--batch", type=int, default=None, help="sequences per step (default: the size's)")
    p.add_argument("--peak_tflops", type=float, default=None, help="the device's dense peak, for MFU")
    p.add_argument("--canonical-dense", action="store_true",
                   help="an experiment: the MLP's weight gradients as canonical dots in every contender "
                        "(canonical_dense; benchmarks/RESULTS.md)")
    p.add_argument("--hand", default="scan,per-step",
                   help="the hand-written contenders, comma-separated (e.g. 'scan' alone on an "
                        "accelerator, where the per-step loop costs device time and is the slower)")
    p.add_argument("--no-marginal", dest="marginal", action="store_false",
                   help="skip the calls of 2 x --steps steps (no per-step ratio)")
    return p.parse_args(argv)


def load_example():
    spec = importlib.util.spec_from_file_location("transformer_lm", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def canonical_dense(lm) -> None:
    """The example module's `nn.Dense` with a dot whose weight gradient XLA:CPU runs as a
    YNNPACK dot: JAX's transpose of `x @ w` gives `transpose(dot(g, x))`, which XLA's
    algebraic simplifier folds into one dot with both operands transposed, a form YNNPACK
    does not take (XLA falls back to Eigen's dot, ~2x the time at these shapes). An
    optimization barrier between the dot and the transpose keeps the canonical dot, as
    GSPMD's all-reduce does in the partitioned program."""
    import functools
    import types

    import flax.linen as nn
    import jax
    from jax import lax

    @jax.custom_vjp
    def matmul(x, w):
        return lax.dot_general(x, w, (((x.ndim - 1,), (0,)), ((), ())))

    def backward(res, g):
        x, w = res
        batch = tuple(range(x.ndim - 1))
        dwt = lax.optimization_barrier(lax.dot_general(g, x, ((batch, batch), ((), ()))))  # [out, in]
        return lax.dot_general(g, w, (((g.ndim - 1,), (1,)), ((), ()))), dwt.T

    matmul.defvjp(lambda x, w: (matmul(x, w), (x, w)), backward)

    def dot_general(x, w, dims, precision=None, preferred_element_type=None):
        if dims == (((x.ndim - 1,), (0,)), ((), ())) and w.ndim == 2:
            return matmul(x, w)
        return lax.dot_general(x, w, dims, precision=precision, preferred_element_type=preferred_element_type)

    layers = types.SimpleNamespace(**{k: getattr(nn, k) for k in dir(nn) if not k.startswith("__")})
    layers.Dense = functools.partial(nn.Dense, dot_general=dot_general)
    lm.nn = layers


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={args.devices}"
    ).strip()
    lm = load_example()
    if args.canonical_dense:
        canonical_dense(lm)
    # (the example asks for 8 CPU devices if XLA_FLAGS has none: ours comes first)
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from jax import lax
    from jax.sharding import NamedSharding, PartitionSpec as P

    import tpu_estimator as te

    sizes = dict(lm.SIZES, cpu=lm.Size(vocab=4096, width=256, layers=4, heads=8, seq_len=128, batch=32))
    size = sizes[args.size]
    if args.batch:
        size = dataclasses.replace(size, batch=args.batch)
    n_dev = jax.device_count()
    batches = [
        (lambda s: ({"tokens": s[:, :-1]}, s[:, 1:]))(lm.sequences(size, size.batch, seed=i))
        for i in range(args.ipl * 2)
    ]
    double = [batches[i % len(batches)] for i in range(2 * args.steps)]  # the marginal calls' batches
    batches = double[: args.steps]
    lr, steps = 1e-3, args.steps

    # --- the estimator ---
    options = {k: v for k, v in (("parameter_sharding", args.parameter_sharding),
                                 ("precision_policy", args.precision_policy),
                                 ("remat_policy", args.remat_policy)) if v is not None}
    config = te.RunConfig(model_dir=tempfile.mkdtemp(prefix="bench_lm_"), save_checkpoints_secs=None,
                          save_summary_steps=None, log_step_count_steps=None,
                          tpu_config=te.TPUConfig(iterations_per_loop=args.ipl, **options))
    est = te.TPUEstimator(lm.model_fn, config=config, train_batch_size=size.batch,
                          params={"size": size, "learning_rate": lr, "steps": 10**6})

    def estimator_call(feed=batches):
        est.train(lambda params: iter(feed), steps=len(feed))

    # --- hand-written ---
    mesh = jax.make_mesh((n_dev,), ("data",), (jax.sharding.AxisType.Auto,))
    import flax.linen as nn

    class Net(nn.Module):
        @nn.compact
        def __call__(self, tokens):
            return lm.decoder(tokens, size)

    net = Net()
    params = net.init(jax.random.PRNGKey(0), batches[0][0]["tokens"][:1])["params"]
    tx = optax.adamw(optax.warmup_cosine_decay_schedule(0.0, lr, 10, 10**6), weight_decay=0.01)

    def spec_of(x):
        if args.parameter_sharding != "fsdp" or x.size < 4096:
            return P()
        dims = sorted(range(x.ndim), key=lambda d: (-x.shape[d], -d))  # the library's tie-break
        for d in dims:
            if x.shape[d] % n_dev == 0:
                return P(*[("data" if i == d else None) for i in range(x.ndim)])
        return P()

    shardings = jax.tree.map(lambda x: NamedSharding(mesh, spec_of(x)), params)
    params = jax.device_put(params, shardings)
    replicated = NamedSharding(mesh, P())
    opt_state = jax.tree.map(  # moments follow the parameters; the step count replicated
        lambda x: x if isinstance(x.sharding, NamedSharding) else jax.device_put(x, replicated),
        jax.jit(tx.init)(params),
    )
    batch_sharding = NamedSharding(mesh, P("data"))
    block_sharding = NamedSharding(mesh, P(None, "data"))
    compute = jnp.bfloat16 if args.precision_policy == "mixed_bfloat16" else None

    def loss_fn(p, tokens, labels):
        if compute is not None:
            p = jax.tree.map(lambda x: x.astype(compute), p)
        logits = net.apply({"params": p}, tokens)
        return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels).mean()

    if args.remat_policy == "full":
        loss_fn = jax.checkpoint(loss_fn)

    def step(state, batch):
        p, opt = state
        (x, y) = batch
        loss, grads = jax.value_and_grad(loss_fn)(p, x["tokens"], y)
        updates, opt = tx.update(grads, opt, p)
        return (optax.apply_updates(p, updates), opt), loss

    state_shardings = jax.tree.map(lambda x: x.sharding, (params, opt_state))
    step_jit = jax.jit(step, donate_argnums=0, out_shardings=(state_shardings, None))
    scan_jit = jax.jit(lambda s, blk: lax.scan(step, s, blk), donate_argnums=0, out_shardings=(state_shardings, None))
    box = [(params, opt_state)]

    def per_step_call(feed=batches):
        state = box[0]
        for b in feed:
            state, _ = step_jit(state, jax.device_put(b, batch_sharding))
        box[0] = jax.block_until_ready(state)

    def scan_call(feed=batches):
        state, pending = box[0], None
        for i in range(0, len(feed), args.ipl):
            blk = jax.tree.map(lambda *xs: np.stack(xs), *feed[i : i + args.ipl])
            state, losses = scan_jit(state, jax.device_put(blk, block_sharding))
            if pending is not None:
                np.asarray(pending)
            pending = losses
        np.asarray(pending)
        box[0] = jax.block_until_ready(state)

    hand = [h for h in args.hand.split(",") if h]
    unknown = set(hand) - {"scan", "per-step"}
    if not hand or unknown:
        raise SystemExit(f"--hand takes scan and/or per-step; got {args.hand!r}")
    contenders = {"estimator": estimator_call,
                  **{h: {"scan": scan_call, "per-step": per_step_call}[h] for h in hand}}
    if args.marginal:
        contenders.update({f"{name} 2S": (lambda fn: lambda: fn(double))(fn)
                           for name, fn in list(contenders.items())})
    for name, fn in contenders.items():  # warm-up: compiles (timed on stderr, to see where a slow run goes)
        t = time.perf_counter()
        fn()
        print(f"warm-up {name}: {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
    times = {k: [] for k in contenders}
    for r in range(args.rounds):
        order = list(contenders) if r % 2 == 0 else list(reversed(contenders))
        for name in order:
            t = time.perf_counter()
            contenders[name]()
            times[name].append(time.perf_counter() - t)

    tokens = steps * size.batch * size.seq_len
    flops = size.train_flops_per_token() * tokens
    print(f"size {args.size}: {size.parameters / 1e6:.1f}M parameters, batch {size.batch} x {size.seq_len} tokens, "
          f"{steps} steps per call, {n_dev} devices ({jax.devices()[0].platform}), options {options or 'none'}")
    for name, ts in times.items():
        med = statistics.median(ts) / (2 if name.endswith(" 2S") else 1)  # per S steps
        line = f"  {name:12s} {tokens / med:10.0f} tokens/s  {flops / med / 1e12:8.4f} model TFLOP/s"
        if args.peak_tflops:
            line += f"  MFU {100 * flops / med / 1e12 / (args.peak_tflops * n_dev):5.1f}%"
        print(line + f"  [{min(ts):.3f}-{max(ts):.3f} s]")
    ratios = [min(times[h][i] for h in hand) / times["estimator"][i] for i in range(args.rounds)]
    print(f"  estimator / faster hand-written, per call: median {statistics.median(ratios):.3f} "
          f"[{min(ratios):.3f}-{max(ratios):.3f}] over {args.rounds} rounds")
    if args.marginal:
        def per_step(name, i):  # (T(2S) - T(S)) / S of round i, seconds per step
            return (times[f"{name} 2S"][i] - times[name][i]) / steps

        marginal = {name: [per_step(name, i) for i in range(args.rounds)] for name in ("estimator", *hand)}
        step_ratios = [min(marginal[h][i] for h in hand) / marginal["estimator"][i]
                       for i in range(args.rounds)]
        fixed = [times["estimator"][i] - steps * marginal["estimator"][i] for i in range(args.rounds)]
        print(f"  estimator / faster hand-written, per step ((T(2S) - T(S)) / S): median "
              f"{statistics.median(step_ratios):.3f} [{min(step_ratios):.3f}-{max(step_ratios):.3f}]; "
              f"per step ms: " + ", ".join(f"{k} {1e3 * statistics.median(v):.1f}" for k, v in marginal.items())
              + "; "
              f"the estimator's fixed cost per call (T(S) - S x per step) {statistics.median(fixed):.3f} s "
              f"[{min(fixed):.3f}-{max(fixed):.3f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
