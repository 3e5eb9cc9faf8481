"""The seam's optional program hooks (model/components.py) with a toy third component.

`Lookup` is a small table looked up by the ids of feature "k": the same hooks the
embedding tables use (`placeholders`, `split`, `activations`, `update`), written in
a few lines, and run by the train/eval programs of loops/ with no other edit. A
second toy component vetoes the update through `gradients`: the table keeps its rows.
"""

from __future__ import annotations

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec as P

import tpu_estimator as te
from tpu_estimator.loops.evaluate import eval_program
from tpu_estimator.loops.train import init_program, step_program
from tpu_estimator.model import components
from tpu_estimator.model.call import check_model_fn
from tpu_estimator.model.module import bind_model
from tpu_estimator.model.spec_view import view_spec
from tpu_estimator.parallel.mesh import Topology

ROWS, DIM, B, LR = 5, 2, 4, 0.5
SEEN: list[tuple[str, tuple[int, ...]]] = []


@dataclasses.dataclass(frozen=True)
class Lookup:
    """Rows of a [ROWS, DIM] table for the ids in features["k"], as features["emb"]; the
    table takes a plain SGD step on the rows looked up (duplicates summed)."""

    name: str = "lookup"
    setting: str = "a test"

    def init(self, state):
        return jnp.arange(ROWS * DIM, dtype=jnp.float32).reshape(ROWS, DIM) / 10

    def specs(self, extra, state_specs):
        return P()

    def after_step(self, extra, state):
        return extra

    def inference_variables(self, extra, variables):
        return variables

    def placeholders(self, features):
        rest = dict(features)
        k = rest.pop("k")
        return {**rest, "emb": jnp.zeros((k.shape[0], DIM), jnp.float32)}

    def split(self, extra, features):
        rest = dict(features)
        return rest, rest.pop("k")

    def activations(self, extra, k):
        return {"emb": extra[k]}

    def update(self, extra, k, act_grads, step):
        return extra.at[k].add(-LR * act_grads["emb"])


@dataclasses.dataclass(frozen=True)
class Veto:
    """Vetoes every update (as the float16 loss scale does when gradients overflow)."""

    name: str = "veto"
    setting: str = "a test"

    def init(self, state):
        return {"vetoed": jnp.zeros((), jnp.int32)}

    def specs(self, extra, state_specs):
        return {"vetoed": P()}

    def after_step(self, extra, state):
        return extra

    def inference_variables(self, extra, variables):
        return variables

    def gradients(self, extra, grads):
        return grads, jnp.bool_(False), {"vetoed": extra["vetoed"] + 1}


def model_fn(features, labels, mode, params):
    SEEN.append((mode, tuple(features["emb"].shape)))
    pred = nn.Dense(1, use_bias=False, kernel_init=nn.initializers.ones)(features["emb"])[:, 0]
    loss = jnp.mean((pred - labels) ** 2)
    return te.TPUEstimatorSpec(mode, loss=loss, train_op=optax.sgd(0.0))


def programs(comps, mode=te.ModeKeys.TRAIN):
    model = dataclasses.replace(
        bind_model(model_fn, check_model_fn(model_fn), mode, {}, None, B), components=tuple(comps)
    )
    view = functools.partial(view_spec, mode=mode, use_tpu=False, eval_on_tpu=False)
    return model, view, Topology.create(use_tpu=False)


BATCH = ({"k": np.array([1, 3, 1, 0], np.int32)}, np.array([1.0, 0.0, 2.0, -1.0], np.float32))


def trained(comps):
    model, view, topo = programs(comps)
    state = init_program(model, view, topo, seed=0, with_optimizer=True)(*BATCH)
    table = np.asarray(state.extras["lookup"])
    new, out = step_program(model, view, topo)(state, BATCH)
    return table, jax.device_get(new), out


def test_a_component_looks_up_features_and_updates_its_table_from_their_gradients():
    SEEN.clear()
    table, new, out = trained([Lookup()])
    assert (te.ModeKeys.TRAIN, (B, DIM)) in SEEN  # model_fn saw activations, not ids (placeholders too)
    k, y = BATCH[0]["k"], BATCH[1]
    emb = table[k]
    pred = emb.sum(1)
    np.testing.assert_allclose(out["loss"], np.mean((pred - y) ** 2), rtol=1e-6)
    grad = (2 / B * (pred - y))[:, None] * np.ones((1, DIM))  # d loss / d emb (kernel of ones)
    want = table.copy()
    np.add.at(want, k, -LR * grad)
    np.testing.assert_allclose(new.extras["lookup"], want, rtol=1e-6)
    assert not np.allclose(new.extras["lookup"], table)


def test_a_veto_keeps_what_update_hooks_return():
    table, new, _ = trained([Lookup(), Veto()])
    np.testing.assert_array_equal(new.extras["lookup"], table)
    assert int(new.extras["veto"]["vetoed"]) == 1  # the vetoing component's own state moves on


def test_evaluation_takes_the_state_through_program_variables():
    model, view, topo = programs([Lookup()], te.ModeKeys.EVAL)
    state = init_program(model, view, topo, seed=0, with_optimizer=False)(*BATCH)
    variables = components.program_variables(model.components, state.extras, state.variables)
    assert "lookup" in variables
    out = eval_program(model, view, topo, per_example=False)(variables, state.step, state.rng, BATCH)
    table = np.asarray(state.extras["lookup"])
    pred = table[BATCH[0]["k"]].sum(1)
    np.testing.assert_allclose(np.asarray(out["loss"]).mean(), np.mean((pred - BATCH[1]) ** 2), rtol=1e-6)
