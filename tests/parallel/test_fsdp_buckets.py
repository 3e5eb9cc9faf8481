"""`gather_shards` gathers the leaves split over "data" in buckets (one all-gather per bucket
and dtype): the same values as one tiled all-gather per leaf, and its gradient (one
reduce-scatter per bucket) the same as the per-leaf gradient."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, PartitionSpec as P

from tpu_estimator.parallel import collectives
from tpu_estimator.parallel.mesh import DATA

SHAPES = {  # name: (global shape, dtype, spec); split on different axes, two dtypes, one whole
    "a": ((16, 3), jnp.float32, P(DATA, None)),
    "b": ((5, 24), jnp.float32, P(None, DATA)),
    "c": ((2, 3, 8), jnp.bfloat16, P(None, None, DATA)),
    "d": ((8, 4), jnp.bfloat16, P(DATA, None)),
    "e": ((7,), jnp.float32, P()),
    "f": ((4, 8, 2), jnp.float32, P(None, DATA, None)),
}
SPECS = {k: s for k, (_, _, s) in SHAPES.items()}


def per_leaf(tree):
    def one(spec, x):
        a = collectives.data_axis(spec)
        return x if a is None else lax.all_gather(x, DATA, axis=a, tiled=True)

    return jax.tree.map(one, SPECS, tree, is_leaf=lambda s: isinstance(s, P))


def program(gather):
    mesh = Mesh(np.array(jax.devices()[:8]), (DATA,))

    def loss(tree):  # a different weight per element, so a wrong column would show
        whole = gather(tree)
        return sum(jnp.sum(jnp.sin(x.astype(jnp.float32) * (i + 1))) for i, x in enumerate(jax.tree.leaves(whole)))

    def step(tree):
        whole = gather(tree)
        grads = collectives.shard_mean(jax.grad(loss)(tree), SPECS)
        return whole, grads

    return jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(SPECS,), out_specs=(P(), SPECS), check_vma=False))


def test_buckets_equal_per_leaf_gathers_and_their_gradients():
    rng = np.random.RandomState(0)
    tree = {k: jnp.asarray(rng.randn(*shape), dtype) for k, (shape, dtype, _) in SHAPES.items()}
    bucketed = program(lambda t: collectives.gather_shards(t, SPECS))
    whole, grads = bucketed(tree)
    want_whole, want_grads = program(per_leaf)(tree)
    for k in SHAPES:
        assert whole[k].dtype == tree[k].dtype and grads[k].dtype == tree[k].dtype, k
        np.testing.assert_array_equal(np.asarray(whole[k]), np.asarray(tree[k]), err_msg=k)
        np.testing.assert_array_equal(np.asarray(grads[k]), np.asarray(want_grads[k]), err_msg=k)
        np.testing.assert_array_equal(np.asarray(whole[k]), np.asarray(want_whole[k]), err_msg=k)
    # one bucket per dtype: 2 all-gathers (forward and the gradient's recomputed gather
    # share them) and 2 reduce-scatters, not one per leaf; the whole leaf "e" is all-reduced
    hlo = bucketed.lower(tree).compile().as_text()
    ops = re.findall(r"\b(all-gather|reduce-scatter|all-reduce)(?:-start)?\(", hlo)
    assert ops.count("reduce-scatter") == 2, ops
    assert ops.count("all-gather") <= 4, ops


def test_buckets_are_capped_and_kept_per_dtype(monkeypatch):
    leaves = [jnp.zeros((4, 4), jnp.float32), jnp.zeros((4, 4), jnp.bfloat16), jnp.zeros((4, 4), jnp.float32),
              jnp.zeros((2,), jnp.float32), jnp.zeros((4, 4), jnp.float32)]
    axes = [0, 0, 1, None, 0]
    assert sorted(collectives.buckets(leaves, axes, 8)) == [[0, 2, 4], [1]]
    monkeypatch.setattr(collectives, "BUCKET_BYTES", 8 * 64 * 2)  # two float32 4x4 shards
    assert sorted(collectives.buckets(leaves, axes, 8)) == [[0, 2], [1], [4]]
