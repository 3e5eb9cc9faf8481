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

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

from tpu_estimator.embedding import AdagradParameters, EmbeddingConfigSpec, FeatureConfig, TableConfig
from tpu_estimator.embedding.lookup import Collectives, routes
from tpu_estimator.embedding.replica import lookup_in_replica, state_specs, update_in_replica
from tpu_estimator.embedding.sharded import ShardedTables

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


def collective_bytes(hlo: str) -> dict[str, int]:
    """op -> summed max(operand bytes, result bytes) over the module's collectives (every
    computation: loop bodies and conditional branches count once each)."""
    shapes, ops = {}, []
    for line in hlo.splitlines():
        m = _INSTRUCTION.match(line)
        if not m:
            continue
        name, result, op, rest = m.groups()
        shapes[name] = _shape_bytes(result)
        base = op.removesuffix("-start")
        if base in COLLECTIVES and not op.endswith("-done"):
            ops.append((base, shapes[name], re.findall(r"%([\w.\-]+)", rest.split("),")[0])))
    out: dict[str, int] = {}
    for op, result, operands in ops:
        out[op] = out.get(op, 0) + max(result, sum(shapes.get(o, 0) for o in operands))
    return out


def compiled_step_hlo(num_devices: int, routing: str) -> str:
    mesh = Mesh(np.array(jax.devices()[:num_devices]), ("data",))
    tables = ShardedTables(SPEC, mesh, batch_axis="data", table_axes=("data",))
    coll = Collectives("data", ("data",), num_devices, num_devices, routing=routing)
    state = jax.eval_shape(lambda: tables.build(jax.random.PRNGKey(0)))

    def step(state, ids, step):
        acts = lookup_in_replica(SPEC, coll, state, ids, {})
        loss = lambda acts: sum(jnp.sum(jnp.tanh(a)) for a in acts.values())  # noqa: E731
        return update_in_replica(SPEC, coll, state, ids, {}, jax.grad(loss)(acts), step)

    specs = state_specs(state)
    program = jax.jit(
        jax.shard_map(step, mesh=mesh, in_specs=(specs, P("data"), P()), out_specs=specs, check_vma=False)
    )
    ids = {f: jax.ShapeDtypeStruct((num_devices * PER_DEVICE, WIDTH), jnp.int32) for f in SPEC.features}
    return program.lower(state, ids, jax.ShapeDtypeStruct((), jnp.int32)).compile().as_text()


@pytest.fixture(scope="module")
def per_device_bytes():
    runs = [("owners", 2), ("owners", 4), ("owners", 8), ("all_gather", 2), ("all_gather", 8)]
    return {run: collective_bytes(compiled_step_hlo(run[1], run[0])) for run in runs}


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
