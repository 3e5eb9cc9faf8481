"""Sharded tables on 8 devices equal 1 device and a dense plain-JAX reference.

Lookups (sum/mean/sqrtn, weights, sequence features, duplicate ids, padding),
and one or two lazy steps of each optimizer: 8 devices ('div' and 'mod', and a
4x2 mesh) give the tables and slots of 1 device; those equal a dense reference
on the touched rows, and untouched rows do not change. Each device holds 1/8.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

import tpu_estimator as te

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

B = 16  # global batch
V_BIG, V_SMALL, DIM = 37, 5, 4  # 37 rows: padded to 40 over 8 devices
TOL = dict(rtol=2e-5, atol=2e-6)


def mesh(n, shape=None, names=("data",)):
    devices = np.array(jax.devices()[:n]).reshape(shape or (n,))
    return Mesh(devices, names)


MESHES = {
    "1": lambda: mesh(1),
    "8": lambda: mesh(8),
    "4x2": lambda: mesh(8, (4, 2), ("data", "model")),
}


def make_spec(combiner="mean", optimizer=None, strategy="div", big=None, small=None, **kw):
    return EmbeddingConfigSpec(
        feature_to_config_dict={
            "bag": FeatureConfig("big", weight_key="bag_w"),
            "dup": FeatureConfig("big"),  # shares table "big" with "bag": its gradients add up
            "seq": FeatureConfig("big", max_sequence_length=3),
            "small": FeatureConfig("small"),
        },
        table_to_config_dict={
            "big": TableConfig(V_BIG, DIM, combiner=combiner, **{"sharding": "row", **(big or {})}),
            "small": TableConfig(V_SMALL, DIM, combiner="sum", **{"sharding": "row", **(small or {})}),
        },
        optimization_parameters=optimizer or StochasticGradientDescentParameters(0.5),
        partition_strategy=strategy,
        **kw,
    )


def make_batch(seed=0, lo=0, hi=V_BIG):
    """Ids with -1 padding, a row of all padding, and many duplicates (within and across examples)."""
    rng = np.random.RandomState(seed)
    bag = rng.randint(lo, hi, (B, 5))
    bag[rng.rand(B, 5) < 0.3] = -1
    bag[3] = -1  # an example with no ids
    bag[4] = [7, 7, 7, -1, 2]
    ids = {
        "bag": bag,
        "dup": rng.randint(lo, lo + 4, (B, 2)),
        "seq": np.where(rng.rand(B, 3) < 0.25, -1, rng.randint(lo, hi, (B, 3))),
        "small": rng.randint(0, V_SMALL, (B, 1)),
    }
    ids = {k: v.astype(np.int32) for k, v in ids.items()}
    weights = {"bag": rng.uniform(0.5, 2.0, (B, 5)).astype(np.float32)}
    grads = {
        "bag": rng.randn(B, DIM), "dup": rng.randn(B, DIM), "seq": rng.randn(B, 3, DIM), "small": rng.randn(B, DIM),
    }
    return ids, weights, {k: v.astype(np.float32) for k, v in grads.items()}


# --- the dense reference: plain JAX on whole logical tables ---


def ref_lookup(spec, tables, ids, weights):
    out = {}
    for f, t in spec.feature_tables.items():
        i = jnp.asarray(ids[f])
        w = jnp.where(i >= 0, jnp.asarray(weights.get(f, np.ones(i.shape, np.float32))), 0.0)
        rows = tables[t][jnp.maximum(i, 0)]
        if spec.features[f].max_sequence_length:
            out[f] = rows * w[..., None]
            continue
        combiner = spec.tables[t].combiner
        if combiner == "mean":
            w = w / jnp.maximum(w.sum(1, keepdims=True), 1e-30)
        elif combiner == "sqrtn":
            w = w / jnp.maximum(jnp.sqrt((w * w).sum(1, keepdims=True)), 1e-30)
        out[f] = jnp.einsum("bw,bwd->bd", w, rows)
    return out


def ref_step(spec, tables, slots, ids, weights, grads, step=0):
    """Dense gradient via jax.grad (duplicates summed), the optimizer on every row, kept on touched rows."""
    opt = spec.optimization_parameters
    dense = jax.grad(lambda T: sum((ref_lookup(spec, T, ids, weights)[f] * grads[f]).sum() for f in grads))(tables)
    new_t, new_s = {}, {}
    for t, w in tables.items():
        g = dense[t]
        touched = np.zeros(w.shape[0], bool)
        for f in spec.features_of(t):
            touched[ids[f][ids[f] >= 0]] = True
        s = slots.get(t, {})
        if isinstance(opt, StochasticGradientDescentParameters):
            w2, s2 = w - opt.learning_rate * g, {}
        elif isinstance(opt, AdagradParameters):
            acc = s["accumulator"] + g**2
            w2, s2 = w - opt.learning_rate * g / jnp.sqrt(acc), {"accumulator": acc}
        elif isinstance(opt, AdamParameters):
            m = opt.beta1 * s["m"] + (1 - opt.beta1) * g
            v = opt.beta2 * s["v"] + (1 - opt.beta2) * g**2
            w2, s2 = w - opt.learning_rate * m / jnp.sqrt(v + opt.epsilon**2), {"m": m, "v": v}
        else:
            lr, p = opt.learning_rate, opt.learning_rate_power
            acc = s["accumulator"] + g**2
            lin = s["linear"] + g - (acc ** (-p) - s["accumulator"] ** (-p)) / lr * w
            quad = acc ** (-p) / lr + 2 * opt.l2_regularization_strength
            l1 = opt.l1_regularization_strength
            w2 = jnp.where(jnp.abs(lin) > l1, (jnp.sign(lin) * l1 - lin) / quad, 0.0)
            s2 = {"accumulator": acc, "linear": lin}
        keep = lambda new, old: jnp.where(touched[:, None], new, old)  # noqa: E731
        lazy = not (isinstance(opt, AdamParameters) and not opt.lazy_adam)
        new_t[t] = keep(w2, w) if lazy else w2
        new_s[t] = {k: keep(v, s[k]) if lazy else v for k, v in s2.items()}
    return new_t, new_s


def run(spec, mesh_name, batches, steps=1):
    st = ShardedTables(spec, MESHES[mesh_name]())
    state = st.init(jax.random.PRNGKey(0))
    before = st.logical(state)
    lookup = jax.jit(st.lookup)
    apply = jax.jit(st.apply_gradients)
    ids, weights, _ = batches[0]
    acts = {k: np.asarray(v) for k, v in lookup(state.tables, ids, weights).items()} if not steps else None
    for i in range(steps):
        ids, weights, grads = batches[i]
        state = apply(state, ids, weights, grads, i)
    return before, acts, st.logical(state), state


OPTIMIZERS = {
    "sgd": lambda: StochasticGradientDescentParameters(0.5),
    "adagrad": lambda: AdagradParameters(0.3, initial_accumulator=0.2),
    "adam": lambda: AdamParameters(0.05),
    "adam_dense": lambda: AdamParameters(0.05, lazy_adam=False, sum_inside_sqrt=True),
    "ftrl": lambda: FtrlParameters(0.2, l1_regularization_strength=0.01, l2_regularization_strength=0.1),
}


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("strategy", ["div", "mod"])
def test_lookup_8_devices_equal_1_and_reference(combiner, strategy):
    spec = make_spec(combiner, strategy=strategy)
    batch = [make_batch()]
    before1, acts1, _, _ = run(spec, "1", batch, steps=0)
    before8, acts8, _, _ = run(spec, "8", batch, steps=0)
    for k in before1:
        # same initial tables on any device count (to float rounding: JAX 0.12 differs in the last bit)
        np.testing.assert_allclose(before1[k], before8[k], rtol=1e-6, atol=1e-7)
    ref = ref_lookup(spec, {t: jnp.asarray(before1[t]) for t in spec.tables}, batch[0][0], batch[0][1])
    assert acts8["seq"].shape == (B, 3, DIM) and acts8["bag"].shape == (B, DIM)
    for f in spec.feature_tables:
        np.testing.assert_allclose(acts8[f], acts1[f], **TOL)
        np.testing.assert_allclose(acts8[f], ref[f], **TOL)
    np.testing.assert_array_equal(acts8["bag"][3], 0.0)  # an example with only padding


@pytest.mark.parametrize(
    "name, mesh_name", [(name, "8") for name in sorted(OPTIMIZERS)] + [("adagrad", "4x2"), ("ftrl", "4x2")]
)
def test_optimizer_step_equals_1_device_and_dense_reference(name, mesh_name):
    strategy = "mod" if mesh_name == "4x2" else "div"
    spec = make_spec("sqrtn", OPTIMIZERS[name](), strategy=strategy)
    # the second step looks up rows 20.. only: lazy optimizers leave the first step's other rows alone
    batches = [make_batch(0), make_batch(1, lo=20)]
    before, _, after1, _ = run(spec, "1", batches, steps=2)
    _, _, after8, _ = run(spec, mesh_name, batches, steps=2)
    for k in after1:
        np.testing.assert_allclose(after8[k], after1[k], **TOL, err_msg=k)
    tables = {t: jnp.asarray(before[t]) for t in spec.tables}
    slots = {t: {k.split("/")[1]: jnp.asarray(v) for k, v in before.items() if k.startswith(t + "/")} for t in spec.tables}
    for i, (ids, weights, grads) in enumerate(batches):
        tables, slots = ref_step(spec, tables, slots, ids, weights, grads, i)
    for t in spec.tables:
        np.testing.assert_allclose(after8[t], tables[t], **TOL, err_msg=t)
        for k, v in slots[t].items():
            np.testing.assert_allclose(after8[f"{t}/{k}"], v, **TOL, err_msg=f"{t}/{k}")
    touched = set()
    for ids, _, _ in batches:
        for f in spec.features_of("big"):
            touched |= set(ids[f][ids[f] >= 0].tolist())
    untouched = sorted(set(range(V_BIG)) - touched)
    assert untouched, "the batches must leave some rows untouched"
    if name != "adam_dense":
        np.testing.assert_array_equal(after8["big"][untouched], before["big"][untouched])
    else:  # non-lazy Adam moves every row with a nonzero moment, and leaves zero-moment rows
        np.testing.assert_array_equal(after8["big/m"][untouched], 0.0)
    assert not np.allclose(after8["big"][sorted(touched)], before["big"][sorted(touched)])


def test_clipping_weight_decay_and_multiplier():
    opt = StochasticGradientDescentParameters(
        1.0, clip_weight_min=-0.05, clip_weight_max=0.2, weight_decay_factor=0.1,
        multiply_weight_decay_factor_by_learning_rate=True, clip_gradient_max=0.5,
    )
    spec = make_spec("sum", opt, clipping_limit=0.8, experimental_gradient_multiplier_fn=lambda step: 2.0 + step)
    batches = [make_batch(0), make_batch(1)]
    before, _, after1, _ = run(spec, "1", batches, steps=2)
    _, _, after8, _ = run(spec, "8", batches, steps=2)
    tables = {t: jnp.asarray(before[t]) for t in spec.tables}
    for step, (ids, weights, grads) in enumerate(batches):
        dense = jax.grad(lambda T: sum((ref_lookup(spec, T, ids, weights)[f] * grads[f]).sum() for f in grads))(tables)
        for t in spec.tables:
            touched = np.zeros(tables[t].shape[0], bool)
            for f in spec.features_of(t):
                touched[ids[f][ids[f] >= 0]] = True
            g = jnp.clip(jnp.clip(dense[t] * (2.0 + step), -0.8, 0.8), None, 0.5)
            w = tables[t] - 0.1 * tables[t]
            new = jnp.clip(w - g, -0.05, 0.2)
            tables[t] = jnp.where(touched[:, None], new, tables[t])
    for t in spec.tables:
        np.testing.assert_allclose(after1[t], tables[t], **TOL)
        np.testing.assert_allclose(after8[t], tables[t], **TOL)


@pytest.mark.parametrize("strategy", ["div", "mod"])
def test_each_device_holds_an_eighth_of_each_table_and_slot(strategy):
    spec = make_spec(optimizer=AdamParameters(0.1), strategy=strategy)
    st = ShardedTables(spec, MESHES["8"]())
    state = st.init(jax.random.PRNGKey(0))
    arrays = {**state.tables, **{f"{t}/{k}": v for t, s in state.slots.items() for k, v in s.items()}}
    assert set(arrays) == {"big", "small", "big/m", "big/v", "small/m", "small/v"}
    for name, array in arrays.items():
        vocab = V_BIG if name.startswith("big") else V_SMALL
        shards = array.addressable_shards
        assert len(shards) == 8 and len({s.device for s in shards}) == 8
        assert all(s.data.shape == (-(-vocab // 8), DIM) for s in shards), name
        assert sum(s.data.size for s in shards) == array.size  # no device holds a copy of another's rows
    layout = st.layouts["big"]
    logical = st.logical(state)["big"]
    # with 'mod', row r lives on device r % 8; with 'div' on device r // 5
    for r in (0, 9, 36):
        device = r % 8 if strategy == "mod" else r // 5
        local = r // 8 if strategy == "mod" else r % 5
        np.testing.assert_array_equal(np.asarray(state.tables["big"].addressable_shards[device].data)[local], logical[r])
        assert layout.place(np.int64(r)) == (device, local)


def test_no_recompile_and_stays_sharded_over_steps():
    spec = make_spec(optimizer=AdagradParameters(0.1))
    st = ShardedTables(spec, MESHES["8"]())
    state = st.init(jax.random.PRNGKey(0))
    apply = jax.jit(st.apply_gradients, donate_argnums=0)
    ids, weights, grads = make_batch(0)
    state = apply(state, ids, weights, grads, 0)
    with te.count_compiles() as compiles:
        for i in range(1, 3):
            ids, weights, grads = make_batch(i)
            state = apply(state, ids, weights, grads, i)
    assert compiles.count == 0
    assert state.slots["big"]["accumulator"].sharding.is_equivalent_to(st.row_sharding(), 2)


def test_state_moves_between_device_counts():
    """What a checkpoint restore onto another device count does: logical tables and slots out of
    8 devices ('mod': rows permuted), placed on a 2x2 mesh and on 1 device, train on equally."""
    spec = make_spec(optimizer=FtrlParameters(0.3), strategy="mod")
    st8 = ShardedTables(spec, MESHES["8"]())
    state8 = jax.jit(st8.apply_gradients)(st8.init(jax.random.PRNGKey(0)), *make_batch(0), 0)
    saved = st8.logical(state8)
    assert saved["big"].shape == (V_BIG, DIM) and set(saved) == {
        "big", "small", "big/accumulator", "big/linear", "small/accumulator", "small/linear"
    }
    ids, weights, grads = make_batch(1)
    after = {}
    for name, m in (("8", MESHES["8"]()), ("4", mesh(4, (2, 2), ("data", "model"))), ("1", MESHES["1"]())):
        st = ShardedTables(spec, m)
        state = st.place(saved)
        if name == "4":
            assert {s.data.shape for s in state.tables["big"].addressable_shards} == {(10, DIM)}
        for k, v in st.logical(state).items():
            np.testing.assert_array_equal(v, saved[k])
        after[name] = st.logical(jax.jit(st.apply_gradients)(state, ids, weights, grads, 1))
    for name in ("4", "1"):
        for k in after["8"]:
            np.testing.assert_allclose(after[name][k], after["8"][k], **TOL, err_msg=f"{name}: {k}")
    with pytest.raises(KeyError, match=r"incomplete.*missing=\['big/linear'"):
        st8.place({k: v for k, v in saved.items() if k != "big/linear"})


def test_per_table_learning_rates_replace_the_optimizers():
    """TableConfig(learning_rate=...) / (learning_rate_fn=...) as the original's: each table
    steps as if the optimizer had that learning rate; other tables keep the optimizer's."""
    own = make_spec(
        "sum", AdagradParameters(0.3, initial_accumulator=0.2),
        big=dict(learning_rate_fn=lambda step: 0.05 * (step + 1)), small=dict(learning_rate=0.7),
    )
    batches = [make_batch(0), make_batch(1)]
    _, _, after, _ = run(own, "8", batches, steps=2)
    as_fn = make_spec("sum", AdagradParameters(lambda step: 0.05 * (step + 1), initial_accumulator=0.2))
    as_number = make_spec("sum", AdagradParameters(0.7, initial_accumulator=0.2))
    _, _, by_fn, _ = run(as_fn, "1", batches, steps=2)
    _, _, by_number, _ = run(as_number, "1", batches, steps=2)
    for k in after:
        expected = by_number if k.startswith("small") else by_fn
        np.testing.assert_allclose(after[k], expected[k], **TOL, err_msg=k)


def test_table_config_learning_rate_is_checked_and_table_id_names_the_table():
    with pytest.raises(ValueError, match="at most one of `learning_rate` and `learning_rate_fn`"):
        TableConfig(8, 2, learning_rate=0.1, learning_rate_fn=lambda step: 0.1)
    with pytest.raises(ValueError, match="learning_rate=-1"):
        TableConfig(8, 2, learning_rate=-1)
    with pytest.raises(TypeError, match="learning_rate_fn"):
        TableConfig(8, 2, learning_rate_fn=0.1)
    assert FeatureConfig(table_id="big").table == "big"
    with pytest.raises(ValueError, match="not both"):
        FeatureConfig("big", table_id="small")
    with pytest.raises(TypeError, match="must name a table"):
        FeatureConfig()
