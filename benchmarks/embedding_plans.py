"""The planner's rule, measured: one table's per-replica training step, row-sharded vs replicated.

    .venv/bin/python benchmarks/embedding_plans.py [--rounds N] [--sizes 100x16,1000x16,...] [--batch B] [--hlo]

For each table size (rows x dim) on 8 fake CPU devices: one feature of 4 ids per example
(30% padding), a global batch of 1,024 (`--batch`), Adagrad; the step as the estimator runs it (under
`shard_map` manual over "data": lookup, gradient of a loss of the activations, the lazy
update), with the table `TableConfig(sharding="row")` or `"replicated"`, and the reference:
a replicated table looked up with `jnp.take`, its dense gradient all-reduced, `optax.adagrad`.
Rounds interleaved; printed: median ms/step [min-max] and the ratio row / replicated
(> 1: replicating is faster), then the process's CPU ms per step of replicated and
`jnp.take` and their per-round ratio (CPU time: less swayed by other processes on a shared
machine). `embedding/plan.py`'s REPLICATE_MAX_BYTES comes from this table. `--hlo`: per size,
the compiled replicated and `jnp.take` steps' instruction counts, scatters and all-reduces.
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


def ours(mesh, rows: int, dim: int, plan: str):
    spec = te.EmbeddingConfigSpec(
        feature_to_config_dict={"f": te.FeatureConfig("t")},
        table_to_config_dict={"t": te.TableConfig(rows, dim, sharding=plan)},
        optimization_parameters=te.AdagradParameters(LR),
    )
    n = mesh.size
    tables = ShardedTables(spec, mesh, batch_axis="data", table_axes=("data",))
    coll = Collectives("data", ("data",), n, n)

    def step(state, ids, labels, i):
        acts = lookup_in_replica(spec, coll, state, ids, {})
        grads = jax.grad(lambda a: loss_of(a["f"], labels))(acts)
        return update_in_replica(spec, coll, state, ids, {}, grads, i)

    state = tables.init(jax.random.PRNGKey(0))
    specs = state_specs(state, tables.plans)
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
    parser.add_argument("--batch", type=int, default=BATCH, help="global batch (a multiple of 8)")
    parser.add_argument("--hlo", action="store_true", help="print the compiled steps' instruction counts")
    args = parser.parse_args(argv)
    batch_size = args.batch
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
    print(f"jax {jax.__version__}, {mesh.size} {jax.default_backend()} devices, global batch {batch_size}, "
          f"{WIDTH} ids per example, {STEPS} steps per timed call, {args.rounds} interleaved rounds")
    print(f"{'table':>10} {'KiB':>6} {'row ms':>18} {'replicated ms':>18} {'jnp.take ms':>18} {'row/replicated':>15}"
          f" {'CPU ms: replicated':>19} {'jnp.take':>16} {'replicated/jnp.take':>20}")
    for size in args.sizes.split(","):
        rows, dim = (int(v) for v in size.split("x"))
        rng = np.random.RandomState(0)
        ids = rng.randint(0, rows, (batch_size, WIDTH)).astype(np.int32)
        ids[rng.rand(batch_size, WIDTH) < 0.3] = -1
        labels = rng.randint(0, 2, batch_size).astype(np.float32)
        batch = jax.device_put(({"f": ids}, labels), NamedSharding(mesh, P("data")))
        made = {"row": ours(mesh, rows, dim, "row"), "replicated": ours(mesh, rows, dim, "replicated"),
                "jnp.take": reference(mesh, rows, dim)}
        if args.hlo:
            for k in ("replicated", "jnp.take"):
                f, s = made[k]
                print(f"  {size} {k}: {hlo_summary(f.lower(s, *batch, jnp.int32(0)).compile().as_text())}")
        made = {k: [f, jax.block_until_ready(f(s, *batch, jnp.int32(0)))] for k, (f, s) in made.items()}
        times, cpu = {k: [] for k in made}, {k: [] for k in made}
        names = list(made)
        for r in range(args.rounds):
            for k in names[r % 3:] + names[: r % 3]:
                f, s = made[k]
                t, c = time.perf_counter(), time.process_time()
                for i in range(STEPS):
                    s = f(s, *batch, jnp.int32(i))
                jax.block_until_ready(s)
                times[k].append((time.perf_counter() - t) / STEPS * 1e3)
                cpu[k].append((time.process_time() - c) / STEPS * 1e3)
                made[k][1] = s
        cells = [f"{np.median(v):7.2f} [{min(v):.1f}-{max(v):.1f}]" for v in times.values()]
        ratio = np.array(times["row"]) / np.array(times["replicated"])
        cpu_ratio = np.array(cpu["replicated"]) / np.array(cpu["jnp.take"])
        cpu_cells = [f"{np.median(cpu[k]):7.2f} [{min(cpu[k]):.1f}-{max(cpu[k]):.1f}]"
                     for k in ("replicated", "jnp.take")]
        print(f"{size:>10} {rows * dim * 4 / 1024:6.0f} " + " ".join(f"{c:>18}" for c in cells)
              + f" {np.median(ratio):6.2f} [{ratio.min():.2f}-{ratio.max():.2f}] {cpu_cells[0]:>19} {cpu_cells[1]:>16}"
              + f" {np.median(cpu_ratio):6.2f} [{cpu_ratio.min():.2f}-{cpu_ratio.max():.2f}]", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
