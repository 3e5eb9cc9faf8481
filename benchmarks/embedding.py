"""Large embeddings: tables sharded over 8 devices (ours) vs replicated tables + `jnp.take`.

    .venv/bin/python benchmarks/embedding.py [--rounds N] [--quick] [--with-row] [--with-replicated] [--steps N]
    .venv/bin/python benchmarks/embedding.py --scaling [--rounds N] [--meshes 2x2,4x2]
    .venv/bin/python benchmarks/embedding.py --big-batch [--rounds N]
    .venv/bin/python benchmarks/embedding.py --compile [--rounds N]

`--scaling [--meshes 2x2,4x2]` prints only a weak-scaling table instead (`weak_scaling`): the
per-replica embedding step at 1, 2, 4, 8 devices with a fixed per-device batch,
ids routed to owners vs the global batch all-gathered vs replicated tables;
collective bytes per device from the compiled HLO and ms/step; also with 2 cores
per replica (`num_cores_per_replica=2`, "RxM" = replicas x cores: 2x2, 4x2), as the
estimator runs it: each core looks up its 1/M of the replica's examples, one
all-gather over "model" rebuilds the replica's activations. `--big-batch`: the
same step on 8 devices with a global batch of 8,192, routed vs all-gathered, the
per-round ratio. `--compile`: seconds to compile the per-replica train step of
26 row-sharded tables (the DLRM example's sizes), all routed. `--fusion [--quick]`:
the embedding step alone (lookup, gradients, update; no dense layers), routed
tables of one dimension in one exchange vs each table its own (`Collectives(
fuse_tables=...)`), planner's plans and every table 'row', against replicated
`jnp.take`, interleaved in one process; compile seconds.

The same model and the same global batches, on 8 fake CPU devices: 4 tables
(100,000 x 32, 50,000 x 32, 10,000 x 16, 1,000 x 16; `--quick` divides the
vocabularies by 10), one feature each with 4, 2, 1 and 3 ids per example
(padded with -1, combiner mean), an MLP on the concatenated activations, a
sigmoid cross-entropy; Adagrad (learning rate 0.1) for every variable.

- ours: `TPUEstimator(embedding_config_spec=...)`, whole `est.train()` calls
  (after a warm-up call that compiles): each table placed by the planner
  (embedding/plan.py; the plans are printed): row-sharded tables (each device
  holds 1/8 of the table and slot) or replicated ones (small tables); lookups
  and the lazy Adagrad update of the looked-up rows run in the compiled loop.
  `--with-row` adds "ours (every table 'row')": `TableConfig(sharding="row")`,
  the placement before the planner, in the same interleaved rounds; `--with-replicated`
  "ours (every table 'replicated')" (`TableConfig(sharding="replicated")`: the hand-written
  reference's placement). Each call runs `--steps` steps (default 50, one loop): a call's
  fixed cost (its final checkpoint, which the hand-written loop does not write) is
  spread over them.
- reference: the obvious hand-written version: tables are ordinary parameters
  replicated on every device, looked up with `jnp.take` (masked mean),
  `optax.adagrad` on everything, data-parallel with `jax.jit` + NamedSharding
  (XLA all-reduces the dense table gradients); timed as a per-step loop (each
  batch `device_put`) and as a `lax.scan` loop over blocks stacked on the
  host, the faster of the two being the reference (as in benchmarks/loops.py).

Rounds are interleaved (the order rotates each round); printed: median
ms/step and examples/sec with min-max, the per-round ratio of ours to the
faster reference (> 1: ours faster), and the bytes of tables + optimizer
slots each device holds, from the arrays' addressable shards.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from workloads import set_device_count  # noqa: E402

set_device_count(8)

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import tpu_estimator as te  # noqa: E402

TABLES = {"t0": (100_000, 32, 4), "t1": (50_000, 32, 2), "t2": (10_000, 16, 1), "t3": (1_000, 16, 3)}  # rows, dim, ids/example
BATCH = 1024  # global
STEPS = 50  # per timed call (= iterations_per_loop)
POOL = 8  # distinct batches, reused in turn
LR = 0.1


def tables(quick: bool) -> dict[str, tuple[int, int, int]]:
    return {k: (v // 10 if quick else v, d, w) for k, (v, d, w) in TABLES.items()}


def make_batches(shapes: dict, n: int) -> list[tuple[dict, np.ndarray]]:
    rng = np.random.RandomState(0)
    distinct = []
    for _ in range(min(n, POOL)):
        features = {}
        for name, (v, _, w) in shapes.items():
            ids = rng.randint(0, v, (BATCH, w)).astype(np.int32)
            ids[np.arange(w) >= rng.randint(1, w + 1, (BATCH, 1))] = -1  # 1..w ids per example
            features[name] = ids
        distinct.append((features, rng.randint(0, 2, BATCH).astype(np.float32)))
    return [distinct[i % len(distinct)] for i in range(n)]


class Head(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(1)(nn.relu(nn.Dense(64)(x)))[:, 0]


def loss_of(logits, labels):
    return optax.sigmoid_binary_cross_entropy(logits, labels).mean()


# ---------------------------------------------------------------- ours


def embedding_spec(shapes: dict, sharding: str | None = None) -> te.EmbeddingConfigSpec:
    return te.EmbeddingConfigSpec(
        feature_to_config_dict={name: te.FeatureConfig(name) for name in shapes},
        table_to_config_dict={name: te.TableConfig(v, d, sharding=sharding) for name, (v, d, _) in shapes.items()},
        optimization_parameters=te.AdagradParameters(LR),
    )


def estimator(shapes: dict, sharding: str | None = None, steps: int = STEPS) -> te.TPUEstimator:
    spec = embedding_spec(shapes, sharding)

    def model_fn(features, labels, mode, params):
        logits = Head()(jnp.concatenate([features[name] for name in shapes], axis=1))
        return te.TPUEstimatorSpec(mode, loss=loss_of(logits, labels), train_op=optax.adagrad(LR))

    config = te.RunConfig(
        model_dir=tempfile.mkdtemp(prefix="bench_emb_"), save_checkpoints_secs=None, save_checkpoints_steps=None,
        log_step_count_steps=None, save_summary_steps=None, tpu_config=te.TPUConfig(iterations_per_loop=steps),
    )
    return te.TPUEstimator(model_fn, config=config, train_batch_size=BATCH, embedding_config_spec=spec)


class StateProbe(te.SessionRunHook):
    """The training state after the last loop, as placed (for its per-device bytes)."""

    state = None

    def before_run(self, run_context):
        return te.SessionRunArgs({"state": "state"})

    def after_run(self, run_context, run_values):
        self.state = run_values.results["state"]


# ---------------------------------------------------------------- the hand-written reference


def lookup(table, ids):
    """Masked mean of the rows of `ids` [B, w] (-1: padding)."""
    mask = (ids >= 0).astype(table.dtype)[..., None]
    rows = jnp.take(table, jnp.maximum(ids, 0), axis=0) * mask
    return rows.sum(1) / jnp.maximum(mask.sum(1), 1.0)


class Replicated:
    """Tables as replicated parameters; per-step and scan training loops."""

    def __init__(self, shapes: dict) -> None:
        mesh = jax.make_mesh((8,), ("data",), (jax.sharding.AxisType.Auto,))
        self.rep, self.data, self.block = (NamedSharding(mesh, s) for s in (P(), P("data"), P(None, "data")))
        key = jax.random.PRNGKey(0)
        embed = {k: jax.random.normal(jax.random.fold_in(key, i), (v, d)) / np.sqrt(d)
                 for i, (k, (v, d, _)) in enumerate(shapes.items())}
        width = sum(d for _, d, _ in shapes.values())
        params = {"tables": embed, "head": Head().init(key, jnp.zeros((1, width)))["params"]}
        self.tx = optax.adagrad(LR)
        self.state = jax.device_put((params, self.tx.init(params)), self.rep)
        self.names = list(shapes)

        def step(state, batch):
            (params, opt), (features, labels) = state, batch

            def loss(p):
                acts = jnp.concatenate([lookup(p["tables"][k], features[k]) for k in self.names], axis=1)
                return loss_of(Head().apply({"params": p["head"]}, acts), labels)

            value, grads = jax.value_and_grad(loss)(params)
            updates, opt = self.tx.update(grads, opt, params)
            return (optax.apply_updates(params, updates), opt), value

        self.step = jax.jit(step, donate_argnums=0, out_shardings=(self.rep, self.rep))
        self.scan = jax.jit(lambda s, blk: lax.scan(step, s, blk), donate_argnums=0, out_shardings=(self.rep, self.rep))

    def per_step(self, batches: list) -> float:
        """Keeps one step queued behind the running one: with more, XLA:CPU's 8 fake devices on
        2 cores deadlock in the tables' all-reduce (its rendezvous aborts the process after
        40 s; seen with 50 steps queued)."""
        t = time.perf_counter()
        state, loss = self.state, None
        for b in batches:
            previous = loss
            state, loss = self.step(state, jax.device_put(b, self.data))
            if previous is not None:
                previous.block_until_ready()
        jax.block_until_ready(loss)
        self.state = state
        return time.perf_counter() - t

    def scanned(self, batches: list) -> float:
        t = time.perf_counter()
        block = jax.device_put(jax.tree.map(lambda *xs: np.stack(xs), *batches), self.block)
        self.state, losses = self.scan(self.state, block)
        jax.block_until_ready(losses)
        return time.perf_counter() - t


def per_device_bytes(arrays) -> int:
    """The most bytes of `arrays` any one device holds."""
    held = {}
    for a in jax.tree.leaves(arrays):
        for shard in a.addressable_shards:
            held[shard.device] = held.get(shard.device, 0) + shard.data.nbytes
    return max(held.values())


# ---------------------------------------------------------------- weak scaling (--scaling)

SCALE_TABLE = (100_000, 32)  # rows, dim: one table
SCALE_FEATURES, SCALE_WIDTH, SCALE_PER_DEVICE = 4, 4, 128  # the shape
SCALE_STEPS = 10  # per timed call
COLLECTIVE_OPS = ("all-to-all", "all-gather", "reduce-scatter", "all-reduce", "collective-permute")
_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "f32": 4, "s32": 4, "u32": 4,
                "f64": 8, "s64": 8}


def _shape_bytes(text: str) -> int:
    pattern = r"\b(" + "|".join(_DTYPE_BYTES) + r")\[([\d,]*)\]"
    return sum(_DTYPE_BYTES[t] * int(np.prod([int(d) for d in dims.split(",") if d]))
               for t, dims in re.findall(pattern, text))


def collective_bytes(hlo: str) -> tuple[int, int]:
    """(all, one round): the sum over the module's collectives of the larger of operand and result
    bytes, as tests/embedding/test_collective_bytes.py: every computation once (loop bodies, both
    branches of a conditional); then without those under a conditional's branch that loops (the
    routed backward's rounds beyond the first, not run when one round suffices)."""
    computations: dict[str, list[str]] = {}
    current = None
    for line in hlo.splitlines():
        head = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$", line)
        if head:
            current = computations.setdefault(head.group(1), [])
        elif current is not None:
            current.append(line)
    calls = {name: set(re.findall(r"(?:calls|body|condition|to_apply)=%?([\w.\-]+)", "\n".join(lines)))
             for name, lines in computations.items()}
    looping = set()
    for lines in computations.values():
        for group in re.findall(r"branch_computations=\{([^}]*)\}", "\n".join(lines)):
            for branch in (c.strip().lstrip("%") for c in group.split(",")):
                if any(" while(" in line for line in computations.get(branch, ())):
                    todo = [branch]
                    while todo:
                        name = todo.pop()
                        if name not in looping:
                            looping.add(name)
                            todo.extend(calls.get(name, ()))
    shapes, total, once = {}, 0, 0
    for name, lines in computations.items():
        for line in lines:
            m = re.match(r"^\s*(?:ROOT )?%([\w.\-]+) = (.*?) ([\w\-]+)\((.*)$", line)
            if not m:
                continue
            instruction, result, op, rest = m.groups()
            shapes[instruction] = _shape_bytes(result)
            if op.removesuffix("-start") in COLLECTIVE_OPS:
                operands = re.findall(r"%([\w.\-]+)", rest.split("),")[0])
                size = max(shapes[instruction], sum(shapes.get(o, 0) for o in operands))
                total += size
                once += 0 if name in looping else size
    return total, once


