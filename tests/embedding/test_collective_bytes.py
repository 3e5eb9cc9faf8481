"""Per-device collective bytes of the embedding train step, read from the compiled HLO.

The per-replica step (lookup, gradients of a loss w.r.t. the activations, the
lazy Adagrad update) compiled at 2, 4 and 8 devices (sub-meshes of the 8 fake
CPU devices) with a fixed per-device batch. For each collective op (all-to-all,
all-gather, reduce-scatter, all-reduce, collective-permute) the larger of its
operands' and its result's bytes, summed: flat in the device count with ids
routed to their owners; growing with it when every device all-gathers the
global batch (the scheme kept as `routing="all_gather"`, checked here so that
the measure can fail). The step has no dense parameters, so no dense gradient
all-reduce to set aside.
"""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

from tpu_estimator.embedding import AdagradParameters, EmbeddingConfigSpec, FeatureConfig, TableConfig
from tpu_estimator.embedding import fused
from tpu_estimator.embedding.lookup import Collectives, routes, table_layouts
from tpu_estimator.embedding.replica import (
    lookup_in_replica,
    replica_collectives,
    replica_tables,
    state_specs,
    update_in_replica,
)
from tpu_estimator.embedding.sharded import ShardedTables
from tpu_estimator.parallel.mesh import Topology

PER_DEVICE, WIDTH = 32, 4
SPEC = EmbeddingConfigSpec(
    feature_to_config_dict={"a": FeatureConfig("t"), "b": FeatureConfig("t")},
    table_to_config_dict={"t": TableConfig(20_000, 16, sharding="row")},
    optimization_parameters=AdagradParameters(0.1),
    partition_strategy="mod",
)

