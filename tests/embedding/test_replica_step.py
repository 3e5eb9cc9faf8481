"""The embedding ops inside a per-replica training step, run as the estimator runs train_step.

A DLRM-like toy (two tables, a dense layer trained with optax) stepped with
`over_replicas` (shard_map manual over "data" on 8 devices; no shard_map on
one): lookups feed the loss, the dense gradients are averaged over replicas,
the activation gradients update the tables. 8 replicas equal 1 device.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from tpu_estimator.embedding import (
    AdagradParameters,
    AdamParameters,
    EmbeddingConfigSpec,
    FeatureConfig,
    FtrlParameters,
    StochasticGradientDescentParameters,
    TableConfig,
)
from tpu_estimator.embedding.inputs import prepare_features
from tpu_estimator.embedding.lookup import Collectives
from tpu_estimator.embedding.replica import (
    lookup_in_replica,
    placeholder_activations,
    replica_collectives,
    replica_tables,
    split_in_step,
    state_specs,
    update_in_replica,
)
from tpu_estimator.loops.replica import REPLICATED, over_replicas
from tpu_estimator.parallel.collectives import replica_mean
from tpu_estimator.parallel.mesh import DATA, Topology

B, DIM = 32, 8


def make_spec(optimizer, users="row", items="row"):
    return EmbeddingConfigSpec(
        feature_to_config_dict={
            "user": FeatureConfig("users"),
            "history": FeatureConfig("items", max_sequence_length=4),
            "clicked": FeatureConfig("items", weight_key="clicked_w"),
        },
        table_to_config_dict={
            "users": TableConfig(50, DIM, combiner="sum", sharding=users),
            "items": TableConfig(203, DIM, sharding=items),
        },
        optimization_parameters=optimizer,
    )


def batches(n, B=B):
    rng = np.random.RandomState(0)
    for _ in range(n):
        history = rng.randint(0, 203, (B, 4))
        history[rng.rand(B, 4) < 0.3] = -1
        clicked = rng.randint(0, 40, (B, 6))  # a hot range: many duplicates across replicas
        clicked[rng.rand(B, 6) < 0.4] = -1
        yield {
            "user": rng.randint(0, 50, (B,)),
            "history": history,
            "clicked": clicked,
            "clicked_w": rng.uniform(0.1, 1.0, (B, 6)),
            "dense": rng.randn(B, 3).astype(np.float32),
        }, rng.randn(B).astype(np.float32)


def train(spec, topology, steps=3, routing="auto", batch=B):
    tables = replica_tables(spec, topology)
    coll = dataclasses.replace(replica_collectives(topology), routing=routing)
    emb = tables.init(jax.random.PRNGKey(1))
    params = {"w": jnp.full((2 * DIM + 4 * DIM + 3, 1), 0.1)}
    tx = optax.sgd(0.1)
    opt_state = tx.init(params)

    stored = tables.stored_spec  # table-wise tables: their stacks, as row tables (embedding/tablewise.py)

    def step(params, opt_state, emb, step, features, labels):  # one replica, as train_step
        features, ids, weights = split_in_step(spec, features)
        assert set(features) == {"dense"}
        dense = features["dense"]
        zeros = placeholder_activations(spec, ids)
        ids = tables.stored_ids(ids)
        acts = lookup_in_replica(stored, coll, emb, ids, weights)
        assert {f: a.shape for f, a in acts.items()} == {f: z.shape for f, z in zeros.items()}

        def loss_fn(params, acts):
            x = jnp.concatenate(
                [acts["user"], acts["clicked"], acts["history"].reshape(acts["history"].shape[0], -1), dense], axis=1
            )
            return jnp.mean(((x @ params["w"])[:, 0] - labels) ** 2)

        loss, (grads, act_grads) = jax.value_and_grad(loss_fn, argnums=(0, 1))(params, acts)
        updates, opt_state = tx.update(replica_mean(grads), opt_state)
        emb = update_in_replica(stored, coll, emb, ids, weights, act_grads, step)
        return optax.apply_updates(params, updates), opt_state, emb, replica_mean(loss)

    specs = state_specs(emb, tables.stored_plans)
    program = jax.jit(
        over_replicas(
            step,
            topology,
            in_specs=(REPLICATED, REPLICATED, specs, REPLICATED, P(DATA), P(DATA)),
            out_specs=(REPLICATED, REPLICATED, specs, REPLICATED),
        )
    )
    losses = []
    for i, (features, labels) in enumerate(batches(steps, batch)):
        features = prepare_features(spec, features)  # on the host: checked, int32 [batch, width]
        params, opt_state, emb, loss = program(params, opt_state, emb, jnp.int32(i), features, labels)
        losses.append(float(loss))
    return losses, params, tables.logical(emb), emb


@pytest.mark.parametrize(
    "optimizer",
    [
        StochasticGradientDescentParameters(0.5),
        AdagradParameters(0.5),
        AdamParameters(0.05),
        FtrlParameters(0.5, l2_regularization_strength=0.01),
    ],
    ids=lambda o: type(o).__name__,
)
def test_8_replicas_train_like_1_device(optimizer):
    spec = make_spec(optimizer)
    losses1, params1, tables1, _ = train(spec, Topology.create(use_tpu=False))
    losses8, params8, tables8, emb8 = train(spec, Topology.create(use_tpu=True))
    np.testing.assert_allclose(losses8, losses1, rtol=1e-5)
    assert losses1[-1] != losses1[0]
    np.testing.assert_allclose(params8["w"], params1["w"], rtol=1e-5, atol=1e-6)
    for name in tables1:
        np.testing.assert_allclose(tables8[name], tables1[name], rtol=1e-5, atol=1e-6, err_msg=name)
    items = emb8.tables["items"]
    assert {s.data.shape for s in items.addressable_shards} == {(26, DIM)}  # ceil(203 / 8) rows per device


@pytest.mark.parametrize(
    "users, items, routing, batch, cores, split",
    [("replicated", "row", "owners", 10, 4, True), ("table", "column", "all_gather", B, 2, False)],
    ids=lambda p: str(p),
)
def test_replicas_of_several_cores_train_like_1_device(users, items, routing, batch, cores, split):
    """num_cores_per_replica > 1: the tables over all 8 devices ("data" x "model", or the
    split "model" axes of 2 replicas x 2 x 2 cores), each core looking up its 1/cores of its
    replica's examples: a row table's ids routed to their owners over every axis (5 examples
    per replica of 4 cores: padded to 8) or all-gathered (a table-wise table's stack), a
    replicated and a column table beside it; equal to 1 device (Adagrad)."""
    spec = make_spec(AdagradParameters(0.5), users=users, items=items)
    topology = Topology.create(use_tpu=True, cores_per_replica=cores, split_model=split)
    assert replica_collectives(topology).routed and len(topology.mesh.axis_names) == 2 + split
    losses1, params1, tables1, _ = train(spec, Topology.create(use_tpu=False), batch=batch)
    losses8, params8, tables8, emb8 = train(spec, topology, routing=routing, batch=batch)
    np.testing.assert_allclose(losses8, losses1, rtol=1e-5)
    np.testing.assert_allclose(params8["w"], params1["w"], rtol=1e-5, atol=1e-6)
    for name in tables1:
        np.testing.assert_allclose(tables8[name], tables1[name], rtol=1e-5, atol=1e-6, err_msg=name)
    shapes = {"row": (26, DIM), "column": (203, 1), "replicated": (50, DIM)}  # row: ceil(203 / 8)
    for name, plan in (("users", users), ("items", items)):
        if plan == "table":  # stacked: 50 rows on one device of 8, each holding a block of the stack
            assert name not in emb8.tables and len(emb8.tables) == 2, list(emb8.tables)
            continue
        for array in (emb8.tables[name], *emb8.slots[name].values()):
            assert {s.data.shape for s in array.addressable_shards} == {shapes[plan]}, (name, plan)
    for array in emb8.tables.values():
        assert len({s.device for s in array.addressable_shards}) == 8


def test_tables_over_a_replicas_cores_need_its_batch_split_over_them_too():
    """Each core looks up its own slice of the replica's examples: collectives that split the
    batch over "data" alone while the tables span "model" too are refused."""
    coll = Collectives(DATA, (DATA, "model"), 8, 4)
    with pytest.raises(ValueError, match=r"batch split over the same axes.*table_axes=\('data', 'model'\).*"
                                         r"replica_collectives\(topology\)"):
        lookup_in_replica(make_spec(AdagradParameters(0.5)), coll, None, {}, {})