def scaling_spec() -> te.EmbeddingConfigSpec:
    return te.EmbeddingConfigSpec(
        feature_to_config_dict={f"f{i}": te.FeatureConfig("t") for i in range(SCALE_FEATURES)},
        table_to_config_dict={"t": te.TableConfig(*SCALE_TABLE)},
        optimization_parameters=te.AdagradParameters(LR), partition_strategy="mod",
    )


def scaling_loss(acts: dict, labels) -> jax.Array:
    """A loss with no dense parameters (so no dense gradient all-reduce): logit = mean of the
    concatenated activations."""
    logits = jnp.concatenate([acts[k] for k in sorted(acts)], axis=1).mean(axis=1)
    return loss_of(logits, labels)


def scaling_program(n: int, form: str, cores: int = 1):
    """(jitted step (state, ids, labels, step) -> state, initial state, mesh) on the first n
    devices: form "routed" / "all_gather" (sharded tables, the per-replica step) or
    "replicated". `cores` > 1: replicas of that many cores (`num_cores_per_replica`), an
    (n / cores) x cores ("data", "model") mesh run as the estimator runs it
    (`scaling_replica_program`)."""
    if cores > 1:
        return scaling_replica_program(n // cores, cores, form)
    from tpu_estimator.embedding.lookup import Collectives
    from tpu_estimator.embedding.replica import lookup_in_replica, state_specs, update_in_replica
    from tpu_estimator.embedding.sharded import ShardedTables

    spec = scaling_spec()
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:n]), ("data",))
    data, rep = P("data"), P()
    if form == "replicated":
        step, state = replicated_scaling_step(n > 1)
        specs = (rep, rep)
    else:
        tables = ShardedTables(spec, mesh, batch_axis="data", table_axes=("data",))
        routing = "owners" if form == "routed" else "all_gather"
        coll = Collectives("data", ("data",), n, n, routing=routing) if n > 1 else Collectives()
        state = tables.init(jax.random.PRNGKey(0))

        def step(state, ids, labels, step):
            acts = lookup_in_replica(spec, coll, state, ids, {})
            grads = jax.grad(lambda a: scaling_loss(a, labels))(acts)
            return update_in_replica(spec, coll, state, ids, {}, grads, step)

        specs = state_specs(state, tables.plans)
    if n > 1:
        step = jax.shard_map(step, mesh=mesh, in_specs=(specs, data, data, rep), out_specs=specs, check_vma=False)
    program = jax.jit(step, donate_argnums=0)
    sharding = jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda s: isinstance(s, P))
    return program, jax.device_put(state, sharding), mesh