COLLECTIVES = ("all-to-all", "all-gather", "reduce-scatter", "all-reduce", "collective-permute")
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "f32": 4, "s32": 4, "u32": 4, "f64": 8, "s64": 8}
_SHAPE = re.compile(r"\b(" + "|".join(_BYTES) + r")\[([\d,]*)\]")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (.*?) ([\w\-]+)\((.*)$")


def _shape_bytes(text: str) -> int:
    return sum(_BYTES[t] * int(np.prod([int(d) for d in dims.split(",") if d])) for t, dims in _SHAPE.findall(text))


def collective_ops(hlo: str) -> list[tuple[str, int]]:
    """(op, max(operand bytes, result bytes)) of each collective instruction of the module
    (every computation: loop bodies and conditional branches count once each)."""
    shapes, ops = {}, []
    for line in hlo.splitlines():
        m = _INSTRUCTION.match(line)
        if not m:
            continue
        name, result, op, rest = m.groups()
        shapes[name] = _shape_bytes(result)
        base = op.removesuffix("-start")
        if base in COLLECTIVES and not op.endswith("-done"):
            operands = re.findall(r"%([\w.\-]+)", rest.split("),")[0])
            ops.append((base, max(shapes[name], sum(shapes.get(o, 0) for o in operands))))
    return ops


def collective_bytes(hlo: str) -> dict[str, int]:
    """op -> summed max(operand bytes, result bytes) over the module's collectives."""
    out: dict[str, int] = {}
    for op, size in collective_ops(hlo):
        out[op] = out.get(op, 0) + size
    return out


def collective_counts(hlo: str) -> dict[str, int]:
    """op -> how many collective instructions of it the module holds."""
    out: dict[str, int] = {}
    for op, _ in collective_ops(hlo):
        out[op] = out.get(op, 0) + 1
    return out


def compiled_step_hlo(num_devices: int, routing: str, spec: EmbeddingConfigSpec = SPEC) -> str:
    mesh = Mesh(np.array(jax.devices()[:num_devices]), ("data",))
    tables = ShardedTables(spec, mesh, batch_axis="data", table_axes=("data",))
    coll = Collectives("data", ("data",), num_devices, num_devices, routing=routing)
    state = jax.eval_shape(lambda: tables.build(jax.random.PRNGKey(0)))

    def step(state, ids, step):
        acts = lookup_in_replica(spec, coll, state, ids, {})
        loss = lambda acts: sum(jnp.sum(jnp.tanh(a)) for a in acts.values())  # noqa: E731
        return update_in_replica(spec, coll, state, ids, {}, jax.grad(loss)(acts), step)

    specs = state_specs(state)
    program = jax.jit(
        jax.shard_map(step, mesh=mesh, in_specs=(specs, P("data"), P()), out_specs=specs, check_vma=False)
    )
    ids = {f: jax.ShapeDtypeStruct((num_devices * PER_DEVICE, WIDTH), jnp.int32) for f in spec.features}
    return program.lower(state, ids, jax.ShapeDtypeStruct((), jnp.int32)).compile().as_text()


@pytest.fixture(scope="module")
def compiled_hlo():
    runs = [("owners", 2), ("owners", 4), ("owners", 8), ("all_gather", 2), ("all_gather", 8)]
    return {run: compiled_step_hlo(run[1], run[0]) for run in runs}


@pytest.fixture(scope="module")
def per_device_bytes(compiled_hlo):
    return {run: collective_bytes(hlo) for run, hlo in compiled_hlo.items()}


def test_routed_bytes_per_device_are_flat_in_the_device_count(per_device_bytes):
    totals = {n: sum(per_device_bytes["owners", n].values()) for n in (2, 4, 8)}
    assert set(per_device_bytes["owners", 8]) == {"all-to-all", "all-reduce"}, per_device_bytes["owners", 8]
    assert per_device_bytes["owners", 8]["all-reduce"] == 4  # the agreed number of rounds (int32)
    assert max(totals.values()) <= 1.3 * min(totals.values()), totals


def test_all_gathered_bytes_grow_with_the_device_count(per_device_bytes):
    """The measure above can fail: the global batch all-gathered grows about linearly."""
    totals = {n: sum(per_device_bytes["all_gather", n].values()) for n in (2, 8)}
    assert "all-gather" in per_device_bytes["all_gather", 8] and "all-to-all" not in per_device_bytes["all_gather", 8]
    assert totals[8] > 3 * totals[2], totals


def test_auto_routing_picks_the_scheme_the_hlo_says_moves_fewer_bytes(per_device_bytes):
    """`routing="auto"` chooses per table from static estimates (lookup.bytes_per_device);
    where the compiled programs differ clearly (1.5x), the estimate picks the smaller one."""
    decided = 0
    for n in (2, 8):
        owners = sum(per_device_bytes["owners", n].values())
        gathered = sum(per_device_bytes["all_gather", n].values())
        ids = {f: jnp.zeros((PER_DEVICE, WIDTH), jnp.int32) for f in SPEC.features}
        chosen = routes(SPEC, Collectives("data", ("data",), n, n), "t", ids)
        if max(owners, gathered) > 1.5 * min(owners, gathered):
            assert chosen == (owners < gathered), (n, owners, gathered)
            decided += 1
    assert decided  # (at 2 devices the all-gather moves several times fewer bytes)
    many = Collectives("data", ("data",), 256, 256)  # a pod: routing's bytes are flat, the all-gather's x N
    assert routes(SPEC, many, "t", {f: jnp.zeros((PER_DEVICE, WIDTH), jnp.int32) for f in SPEC.features})
    assert not routes(SPEC, Collectives("data", ("data",), 256, 256, routing="all_gather"), "t", ids)


def test_tables_of_one_dimension_share_one_exchange(compiled_hlo, per_device_bytes):
    """4 row-sharded tables of dimension 16 (and one of dimension 8) routed on 8 devices:
    the compiled step holds the all-to-alls of ONE table's routing for the four
    (embedding/fused.py), plus one routing for the other dimension (each table alone: 5x);
    fusing adds no bytes: the buffers hold the group's ids (C from their sum)."""
    features = {f"f{i}": FeatureConfig(f"t{i % 5}") for i in range(10)}
    tables = {f"t{i}": TableConfig(20_000 - 1_000 * i, 16 if i < 4 else 8, sharding="row") for i in range(5)}
    spec = EmbeddingConfigSpec(
        feature_to_config_dict=features, table_to_config_dict=tables,
        optimization_parameters=AdagradParameters(0.1), partition_strategy="mod",
    )
    one = collective_counts(compiled_hlo["owners", 8])
    hlo = compiled_step_hlo(8, "owners", spec)
    assert one["all-to-all"] == 6, one  # forward: ids out, rows back; backward: one round, or rounds
    counts = collective_counts(hlo)  # (the groups' rounds all-reduces: combined by XLA into one)
    assert set(counts) == {"all-to-all", "all-reduce"} and counts["all-to-all"] == 2 * one["all-to-all"], counts
    # the dimension-16 group carries 8 features' ids (2 per table, as SPEC's one table): 4x
    # SPEC's buffers, as the four tables routed alone; the dimension-8 group's rows are half
    # as wide as SPEC's (ids as many): 0.53x
    single = per_device_bytes["owners", 8]["all-to-all"]
    grouped = collective_bytes(hlo)["all-to-all"]
    assert 4.4 * single < grouped < 4.7 * single, (grouped, single)


def test_groups_are_by_dimension_in_the_spec_order_and_fit_int32_ids():
    """A group's storage index is an int32: tables whose rows together pass 2**31 - 2 start
    another group of their dimension; `fuse_tables=False`: one group per table."""
    spec = EmbeddingConfigSpec(
        feature_to_config_dict={f"f{i}": FeatureConfig(f"t{i}") for i in range(5)},
        table_to_config_dict={
            "t0": TableConfig(900_000_000, 4), "t1": TableConfig(900_000_000, 4), "t2": TableConfig(900_000_000, 4),
            "t3": TableConfig(10, 8, sharding="row"), "t4": TableConfig(10, 4, sharding="row"),
        },
        optimization_parameters=AdagradParameters(0.1),
    )
    layouts, blocks = table_layouts(spec, 8), {t: jnp.zeros((1, 4), jnp.float32) for t in spec.tables}
    grouped = fused.groups(spec, layouts, blocks, list(spec.tables))
    assert [g.tables for g in grouped] == [("t0", "t1"), ("t2", "t4"), ("t3",)]
    assert all(g.storage_rows <= fused.MAX_ROWS for g in grouped)
    assert grouped[1].offsets == (0, 112_500_000) and grouped[1].rows_per_shard == 112_500_002
    assert [g.tables for g in fused.groups(spec, layouts, blocks, list(spec.tables), False)] == [
        (t,) for t in spec.tables
    ]


def compiled_replica_step_hlo(replicas: int, cores: int, routing: str = "owners") -> str:
    """The step as the estimator runs it with `num_cores_per_replica=cores`: manual over
    "data" (the replica's block split over "model" inside, embedding/replica.py), the tables
    over every device, PER_DEVICE examples per device (`cores` x PER_DEVICE per replica)."""
    mesh = Mesh(np.array(jax.devices()[: replicas * cores]).reshape(replicas, cores), ("data", "model"))
    topology = Topology(mesh, num_hosts=1, host_id=0)
    tables = replica_tables(SPEC, topology)
    coll = dataclasses.replace(replica_collectives(topology), routing=routing)
    state = jax.eval_shape(lambda: tables.build(jax.random.PRNGKey(0)))

    def step(state, ids, step):
        acts = lookup_in_replica(SPEC, coll, state, ids, {})
        loss = lambda acts: sum(jnp.sum(jnp.tanh(a)) for a in acts.values())  # noqa: E731
        return update_in_replica(SPEC, coll, state, ids, {}, jax.grad(loss)(acts), step)

    specs = state_specs(state)  # per replica: manual over "data"
    program = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(specs, P("data"), P()), out_specs=specs,
                                    axis_names={"data"}, check_vma=False))
    ids = {f: jax.ShapeDtypeStruct((replicas * cores * PER_DEVICE, WIDTH), jnp.int32) for f in SPEC.features}
    return program.lower(state, ids, jax.ShapeDtypeStruct((), jnp.int32)).compile().as_text()


