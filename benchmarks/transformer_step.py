"""Where the transformer's 8-device training step loses time: compiled programs timed alone.

    .venv/bin/python benchmarks/transformer_step.py [--devices 8] [--ipl 2] [--calls 2] [--rounds 9]
        [--contenders gspmd-rep,est-rep,manual-rep,train-rep,gspmd-fsdp,est-fsdp,manual-fsdp,ar-fsdp,train-fsdp]
        [--dump DIR] [--profile DIR]

The model of benchmarks/transformer.py at `--size cpu` (4.2M parameters, batch
32 x 128), AdamW, one block of `--ipl` stacked batches per program call,
`--calls` calls per timed call. Contenders (NAME-rep: parameters replicated,
NAME-fsdp: every array of >= 4,096 elements split over "data" on its largest
divisible dimension, the library's and benchmarks/transformer.py's rule):

  gspmd   hand-written: jit(lax.scan(step)), parameters placed by NamedSharding (GSPMD)
  est     the estimator's own train program (loops/train.py `scan_program`, built
          from the library's modules as the estimator builds it), called directly
  manual  hand-written in the estimator's form: shard_map manual over "data";
          fsdp gathers the parameters in the loss (reduce-scatter as its transpose)
  ar      as manual, but the gradients of the whole parameters all-reduced in one
          op and sliced (GSPMD's form of the gradient reduction; tried for the
          estimator on XLA:CPU and not adopted: benchmarks/RESULTS.md, "fsdp on XLA:CPU")
  vmap    GSPMD as gspmd, the model called once per replica (`jax.vmap` over the
          replicas' batches, spmd_axis_name "data"): model_fn's per-replica view in
          GSPMD form (tried for the estimator; slower: every op gains a rank)
  rs      gathered before the loss, each whole gradient reduce-scattered
  rsb     as rs, an optimization barrier on the whole gradients first (XLA:CPU's
          schedule still interleaves the reduce-scatters with the backward pass)
  train   TPUEstimator.train(steps=calls * ipl): the program plus train()'s
          per-call work (feeding, the final checkpoint)

Printed per contender: wall and process CPU seconds per timed call (median
[min-max] over interleaved rounds) and the ratio first contender / this one
per round. On a shared machine the CPU seconds (all threads of this process)
are the measure that does not depend much on the load; wall time does.
`--canonical-dense` (an experiment, benchmarks/RESULTS.md "fsdp on XLA:CPU: the weight
gradients' dots"): the example's `nn.Dense` layers (the MLP) given a dot whose VJP computes
the weight gradient as a canonical dot, then transposes it behind an optimization barrier,
in every contender. `--dump DIR` writes each program's optimized HLO and prints its
`cost_analysis()` flops and bytes. `--profile DIR` traces one more call of each
(jax.profiler) and prints the time of XLA:CPU's thunks summed over the device
threads by HLO op kind (a collective's time includes its wait at the rendezvous).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from transformer import canonical_dense, load_example  # noqa: E402  (imports no JAX: XLA_FLAGS are set first)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=int, default=8)
    p.add_argument("--ipl", type=int, default=2, help="steps per program call (the scan block)")
    p.add_argument("--calls", type=int, default=2, help="program calls per timed call")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--contenders", default="gspmd-rep,est-rep,manual-rep,gspmd-fsdp,est-fsdp,manual-fsdp")
    p.add_argument("--canonical-dense", action="store_true",
                   help="the MLP's weight gradients as canonical dots (see the docstring)")
    p.add_argument("--dump", default=None, help="a folder for each program's optimized HLO")
    p.add_argument("--profile", default=None,
                   help="a folder: each contender traced once (jax.profiler) after the rounds, "
                        "its trace events' time summed by HLO op kind and printed")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={args.devices}"
    ).strip()
    lm = load_example()
    if args.canonical_dense:
        canonical_dense(lm)
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from jax import lax
    from jax.sharding import NamedSharding, PartitionSpec as P

    import tpu_estimator as te
    from tpu_estimator.loops import train as train_loops
    from tpu_estimator.loops.replica import Placement
    from tpu_estimator.model.call import check_model_fn
    from tpu_estimator.model.module import bind_model
    from tpu_estimator.model.spec_view import view_spec
    from tpu_estimator.parallel import partitioning
    from tpu_estimator.parallel.mesh import Topology

    size = lm.Size(vocab=4096, width=256, layers=4, heads=8, seq_len=128, batch=32)
    n, ipl, lr = jax.device_count(), args.ipl, 1e-3
    seqs = [lm.sequences(size, size.batch, seed=i) for i in range(ipl)]
    block = ({"tokens": np.stack([s[:, :-1] for s in seqs])}, np.stack([s[:, 1:] for s in seqs]))
    schedule = optax.warmup_cosine_decay_schedule(0.0, lr, 10, 10**6)

    def estimator_program(fsdp: bool):
        topo = Topology.create(use_tpu=True)
        options = {"parameter_sharding": "fsdp"} if fsdp else {}
        config = te.RunConfig(model_dir=tempfile.mkdtemp(prefix="bench_step_"),
                              tpu_config=te.TPUConfig(iterations_per_loop=ipl, **options))
        params = {"size": size, "learning_rate": lr, "steps": 10**6, "use_tpu": True}
        per_replica = size.batch // n
        model = bind_model(lm.model_fn, check_model_fn(lm.model_fn), "train", params, config, per_replica)
        view = functools.partial(view_spec, mode="train", use_tpu=True, eval_on_tpu=True)

        def shardings(abstract, metadata):
            return partitioning.named(partitioning.state_specs(abstract, topo, metadata=metadata, fsdp=fsdp), topo)

        init = train_loops.init_program(model, view, topo, 0, True, shardings=shardings)
        state = init({"tokens": block[0]["tokens"][0, :per_replica]}, block[1][0, :per_replica])
        placement = Placement("concat", state=jax.tree.map(lambda s: s.spec, init.state_shardings))
        program = train_loops.scan_program(model, view, topo, placement)
        return program, state, jax.device_put(block, NamedSharding(topo.mesh, P(None, "data")))

    def hand_program(form: str, fsdp: bool):
        mesh = jax.make_mesh((n,), ("data",), (jax.sharding.AxisType.Auto,))

        class Net(nn.Module):
            @nn.compact
            def __call__(self, tokens):
                return lm.decoder(tokens, size)

        net = Net()
        params0 = net.init(jax.random.PRNGKey(0), block[0]["tokens"][0, :1])["params"]
        tx = optax.adamw(schedule, weight_decay=0.01)

        def spec_of(x):
            if not fsdp or x.size < 4096:
                return P()
            for d in sorted(range(x.ndim), key=lambda d: (-x.shape[d], -d)):  # the library's tie-break
                if x.shape[d] % n == 0:
                    return P(*[("data" if i == d else None) for i in range(x.ndim)])
            return P()

        specs = jax.tree.map(spec_of, params0)
        axis = lambda s: next((i for i, e in enumerate(s) if e == "data"), None)  # noqa: E731
        gather = lambda p: jax.tree.map(  # noqa: E731
            lambda x, s: x if axis(s) is None else lax.all_gather(x, "data", axis=axis(s), tiled=True), p, specs)

        def loss_of(p, tokens, labels):
            if form == "manual" and fsdp:
                p = gather(p)
            logits = net.apply({"params": p}, tokens)
            return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels).mean()

        def step(state, b):
            p, opt = state
            if form in ("rs", "rsb"):  # gathered outside the loss; whole gradients reduce-scattered
                loss, whole = jax.value_and_grad(loss_of)(gather(p) if fsdp else p, b[0]["tokens"], b[1])
                if form == "rsb":  # every gradient computed before the first reduce-scatter
                    whole = lax.optimization_barrier(whole)
                g = jax.tree.map(lambda x, s: lax.pmean(x, "data") if axis(s) is None else
                                 lax.psum_scatter(x, "data", scatter_dimension=axis(s), tiled=True) / n, whole, specs)
                loss = lax.pmean(loss, "data")
            elif form == "ar":  # whole gradients all-reduced in one op, each replica keeps its shard
                loss, whole = jax.value_and_grad(loss_of)(gather(p) if fsdp else p, b[0]["tokens"], b[1])
                whole, i = lax.pmean(whole, "data"), lax.axis_index("data")
                g = jax.tree.map(lambda x, s, part: x if axis(s) is None else lax.dynamic_slice_in_dim(
                    x, i * part.shape[axis(s)], part.shape[axis(s)], axis(s)), whole, specs, p)
                loss = lax.pmean(loss, "data")
            elif form == "vmap":  # GSPMD, the model called per replica (vmap over "data")
                split = lambda x: lax.with_sharding_constraint(  # noqa: E731
                    x.reshape(n, x.shape[0] // n, *x.shape[1:]), NamedSharding(mesh, P("data")))

                def mean_loss(p, tokens, labels):
                    per = jax.vmap(lambda t, l: loss_of(p, t, l), axis_name="data", spmd_axis_name="data")
                    return per(split(tokens), split(labels)).mean()

                loss, g = jax.value_and_grad(mean_loss)(p, b[0]["tokens"], b[1])
            else:
                loss, g = jax.value_and_grad(loss_of)(p, b[0]["tokens"], b[1])
                if form == "manual":  # what loops/train.py does (parallel/collectives.py shard_mean)
                    g = jax.tree.map(lambda x, s: lax.pmean(x, "data") if axis(s) is None else x / n, g, specs)
                    loss = lax.pmean(loss, "data")
            updates, opt = tx.update(g, opt, p)
            return (optax.apply_updates(p, updates), opt), loss

        named = lambda tree: jax.tree.map(  # noqa: E731
            lambda s: NamedSharding(mesh, s), tree, is_leaf=lambda x: isinstance(x, P))
        p = jax.device_put(jax.tree.map(np.array, params0), named(specs))
        opt_specs = optax.tree_map_params(tx, lambda _, s: s, tx.init(params0), specs,
                                          transform_non_params=lambda _: P(), is_leaf=lambda x: isinstance(x, P))
        state = (p, jax.jit(tx.init, out_shardings=named(opt_specs))(p))
        state_shardings = jax.tree.map(lambda x: x.sharding, state)
        fn = lambda s, blk: lax.scan(step, s, blk)  # noqa: E731
        if form not in ("gspmd", "vmap"):
            specs_ = jax.tree.map(lambda x: x.spec, state_shardings)
            fn = jax.shard_map(fn, mesh=mesh, in_specs=(specs_, P(None, "data")), out_specs=(specs_, P()),
                               axis_names={"data"}, check_vma=False)
        program = jax.jit(fn, donate_argnums=0, out_shardings=(state_shardings, None))
        return program, state, jax.device_put(block, NamedSharding(mesh, P(None, "data")))

    def train_call(fsdp: bool):
        options = {"parameter_sharding": "fsdp"} if fsdp else {}
        config = te.RunConfig(model_dir=tempfile.mkdtemp(prefix="bench_step_"), save_checkpoints_secs=None,
                              save_summary_steps=None, log_step_count_steps=None,
                              tpu_config=te.TPUConfig(iterations_per_loop=ipl, **options))
        est = te.TPUEstimator(lm.model_fn, config=config, train_batch_size=size.batch,
                              params={"size": size, "learning_rate": lr, "steps": 10**6})
        batches = [({"tokens": block[0]["tokens"][i]}, block[1][i]) for i in range(ipl)] * args.calls
        return lambda: est.train(lambda params: iter(batches), steps=len(batches))

    calls, states = {}, {}
    for name in args.contenders.split(","):
        form, sharding = name.split("-")
        fsdp = sharding == "fsdp"
        if form == "train":
            calls[name] = train_call(fsdp)
            continue
        program, states[name], blk = estimator_program(fsdp) if form == "est" else hand_program(form, fsdp)
        if args.dump:
            os.makedirs(args.dump, exist_ok=True)
            compiled = program.lower(states[name], blk).compile()
            with open(os.path.join(args.dump, f"{name}.hlo"), "w") as f:
                f.write(compiled.as_text())
            cost = compiled.cost_analysis()
            print(f"{name:12s} flops {cost.get('flops', 0):.4e}  bytes accessed {cost.get('bytes accessed', 0):.4e}")

        def run(name=name, program=program, blk=blk):
            for _ in range(args.calls):
                states[name], out = program(states[name], blk)
            jax.block_until_ready((states[name], out))

        calls[name] = run

    for name, fn in calls.items():  # warm-up: compiles
        t = time.perf_counter()
        fn()
        print(f"warm-up {name}: {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
    wall, cpu = {k: [] for k in calls}, {k: [] for k in calls}
    for r in range(args.rounds):
        for name in list(calls) if r % 2 == 0 else list(reversed(calls)):
            c, t = time.process_time(), time.perf_counter()
            calls[name]()
            wall[name].append(time.perf_counter() - t)
            cpu[name].append(time.process_time() - c)
    first = list(calls)[0]
    print(f"{n} devices, {args.calls} calls of {ipl} steps per timed call, {args.rounds} interleaved rounds, "
          f"load average {os.getloadavg()[0]:.1f}")

    def spread(xs, fmt):
        return f"{statistics.median(xs):{fmt}} [{min(xs):{fmt}}-{max(xs):{fmt}}]"

    for name in calls:
        rw = [a / b for a, b in zip(wall[first], wall[name])]
        rc = [a / b for a, b in zip(cpu[first], cpu[name])]
        print(f"  {name:12s} wall {spread(wall[name], '.3f')} s  cpu {spread(cpu[name], '.3f')} s  "
              f"{first}/{name}: wall {spread(rw, '.3f')}  cpu {spread(rc, '.3f')}")
    if args.profile:
        for name, fn in calls.items():
            folder = os.path.join(args.profile, name)
            with jax.profiler.trace(folder):
                fn()
            print(f"  {name:12s} trace, ms per timed call summed over threads: {op_times(folder)}")
    return 0


def op_times(folder: str, top: int = 8) -> str:
    """The trace's events named after HLO ops (XLA:CPU's thunks), their durations summed by
    op kind (the name up to its first '.', digits dropped), in ms: the largest `top`, and
    "threads", the number of timelines they ran on."""
    import glob
    import re
    from collections import Counter

    import jax

    path = sorted(glob.glob(os.path.join(folder, "**", "*.xplane.pb"), recursive=True))[-1]
    data = jax.profiler.ProfileData.from_file(path)
    kinds: Counter = Counter()
    for plane in data.planes:
        for line in plane.lines:
            for event in line.events:
                name = event.name
                if re.match(r"^[a-z][\w\-]*(\.\d+)*$", name):  # an HLO instruction's name
                    kinds[re.sub(r"[._]?\d+$", "", name.split(".")[0])] += event.duration_ns / 1e6
    return ", ".join(f"{k} {v:.0f}" for k, v in kinds.most_common(top))


if __name__ == "__main__":
    sys.exit(main())