def replicated_scaling_step(all_reduce: bool):
    """(the hand-written per-replica step with the table replicated: `jnp.take`, the dense
    table gradient `pmean`ed over "data" when `all_reduce`, `optax.adagrad`; its state)."""
    tx = optax.adagrad(LR)
    table = jax.random.normal(jax.random.PRNGKey(0), SCALE_TABLE) / np.sqrt(SCALE_TABLE[1])

    def step(state, ids, labels, step):
        table, opt = state
        loss = lambda t: scaling_loss({k: lookup(t, v) for k, v in ids.items()}, labels)  # noqa: E731
        grads = jax.grad(loss)(table)
        if all_reduce:
            grads = jax.lax.pmean(grads, "data")  # the dense table gradient, all-reduced
        updates, opt = tx.update(grads, opt, table)
        return optax.apply_updates(table, updates), opt

    return step, (table, tx.init(table))


def scaling_replica_program(replicas: int, cores: int, form: str):
    """The weak-scaling step with `num_cores_per_replica=cores`: manual over "data", each
    replica's examples (cores x the per-device batch) split over its cores inside
    (embedding/replica.py), the tables over every device (`replica_tables`), ids routed
    ("routed") or the global batch all-gathered ("all_gather") over ("data", "model");
    "replicated": the hand-written step per replica ("model" left to XLA)."""
    import dataclasses

    from tpu_estimator.embedding.replica import (
        lookup_in_replica,
        replica_collectives,
        replica_tables,
        state_specs,
        table_axes,
        update_in_replica,
    )
    from tpu_estimator.parallel.mesh import Topology

    spec = scaling_spec()
    mesh = jax.sharding.Mesh(np.array(jax.devices()[: replicas * cores]).reshape(replicas, cores), ("data", "model"))
    if form == "replicated":
        step, state = replicated_scaling_step(replicas > 1)
        specs = placed = (P(), P())
    else:
        topology = Topology(mesh, num_hosts=1, host_id=0)
        tables = replica_tables(spec, topology)
        coll = dataclasses.replace(replica_collectives(topology),
                                   routing="owners" if form == "routed" else "all_gather")
        state = tables.init(jax.random.PRNGKey(0))

        def step(state, ids, labels, step):
            acts = lookup_in_replica(spec, coll, state, ids, {})
            grads = jax.grad(lambda a: scaling_loss(a, labels))(acts)
            return update_in_replica(spec, coll, state, ids, {}, grads, step)

        specs = state_specs(state, tables.plans)  # per replica: manual over "data"
        placed = state_specs(state, tables.plans, table_axes(topology))  # on the mesh: over every device
    step = jax.shard_map(step, mesh=mesh, in_specs=(specs, P("data"), P("data"), P()), out_specs=specs,
                         axis_names={"data"}, check_vma=False)
    program = jax.jit(step, donate_argnums=0)
    sharding = jax.tree.map(lambda s: NamedSharding(mesh, s), placed, is_leaf=lambda s: isinstance(s, P))
    return program, jax.device_put(state, sharding), mesh