@pytest.fixture(scope="module")
def replica_bytes(per_device_bytes):
    """(replicas, cores) -> op -> bytes per device; replicas of one core: the step above."""
    out = {(n, 1): per_device_bytes["owners", n] for n in (2, 4, 8)}
    return {**out, **{mesh: collective_bytes(compiled_replica_step_hlo(*mesh)) for mesh in [(2, 2), (4, 2)]}}


def test_tables_over_data_and_model_route_with_bytes_flat_in_the_replicas(replica_bytes):
    """num_cores_per_replica=2 (2x2 and 4x2 meshes), tables over all devices: the ids go to
    their owners over ("data", "model") jointly (all-to-alls), and one all-gather over
    "model" rebuilds a replica's activations; per device, flat in the replicas and within
    1.3x of replicas of one core (2x1, 4x1, 8x1) at the same examples per device."""
    totals = {mesh: sum(b.values()) for mesh, b in replica_bytes.items()}
    assert set(replica_bytes[4, 2]) == {"all-to-all", "all-gather", "all-reduce"}, replica_bytes[4, 2]
    assert replica_bytes[4, 2]["all-to-all"] == replica_bytes[8, 1]["all-to-all"], replica_bytes
    acts = 2 * 2 * PER_DEVICE * 16 * 4  # 2 features: the replica's [2 x PER_DEVICE, 16] float32 each
    assert replica_bytes[4, 2]["all-gather"] == acts, replica_bytes[4, 2]
    assert max(totals.values()) <= 1.3 * min(totals.values()), totals
