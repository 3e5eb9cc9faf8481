"""Ids routed to their owners stay exact when one round is not enough.

8 devices routing ids take several rounds when all ids crowd one owner or the
capacity is tight (the forward loops; the backward sums into a dense gradient
of the owner's shard and keeps the rows nobody looked up): the activations and
the tables and slots after two optimizer steps equal one device's. (Spread ids,
one round, are test_sharded.py's and test_replica_step.py's 8-device cases.)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

from tpu_estimator.embedding import AdagradParameters, AdamParameters, EmbeddingConfigSpec, FeatureConfig, TableConfig
from tpu_estimator.embedding import routing
from tpu_estimator.embedding.lookup import Collectives, apply_local, lookup_local, table_layouts
from tpu_estimator.embedding.sharded import ShardedTables

N, PER_DEVICE, V, DIM = 8, 8, 203, 4  # 'div': 26 rows per device
TOL = dict(rtol=2e-5, atol=2e-6)


def make_spec(optimizer):
    return EmbeddingConfigSpec(
        feature_to_config_dict={
            "bag": FeatureConfig("big", weight_key="bag_w"),
            "seq": FeatureConfig("big", max_sequence_length=3),
            "small": FeatureConfig("small"),
        },
        table_to_config_dict={
            "big": TableConfig(V, DIM, combiner="mean", sharding="row"),
            "small": TableConfig(5, DIM, combiner="sum", sharding="row"),
        },
        optimization_parameters=optimizer,
    )


def make_batch(seed, hi):
    """Ids below `hi` (hi=26: every id on device 0), -1 padding, duplicates."""
    rng = np.random.RandomState(seed)
    b = N * PER_DEVICE
    bag = rng.randint(0, hi, (b, 5))
    bag[rng.rand(b, 5) < 0.2] = -1
    ids = {"bag": bag, "seq": rng.randint(0, hi, (b, 3)), "small": rng.randint(0, 5, (b, 1))}
    ids = {k: v.astype(np.int32) for k, v in ids.items()}
    weights = {"bag": rng.uniform(0.5, 2.0, (b, 5)).astype(np.float32)}
    grads = {"bag": rng.randn(b, DIM), "seq": rng.randn(b, 3, DIM), "small": rng.randn(b, DIM)}
    return ids, weights, {k: v.astype(np.float32) for k, v in grads.items()}


def programs(spec, n, capacity_factor):
    """(tables, jitted lookup, jitted apply, jitted rounds of each table) on n devices."""
    mesh = Mesh(np.array(jax.devices()[:n]), ("data",))
    tables = ShardedTables(spec, mesh, batch_axis="data", table_axes=("data",))
    coll = (Collectives("data", ("data",), n, n, routing="owners", capacity_factor=capacity_factor)
            if n > 1 else Collectives())
    assert coll.routed == (n > 1)

    def rounds(ids):  # of each table, as the lookup plans them
        out = {}
        for t in spec.tables:
            flat = jnp.concatenate([ids[f].reshape(-1) for f in spec.features_of(t)])
            cap = routing.capacity(flat.shape[0], n, capacity_factor)
            out[t] = routing.plan(table_layouts(spec, n)[t], flat, "data", cap).rounds[None]
        return out

    def lookup(t, i, w):
        return lookup_local(spec, coll, t, i, w)

    def apply(tables, slots, i, w, g, step):
        return apply_local(spec, coll, tables, slots, i, w, g, step)

    if n == 1:
        return tables, jax.jit(lookup), jax.jit(apply), None
    rows, batch = P("data"), P("data")
    table_specs = {t: rows for t in spec.tables}
    slot_specs = {t: {k: rows for k in s} for t, s in tables.state_shardings().slots.items()}
    shard = lambda f, i, o: jax.jit(jax.shard_map(f, mesh=mesh, in_specs=i, out_specs=o, check_vma=False))  # noqa: E731
    return (
        tables,
        shard(lookup, (table_specs, batch, batch), batch),
        shard(apply, (table_specs, slot_specs, batch, batch, batch, P()), (table_specs, slot_specs)),
        shard(rounds, batch, {t: P("data") for t in spec.tables}),
    )


def run(spec, n, capacity_factor, batches):
    tables, lookup, apply, rounds = programs(spec, n, capacity_factor)
    state = tables.init(jax.random.PRNGKey(0))
    ids, weights, _ = batches[0]
    acts = lookup(state.tables, ids, weights)
    taken = None if rounds is None else {t: int(r.max()) for t, r in rounds(ids).items()}
    for step, (ids, weights, grads) in enumerate(batches):
        new_tables, new_slots = apply(state.tables, state.slots, ids, weights, grads, jnp.int32(step))
        state = state.replace(tables=new_tables, slots=new_slots)
    return {k: np.asarray(v) for k, v in acts.items()}, tables.logical(state), taken


CASES = {
    # (ids below, capacity_factor, optimizer, rounds of table "big")
    "all ids on device 0": (26, 2.0, AdagradParameters(0.3, initial_accumulator=0.2), 2),
    "tight capacity, non-lazy Adam": (V, 0.25, AdamParameters(0.05, lazy_adam=False), None),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_8_devices_routing_ids_equal_1_device(case):
    hi, factor, optimizer, expected_rounds = CASES[case]
    spec = make_spec(optimizer)
    batches = [make_batch(0, hi), make_batch(1, hi)]
    acts1, after1, _ = run(spec, 1, factor, batches)
    acts8, after8, rounds = run(spec, N, factor, batches)
    if expected_rounds is None:
        assert rounds["big"] > 2, rounds
    else:
        assert rounds["big"] == expected_rounds, rounds
    for f in spec.feature_tables:
        np.testing.assert_allclose(acts8[f], acts1[f], **TOL, err_msg=f)
    for k in after1:
        np.testing.assert_allclose(after8[k], after1[k], **TOL, err_msg=k)
    if isinstance(optimizer, AdagradParameters):  # lazy: rows nobody looked up keep their slot
        looked_up = {int(i) for ids, _, _ in batches for f in ("bag", "seq") for i in ids[f].ravel()}
        untouched = sorted(set(range(V)) - looked_up)
        np.testing.assert_array_equal(after8["big/accumulator"][untouched], np.float32(0.2))


def test_capacity_is_flat_in_the_device_count_and_never_beyond_the_ids():
    assert [routing.capacity(256, n, 2.0) * n for n in (2, 4, 8, 16)] == [512] * 4
    assert routing.capacity(256, 1, 2.0) == 256  # at most every id
    assert routing.capacity(3, 64, 0.1) == 1


def test_collectives_are_checked():
    with pytest.raises(ValueError, match=r"routing must be 'auto', 'owners' or 'all_gather'.*routing='ring'"):
        Collectives("data", ("data",), 8, 8, routing="ring")
    with pytest.raises(ValueError, match=r"capacity_factor must be positive.*capacity_factor=0"):
        Collectives("data", ("data",), 8, 8, capacity_factor=0)
    # tables over more axes than the batch: every device all-gathers the batch's ids
    assert not Collectives("data", ("data", "model"), 8, 4).routed
    assert not Collectives("data", ("data",), 8, 8, routing="all_gather").routed