def scaling_batches(n: int, mesh, count: int = 4, per_device: int = SCALE_PER_DEVICE) -> list:
    rng = np.random.RandomState(n)
    out = []
    for _ in range(count):
        b = n * per_device
        ids = {f"f{i}": rng.randint(0, SCALE_TABLE[0], (b, SCALE_WIDTH)).astype(np.int32)
               for i in range(SCALE_FEATURES)}
        for v in ids.values():
            v[rng.rand(*v.shape) < 0.25] = -1
        labels = rng.randint(0, 2, b).astype(np.float32)
        out.append(jax.device_put((ids, labels), NamedSharding(mesh, P("data"))))
    return out


def timed_rounds(made: dict, forms: tuple, rounds: int) -> dict[str, list[float]]:
    """ms per step of each form's `[program, state, batches]` in `made`, SCALE_STEPS steps per
    timed call, the forms interleaved (their order rotated each round)."""
    times: dict[str, list[float]] = {form: [] for form in forms}
    for r in range(rounds):
        k = r % len(forms)
        for form in forms[k:] + forms[:k]:
            program, state, batches = made[form]
            t = time.perf_counter()
            for i in range(SCALE_STEPS):
                state = program(state, *batches[i % len(batches)], jnp.int32(i))
            jax.block_until_ready(state)
            times[form].append((time.perf_counter() - t) / SCALE_STEPS * 1e3)
            made[form][1] = state
    return times


