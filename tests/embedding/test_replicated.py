"""Replicated tables' dense update (embedding/updates.py `zero_gradient_keeps_rows`).

Where the optimizer leaves a row and its slots exactly as they are on a zero gradient
(SGD, Adagrad), a replicated table is updated densely with no mask of the rows looked
up: equal, bit for bit, to the lazy update; where it does not (FTRL, lazy Adam, weight
decay, weight clipping, a gradient clip interval without 0) the mask is kept, and
dropping it would move rows nobody looked up. Compiled on 8 devices, the fast path
all-reduces the dense gradient alone (no [V] count of the rows touched) and steps as 1
device does.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tpu_estimator.embedding import (
    AdagradParameters,
    AdamParameters,
    EmbeddingConfigSpec,
    FeatureConfig,
    FtrlParameters,
    StochasticGradientDescentParameters,
    TableConfig,
)
from tpu_estimator.embedding.sharded import ShardedTables
from tpu_estimator.embedding.updates import TableRule, slot_initial_values, zero_gradient_keeps_rows

B, V, DIM = 16, 40, 8


def make_spec(optimizer, **options):
    return EmbeddingConfigSpec(
        feature_to_config_dict={
            "bag": FeatureConfig("t", weight_key="bag_w"),
            "seq": FeatureConfig("t", max_sequence_length=3),
        },
        table_to_config_dict={"t": TableConfig(V, DIM, combiner="mean", sharding="replicated")},
        optimization_parameters=optimizer,
        **options,
    )


# (optimizer, EmbeddingConfigSpec options, whether a zero gradient keeps rows)
RULES = {
    "SGD": (StochasticGradientDescentParameters(0.5), {}, True),
    "Adagrad": (AdagradParameters(0.5), {}, True),
    "Adagrad, gradient clipping around 0": (
        AdagradParameters(0.5, clip_gradient_min=-0.3, clip_gradient_max=0.2), {"clipping_limit": 0.25}, True,
    ),
    "FTRL": (FtrlParameters(0.5, l1_regularization_strength=0.01), {}, False),
    "lazy Adam": (AdamParameters(0.05), {}, False),
    "Adagrad, weight decay": (AdagradParameters(0.5, weight_decay_factor=0.1), {}, False),
    "SGD, weight clipping": (StochasticGradientDescentParameters(0.5, clip_weight_max=0.05), {}, False),
    "SGD, gradient clip above 0": (StochasticGradientDescentParameters(0.5, clip_gradient_min=0.01), {}, False),
    "Adagrad, gradient multiplier": (
        AdagradParameters(0.5), {"experimental_gradient_multiplier_fn": lambda s: 2.0}, False,
    ),
}


@pytest.mark.parametrize("name", list(RULES))
def test_dense_update_equals_the_lazy_one_exactly_where_a_zero_gradient_keeps_rows(name):
    optimizer, options, keeps = RULES[name]
    spec = make_spec(optimizer, **options)
    assert zero_gradient_keeps_rows(spec) is keeps
    rng = np.random.RandomState(0)
    table = jnp.asarray(rng.randn(V, DIM).astype(np.float32))
    slots = {k: jnp.asarray(v + rng.uniform(0, 1, (V, DIM)).astype(np.float32))
             for k, v in slot_initial_values(optimizer).items()}
    touched = np.zeros(V, bool)
    touched[rng.choice(V, 12, replace=False)] = True
    grads = np.where(touched[:, None], rng.randn(V, DIM), 0.0).astype(np.float32)
    grads[np.flatnonzero(touched)[0]] = 0.0  # a row looked up whose gradient is 0 all the same
    rule = TableRule(spec, "t", jnp.int32(3))
    lazy = rule.dense(table, slots, jnp.asarray(grads), jnp.asarray(touched))
    dense = rule.dense(table, slots, jnp.asarray(grads), None)
    untouched = ~touched
    np.testing.assert_array_equal(lazy[0][untouched], table[untouched])  # the lazy rule itself
    if keeps:
        for got, want in zip(jax.tree.leaves(dense), jax.tree.leaves(lazy)):
            np.testing.assert_array_equal(got, want)
    else:  # the mask is what keeps the rows nobody looked up
        moved = [not np.array_equal(d[untouched], w[untouched])
                 for d, w in zip(jax.tree.leaves(dense), jax.tree.leaves(lazy))]
        assert any(moved) or name == "Adagrad, gradient multiplier"  # a multiplier: kept lazy, not needed


def make_batch(seed):
    rng = np.random.RandomState(seed)
    bag = rng.randint(0, V // 2, (B, 4))  # the upper half of the rows never looked up
    bag[rng.rand(B, 4) < 0.3] = -1
    ids = {"bag": bag.astype(np.int32), "seq": rng.randint(-1, V // 2, (B, 3)).astype(np.int32)}
    weights = {"bag": rng.uniform(0.5, 2.0, (B, 4)).astype(np.float32)}
    grads = {"bag": rng.randn(B, DIM).astype(np.float32), "seq": rng.randn(B, 3, DIM).astype(np.float32)}
    return ids, weights, grads


def all_reduced_shapes(hlo: str) -> list[str]:
    """The result shapes of the compiled module's all-reduces."""
    return re.findall(r"= (\(?[^=]*?\)?) all-reduce(?:-start)?\(", hlo)


@pytest.mark.parametrize("name", ["Adagrad", "FTRL"])
def test_replicated_step_all_reduces_no_mask_where_it_needs_none_and_steps_as_1_device(name):
    optimizer, options, keeps = RULES[name]
    spec = make_spec(optimizer, **options)
    ids, weights, grads = make_batch(0)
    results = {}
    for n in (1, 8):
        tables = ShardedTables(spec, jax.sharding.Mesh(np.array(jax.devices()[:n]), ("data",)), table_axes=("data",))
        state = tables.init(jax.random.PRNGKey(3))
        apply = jax.jit(tables.apply_gradients)
        if n == 8:
            shapes = all_reduced_shapes(apply.lower(state, ids, weights, grads, 0).compile().as_text())
            assert any(f"f32[{V},{DIM}]" in s for s in shapes), shapes  # the dense gradient
            counted = any(re.search(rf"f32\[{V}\]", s) for s in shapes)  # the rows touched
            assert counted is not keeps, shapes
        before = tables.logical(jax.device_get(state))
        results[n] = tables.logical(jax.device_get(apply(state, ids, weights, grads, 0)))
    for key, want in results[1].items():
        np.testing.assert_allclose(results[8][key], want, rtol=2e-5, atol=2e-6, err_msg=key)
        if keeps:  # rows nobody looked up: exactly as before
            np.testing.assert_array_equal(results[8][key][V // 2 :], before[key][V // 2 :], err_msg=key)
