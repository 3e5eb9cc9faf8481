"""The planner's rule, measured: the per-replica training step of K tables under each plan.

    .venv/bin/python benchmarks/embedding_plans.py [--rounds N] [--sizes 100x16,1000x16,...]
        [--tables K] [--plans row,replicated,table,column] [--batch B] [--width W] [--hlo]

For each table size (rows x dim) on 8 fake CPU devices: K tables of that size (default 1),
each looked up by one feature of 4 ids per example (`--width`; 30% padding), a global batch
of 1,024 (`--batch`), Adagrad; the step as the estimator runs it (under `shard_map` manual over "data": lookup,
gradient of a loss of the activations, the lazy update), with every table
`TableConfig(sharding=plan)` for each plan asked ("column" where 8 divides the dimension),
and, for K = 1, the reference: a replicated table looked up with `jnp.take`, its dense
gradient all-reduced, `optax.adagrad`. Rounds interleaved; printed: median ms/step
[min-max] per plan and each plan's median ratio to the first plan (< 1: faster than it);
for K = 1 also the process's CPU ms per step of "replicated" and `jnp.take` and their per-round
ratio (CPU time: less swayed by other processes on a shared machine). `--hlo` (K = 1): the
compiled replicated and `jnp.take` steps' instruction counts, scatters and all-reduces.
`embedding/plan.py`'s REPLICATE_MAX_BYTES and TABLE_WISE rule come from this table.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from workloads import set_device_count  # noqa: E402

set_device_count(8)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import tpu_estimator as te  # noqa: E402
from tpu_estimator.embedding.lookup import Collectives  # noqa: E402
from tpu_estimator.embedding.replica import lookup_in_replica, state_specs, update_in_replica  # noqa: E402
from tpu_estimator.embedding.sharded import ShardedTables  # noqa: E402

WIDTH, BATCH, STEPS, LR = 4, 1024, 20, 0.1


def loss_of(act, labels):
    return optax.sigmoid_binary_cross_entropy(act.mean(1), labels).mean()


def ours(mesh, rows: int, dim: int, plan: str, k: int = 1):
    spec = te.EmbeddingConfigSpec(
        feature_to_config_dict={f"f{j}": te.FeatureConfig(f"t{j}") for j in range(k)},
        table_to_config_dict={f"t{j}": te.TableConfig(rows, dim, sharding=plan) for j in range(k)},
        optimization_parameters=te.AdagradParameters(LR),
    )
    n = mesh.size
    tables = ShardedTables(spec, mesh, batch_axis="data", table_axes=("data",))
    coll = Collectives("data", ("data",), n, n)
    stored = tables.stored_spec  # table-wise tables: their stacks (embedding/tablewise.py)

    def step(state, ids, labels, i):
        ids = tables.stored_ids(ids)
        acts = lookup_in_replica(stored, coll, state, ids, {})
        grads = jax.grad(lambda a: sum(loss_of(x, labels) for x in a.values()))(acts)
        return update_in_replica(stored, coll, state, ids, {}, grads, i)

    state = tables.init(jax.random.PRNGKey(0))
    specs = state_specs(state, tables.stored_plans)
    body = jax.shard_map(step, mesh=mesh, in_specs=(specs, P("data"), P("data"), P()), out_specs=specs, check_vma=False)
    return jax.jit(body, donate_argnums=0), state


def reference(mesh, rows: int, dim: int):
    tx = optax.adagrad(LR)
    table = jax.random.normal(jax.random.PRNGKey(0), (rows, dim)) / np.sqrt(dim)

    def step(state, ids, labels, i):
        table, opt = state

        def loss(t):
            x = ids["f"]
            mask = (x >= 0).astype(t.dtype)[..., None]
            rows_ = jnp.take(t, jnp.maximum(x, 0), axis=0) * mask
            return loss_of(rows_.sum(1) / jnp.maximum(mask.sum(1), 1.0), labels)

        grads = jax.lax.pmean(jax.grad(loss)(table), "data")
        updates, opt = tx.update(grads, opt, table)
        return optax.apply_updates(table, updates), opt

    specs = (P(), P())
    body = jax.shard_map(step, mesh=mesh, in_specs=(specs, P("data"), P("data"), P()), out_specs=specs, check_vma=False)
    return jax.jit(body, donate_argnums=0), jax.device_put((table, tx.init(table)), NamedSharding(mesh, P()))


def hlo_summary(hlo: str) -> str:
    """Instructions, scatters and the all-reduces' result shapes of a compiled module's text."""
    ops = collections.Counter(re.findall(r"^\s*(?:ROOT )?%[\w.\-]+ = .*? ([\w\-]+)\(", hlo, re.M))
    reduced = re.findall(r"= (\(?[^=]*?\)?) all-reduce(?:-start)?\(", hlo)
    shapes = [re.sub(r"\{[\d,]*\}", "", r) for r in reduced]
    return f"{sum(ops.values())} instructions, {ops['scatter']} scatter(s), all-reduce(s) of {shapes}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sizes", default="100x16,1000x16,2000x32,5000x32,10000x32")
    parser.add_argument("--tables", type=int, default=1, help="K tables of each size, one feature each")
    parser.add_argument("--plans", default="row,replicated", help="comma-separated; the first is the ratios' base")
    parser.add_argument("--batch", type=int, default=BATCH, help="global batch (a multiple of 8)")
    parser.add_argument("--width", type=int, default=WIDTH, help="ids per example and table (30%% of them -1)")
    parser.add_argument("--hlo", action="store_true", help="print the compiled steps' instruction counts (K = 1)")
    args = parser.parse_args(argv)
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
    plans, batch_size, width = args.plans.split(","), args.batch, args.width
    print(f"jax {jax.__version__}, {mesh.size} {jax.default_backend()} devices, global batch {batch_size}, "
          f"{args.tables} table(s) of each size, {width} ids per example and table, {STEPS} steps per timed "
          f"call, {args.rounds} interleaved rounds")
    for size in args.sizes.split(","):
        rows, dim = (int(v) for v in size.split("x"))
        rng = np.random.RandomState(0)
        ids = {}
        for j in range(args.tables):
            ids[f"f{j}"] = rng.randint(0, rows, (batch_size, width)).astype(np.int32)
            ids[f"f{j}"][rng.rand(batch_size, width) < 0.3] = -1
        batch = jax.device_put((ids, rng.randint(0, 2, batch_size).astype(np.float32)), NamedSharding(mesh, P("data")))
        made = {p: ours(mesh, rows, dim, p, args.tables) for p in plans if p != "column" or dim % mesh.size == 0}
        if args.tables == 1:
            batch = jax.device_put(({"f": ids["f0"]}, batch[1]), NamedSharding(mesh, P("data")))
            made = {p: ours_one(mesh, rows, dim, p) for p in made}
            made["jnp.take"] = reference(mesh, rows, dim)
            if args.hlo:
                for k in [k for k in ("replicated", "jnp.take") if k in made]:
                    f, s = made[k]
                    print(f"  {size} {k}: {hlo_summary(jax.jit(f).lower(s, *batch, jnp.int32(0)).compile().as_text())}")
        made = {k: [f, jax.block_until_ready(f(s, *batch, jnp.int32(0)))] for k, (f, s) in made.items()}
        times, cpu = {k: [] for k in made}, {k: [] for k in made}
        names = list(made)
        for r in range(args.rounds):
            for k in names[r % len(names):] + names[: r % len(names)]:
                f, s = made[k]
                t, c = time.perf_counter(), time.process_time()
                for i in range(STEPS):
                    s = f(s, *batch, jnp.int32(i))
                jax.block_until_ready(s)
                times[k].append((time.perf_counter() - t) / STEPS * 1e3)
                cpu[k].append((time.process_time() - c) / STEPS * 1e3)
                made[k][1] = s
        base = np.array(times[names[0]])
        cells = [
            f"{k} {np.median(v):.2f} [{min(v):.1f}-{max(v):.1f}] ms"
            + ("" if k == names[0] else f" (x{np.median(np.array(v) / base):.2f})")
            for k, v in times.items()
        ]
        if "replicated" in cpu and "jnp.take" in cpu:
            ratio = np.array(cpu["replicated"]) / np.array(cpu["jnp.take"])
            cells.append(f"CPU ms replicated {np.median(cpu['replicated']):.2f} / jnp.take "
                         f"{np.median(cpu['jnp.take']):.2f} = {np.median(ratio):.2f} [{ratio.min():.2f}-{ratio.max():.2f}]")
        print(f"{size:>10} {rows * dim * 4 / 1024:6.0f} KiB: " + ", ".join(cells), flush=True)
    return 0


def ours_one(mesh, rows: int, dim: int, plan: str):
    """`ours` of one table, its feature named "f" (the reference's)."""
    step, state = ours(mesh, rows, dim, plan, 1)
    return (lambda s, ids, labels, i: step(s, {"f0": ids["f"]}, labels, i)), state


if __name__ == "__main__":
    sys.exit(main())