SCALE_MESHES = ((1, 1), (2, 1), (4, 1), (8, 1), (2, 2), (4, 2))  # (replicas, cores per replica)


def weak_scaling(rounds: int, meshes: tuple[tuple[int, int], ...] = SCALE_MESHES) -> None:
    """The weak-scaling table: per mesh (replicas x cores per replica) the three forms,
    interleaved, SCALE_PER_DEVICE examples per device (a replica of M cores: M x that)."""
    forms = ("routed", "all_gather", "replicated")
    print(f"weak scaling: jax {jax.__version__}, one table {SCALE_TABLE[0]:,} x {SCALE_TABLE[1]} ('mod'), "
          f"{SCALE_FEATURES} features of width {SCALE_WIDTH} (25% padding), {SCALE_PER_DEVICE} examples per device, "
          f"Adagrad; {SCALE_STEPS} steps per timed call, {rounds} interleaved rounds", flush=True)
    print(f"{'devices':>7} {'form':>11} {'collective MB/device: HLO, one round':>37} {'ms/step median [min-max]':>26} "
          f"{'its time / routed, per round':>29}")
    for replicas, cores in meshes:
        n, made, hlo_mb = replicas * cores, {}, {}
        for form in forms:
            program, state, mesh = scaling_program(n, form, cores)
            batches = scaling_batches(n, mesh)
            compiled = program.lower(state, *batches[0], jnp.int32(0)).compile()
            hlo_mb[form] = [b / 1e6 for b in collective_bytes(compiled.as_text())]
            state = program(state, *batches[0], jnp.int32(0))
            jax.block_until_ready(state)
            made[form] = [program, state, batches]
        times = timed_rounds(made, forms, rounds)
        for form in forms:
            ms, ratio = np.array(times[form]), np.array(times[form]) / np.array(times["routed"])
            total, once = hlo_mb[form]
            spread = f"{np.median(ms):>12.1f} [{ms.min():.1f}-{ms.max():.1f}]".ljust(26)
            versus = f"{np.median(ratio):>12.2f} [{ratio.min():.2f}-{ratio.max():.2f}]"
            print(f"{f'{replicas}x{cores}':>7} {form:>11} {total:>28.3f} {once:>8.3f} {spread} {versus}", flush=True)
        del made


def parse_meshes(text: str) -> tuple[tuple[int, int], ...]:
    """"2x1,2x2" -> ((2, 1), (2, 2)): replicas x cores per replica, at most 8 devices each."""
    meshes = []
    for item in text.split(","):
        parts = item.strip().split("x")
        if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts) or int(parts[0]) * int(parts[1]) > 8:
            raise SystemExit(f"--meshes: expected RxM items (replicas x cores, R*M <= 8) separated by commas; "
                             f"received {item!r}")
        meshes.append((int(parts[0]), int(parts[1])))
    return tuple(meshes)


# ---------------------------------------------------------------- a global batch of 8,192 (--big-batch)

BIG_PER_DEVICE = 1024  # x 8 devices: the global batch of 8,192


def big_batch(rounds: int) -> None:
    """The weak-scaling step on 8 devices with 1,024 examples each: ids routed to owners vs
    the global batch all-gathered, interleaved; the per-round ratio of their step times."""
    forms, n = ("routed", "all_gather"), 8
    print(f"global batch {n * BIG_PER_DEVICE:,} on {n} devices: jax {jax.__version__}, one table "
          f"{SCALE_TABLE[0]:,} x {SCALE_TABLE[1]} ('mod'), {SCALE_FEATURES} features of width {SCALE_WIDTH}, "
          f"Adagrad; {SCALE_STEPS} steps per timed call, {rounds} interleaved rounds", flush=True)
    made = {}
    for form in forms:
        program, state, mesh = scaling_program(n, form)
        batches = scaling_batches(n, mesh, per_device=BIG_PER_DEVICE)
        state = program(state, *batches[0], jnp.int32(0))
        jax.block_until_ready(state)
        made[form] = [program, state, batches]
    times = timed_rounds(made, forms, rounds)
    for form in forms:
        ms = np.array(times[form])
        print(f"{form:>11} ms/step median {np.median(ms):.1f} [{ms.min():.1f}-{ms.max():.1f}]")
    ratio = np.array(times["all_gather"]) / np.array(times["routed"])
    print(f"all_gather / routed step time, per round: median {np.median(ratio):.2f} "
          f"[{ratio.min():.2f}-{ratio.max():.2f}] (> 1: routed faster)", flush=True)


# ---------------------------------------------------------------- fused vs per-table exchanges (--fusion)


def fusion_program(shapes: dict, sharding: str | None, fuse: bool):
    """(jitted embedding step (state, ids, labels, step) -> state, initial state, compile s) of
    `shapes`' tables on 8 devices as the estimator's per-replica step runs them (plans by the
    planner's for a global batch of BATCH, or every table `sharding`; routing "auto"), tables
    fused or each on its own."""
    from tpu_estimator.embedding.lookup import Collectives
    from tpu_estimator.embedding.plan import pinned
    from tpu_estimator.embedding.replica import lookup_in_replica, state_specs, update_in_replica
    from tpu_estimator.embedding.sharded import ShardedTables

    n = jax.device_count()
    spec = pinned(embedding_spec(shapes, sharding), n, global_batch=BATCH)  # the plans the estimator's would be
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
    tables = ShardedTables(spec, mesh, batch_axis="data", table_axes=("data",))
    coll = Collectives("data", ("data",), n, n, fuse_tables=fuse)
    state = tables.init(jax.random.PRNGKey(0))

    def step(state, ids, labels, step):
        acts = lookup_in_replica(spec, coll, state, ids, {})
        grads = jax.grad(lambda a: scaling_loss(a, labels))(acts)
        return update_in_replica(spec, coll, state, ids, {}, grads, step)

    specs = state_specs(state, tables.plans)
    data = P("data")
    program = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(specs, data, data, P()), out_specs=specs,
                                    check_vma=False), donate_argnums=0)
    return program, state, mesh


def replicated_program(shapes: dict):
    """The same step with every table replicated: `jnp.take`, the dense gradients `pmean`ed,
    `optax.adagrad` (the hand-written form, per replica)."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
    tx, key = optax.adagrad(LR), jax.random.PRNGKey(0)
    embed = {k: jax.random.normal(jax.random.fold_in(key, i), (v, d)) / np.sqrt(d)
             for i, (k, (v, d, _)) in enumerate(shapes.items())}

    def step(state, ids, labels, step):
        params, opt = state
        loss = lambda p: scaling_loss({k: lookup(p[k], v) for k, v in ids.items()}, labels)  # noqa: E731
        grads = jax.lax.pmean(jax.grad(loss)(params), "data")
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), opt

    program = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(P(), P("data"), P("data"), P()), out_specs=P(),
                                    check_vma=False), donate_argnums=0)
    state = jax.device_put((embed, tx.init(embed)), NamedSharding(mesh, P()))
    return program, state, mesh


def fusion(shapes: dict, rounds: int) -> None:
    """The embedding step alone (no dense layers) of the benchmark's tables on 8 devices:
    tables fused vs each table's own exchange (`Collectives(fuse_tables=...)`), with the
    planner's plans and with every table 'row', against replicated `jnp.take`; interleaved
    in one process; compile seconds of each."""
    contenders = {
        "planner, fused": (None, True), "planner, per table": (None, False),
        "every table 'row', fused": ("row", True), "every table 'row', per table": ("row", False),
        "replicated jnp.take": None,
    }
    print(f"embedding step alone: jax {jax.__version__}, {jax.device_count()} devices, global batch {BATCH}, "
          f"{SCALE_STEPS} steps per timed call, {rounds} interleaved rounds; tables (rows x dim, ids/example): "
          + ", ".join(f"{v:,}x{d} ({w})" for v, d, w in shapes.values()), flush=True)
    made, compile_s = {}, {}
    raw = make_batches(shapes, 4)
    for name, how in contenders.items():
        program, state, mesh = replicated_program(shapes) if how is None else fusion_program(shapes, *how)
        batches = [jax.device_put((f, y), NamedSharding(mesh, P("data"))) for f, y in raw]
        t = time.perf_counter()
        program = program.lower(state, *batches[0], jnp.int32(0)).compile()
        compile_s[name] = time.perf_counter() - t
        state = program(state, *batches[0], jnp.int32(0))
        jax.block_until_ready(state)
        made[name] = [program, state, batches]
    names = list(contenders)
    times = {k: [] for k in names}
    for r in range(rounds):
        for k in names[r % len(names):] + names[: r % len(names)]:
            program, state, batches = made[k]
            t = time.perf_counter()
            for i in range(SCALE_STEPS):
                state = program(state, *batches[i % len(batches)], jnp.int32(i))
            jax.block_until_ready(state)
            times[k].append((time.perf_counter() - t) / SCALE_STEPS * 1e3)
            made[k][1] = state
    reference = np.array(times["replicated jnp.take"])
    print(f"{'contender':30} {'ms/step median [min-max]':>26} {'/ replicated jnp.take':>24} {'compile s':>10}")
    for k in names:
        ms, ratio = np.array(times[k]), reference / np.array(times[k])
        print(f"{k:30} {np.median(ms):>12.2f} [{ms.min():.2f}-{ms.max():.2f}] {np.median(ratio):>12.2f} "
              f"[{ratio.min():.2f}-{ratio.max():.2f}] {compile_s[k]:>8.1f}")
    for plan in ("planner", "every table 'row'"):
        ratio = np.array(times[f"{plan}, per table"]) / np.array(times[f"{plan}, fused"])
        print(f"{plan}: per-table / fused step time, per round: median {np.median(ratio):.2f} "
              f"[{ratio.min():.2f}-{ratio.max():.2f}] (> 1: fused faster)", flush=True)


# ---------------------------------------------------------------- compile time (--compile)


def compile_spec() -> te.EmbeddingConfigSpec:
    """The DLRM example's 26 tables (10 ... 1,000,000 rows spaced geometrically; dimension 16,
    32 or 64 by size), one feature each, every table row-sharded (so every one is routed)."""
    vocab = [int(v) for v in np.geomspace(10, 1e6, 26)]
    dims = [16 if v < 1_000 else 32 if v < 100_000 else 64 for v in vocab]
    return te.EmbeddingConfigSpec(
        feature_to_config_dict={f"c{i}": te.FeatureConfig(f"c{i}") for i in range(26)},
        table_to_config_dict={f"c{i}": te.TableConfig(v, d, sharding="row") for i, (v, d) in enumerate(zip(vocab, dims))},
        optimization_parameters=te.AdagradParameters(LR),
    )


def compile_time(rounds: int) -> None:
    """Seconds to `lower().compile()` the per-replica train step of `compile_spec` on 8
    devices (32 examples per device, ids routed to owners), and its all-to-alls in the HLO."""
    from tpu_estimator.embedding.lookup import Collectives
    from tpu_estimator.embedding.replica import lookup_in_replica, state_specs, update_in_replica
    from tpu_estimator.embedding.sharded import ShardedTables

    spec, n = compile_spec(), 8
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:n]), ("data",))
    tables = ShardedTables(spec, mesh, batch_axis="data", table_axes=("data",))
    coll = Collectives("data", ("data",), n, n, routing="owners")
    state = jax.eval_shape(lambda: tables.build(jax.random.PRNGKey(0)))

    def step(state, ids, step):
        acts = lookup_in_replica(spec, coll, state, ids, {})
        grads = jax.grad(lambda a: sum(jnp.sum(jnp.tanh(x)) for x in a.values()))(acts)
        return update_in_replica(spec, coll, state, ids, {}, grads, step)

    specs = state_specs(state, tables.plans)
    ids = {f: jax.ShapeDtypeStruct((n * 32, 1), jnp.int32) for f in spec.features}
    seconds = []
    for _ in range(rounds):
        program = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(specs, P("data"), P()), out_specs=specs,
                                        check_vma=False))
        t = time.perf_counter()
        hlo = program.lower(state, ids, jax.ShapeDtypeStruct((), jnp.int32)).compile().as_text()
        seconds.append(time.perf_counter() - t)
        jax.clear_caches()
    all_to_alls = len(re.findall(r" all-to-all(?:-start)?\(", hlo))
    s = np.array(seconds)
    print(f"compile, 26 routed tables on {n} devices (jax {jax.__version__}, {te.__file__}): median "
          f"{np.median(s):.1f} s [{s.min():.1f}-{s.max():.1f}] over {rounds}; all-to-alls in the HLO: {all_to_alls}",
          flush=True)


# ---------------------------------------------------------------- driver


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 5; --quick: 3)")
    parser.add_argument("--quick", action="store_true", help="vocabularies / 10, 3 rounds unless --rounds")
    parser.add_argument("--scaling", action="store_true",
                        help="only the weak-scaling table (1, 2, 4, 8 devices; 2x2 and 4x2 with 2 cores per replica)")
    parser.add_argument("--meshes", default=None, help="--scaling's meshes, RxM (replicas x cores), e.g. 2x2,4x2")
    parser.add_argument("--with-row", action="store_true", help="also ours with every table row-sharded")
    parser.add_argument("--with-replicated", action="store_true", help="also ours with every table replicated")
    parser.add_argument("--steps", type=int, default=STEPS, help=f"steps per train() call (default {STEPS})")
    parser.add_argument("--big-batch", action="store_true", help="only routed vs all-gathered at a global batch of 8,192")
    parser.add_argument("--compile", action="store_true", help="only the compile time of 26 routed tables")
    parser.add_argument("--fusion", action="store_true", help="only the embedding step: fused vs per-table exchanges")
    args = parser.parse_args(argv)
    rounds = args.rounds if args.rounds is not None else 3 if args.quick else 5
    if args.scaling:
        weak_scaling(rounds, parse_meshes(args.meshes) if args.meshes else SCALE_MESHES)
        return 0
    if args.big_batch:
        big_batch(rounds)
        return 0
    if args.compile:
        compile_time(rounds)
        return 0
    if args.fusion:
        fusion(tables(args.quick), rounds)
        return 0
    shapes = tables(args.quick)
    steps = args.steps
    batches = make_batches(shapes, steps)
    t0 = time.perf_counter()

    from tpu_estimator.embedding.plan import describe

    est, probe = estimator(shapes, steps=steps), StateProbe()
    print("\n".join(describe(embedding_spec(shapes), jax.device_count(), global_batch=BATCH)), flush=True)
    est.train(lambda params: iter(batches), steps=steps, hooks=[probe])  # warm-up: compiles
    print(f"warm-up: ours {time.perf_counter() - t0:.0f} s", flush=True)
    emb = probe.state.extras["embedding"]  # (read now: the next call donates these buffers)
    ours_bytes = per_device_bytes((emb.tables, emb.slots))
    ref = Replicated(shapes)
    ref.per_step(batches[:2])
    ref.scanned(batches)  # compiles the scan over a whole call's steps

    def ours() -> float:
        t = time.perf_counter()
        est.train(lambda params: iter(batches), steps=steps)
        return time.perf_counter() - t

    contenders = {"ours (planner)": ours, "replicated per-step": lambda: ref.per_step(batches),
                  "replicated scan": lambda: ref.scanned(batches)}
    for plan in [p for p, asked in (("row", args.with_row), ("replicated", args.with_replicated)) if asked]:
        other = estimator(shapes, plan, steps)
        other.train(lambda params: iter(batches), steps=steps)  # warm-up: compiles

        def ours_plan(other=other) -> float:
            t = time.perf_counter()
            other.train(lambda params: iter(batches), steps=steps)
            return time.perf_counter() - t

        contenders[f"ours (every table '{plan}')"] = ours_plan
    seconds = {k: [] for k in contenders}
    names = list(contenders)
    for r in range(rounds):
        for k in names[r % len(names):] + names[: r % len(names)]:
            seconds[k].append(contenders[k]())
            print(f"  round {r + 1}: {k} {seconds[k][-1] / steps * 1e3:.1f} ms/step", flush=True)

    print(f"jax {jax.__version__}, {jax.device_count()} {jax.default_backend()} devices, global batch {BATCH}, "
          f"{steps} steps per call, {rounds} interleaved rounds; tables (rows x dim, ids/example): "
          + ", ".join(f"{v:,}x{d} ({w})" for v, d, w in shapes.values()))
    print(f"{'contender':33} {'ms/step median [min-max]':>24} {'examples/s median':>18}")
    for k, s in seconds.items():
        ms = np.array(s) / steps * 1e3
        print(f"{k:33} {np.median(ms):8.1f} [{ms.min():.1f}-{ms.max():.1f}]".ljust(59)
              + f"{BATCH * 1e3 / np.median(ms):14,.0f}")
    faster = np.minimum(seconds["replicated per-step"], seconds["replicated scan"])
    for k in [k for k in names if k.startswith("ours")]:
        ratio = faster / np.array(seconds[k])
        print(f"throughput {k} / faster reference, per round: median {np.median(ratio):.2f} "
              f"[{ratio.min():.2f}-{ratio.max():.2f}] (> 1: ours faster)")

    ref_bytes = per_device_bytes((ref.state[0]["tables"], ref.state[1][0].sum_of_squares["tables"]))
    logical = sum(v * d * 4 * 2 for v, d, _ in shapes.values())  # tables + one Adagrad slot, float32
    print(f"tables + Adagrad slots per device: ours {ours_bytes / 2**20:.1f} MiB, replicated "
          f"{ref_bytes / 2**20:.1f} MiB (all of them: {logical / 2**20:.1f} MiB); ratio {ours_bytes / ref_bytes:.3f}")
    print(f"total {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
