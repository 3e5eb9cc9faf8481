"""TPUConfig(parameter_sharding="fsdp"): parameters, optimizer slots and averaged weights
split ~1/8 over 8 devices; the same results as "replicated"; checkpoints move between the
settings and device counts (onto one device, where "fsdp" is a no-op); exports hold whole
weights; composes with num_cores_per_replica."""

from __future__ import annotations

import collections
import logging
import re
import shutil

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import tpu_estimator as te
from tpu_estimator.loops import train as train_loops
from tpu_estimator.parallel import partitioning
from tpu_estimator.parallel.mesh import Topology

rng = np.random.RandomState(0)
X = rng.randn(256, 16).astype(np.float32)
Y = rng.randint(0, 4, 256).astype(np.int32)
BIG = ["Dense_0/kernel", "Dense_1/kernel"]  # 16x256 and 256x64: >= 4096 elements
SMALL = ["Dense_0/bias", "Dense_1/bias", "Dense_2/bias", "Dense_2/kernel"]


def model_fn(features, labels, mode, params):
    h = nn.relu(nn.Dense(256)(features))
    h = nn.relu(nn.Dense(64)(h))
    logits = nn.Dense(4)(h)
    if mode == te.ModeKeys.PREDICT:
        return te.TPUEstimatorSpec(
            mode, predictions={"logits": logits}, export_outputs={"out": te.PredictOutput({"logits": logits})}
        )
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    return te.TPUEstimatorSpec(mode, loss=loss, train_op=params.get("tx", optax.adam(1e-2)))


def input_fn(params):
    b = params["batch_size"]
    for i in range(0, len(X), b):
        yield X[i : i + b], Y[i : i + b]


class Probe(te.SessionRunHook):
    """Each loop's loss and the training state after the last loop."""

    def __init__(self):
        self.losses, self.state = [], None

    def before_run(self, run_context):
        return te.SessionRunArgs({"loss": "loss", "state": "state"})

    def after_run(self, run_context, run_values):
        self.losses.append(float(run_values.results["loss"]))
        self.state = run_values.results["state"]

    def end(self, session):
        self.program = session.runtime(te.ModeKeys.TRAIN).program("scan")


def train(model_dir, sharding, *, steps=4, use_tpu=True, cores=None, params=None, strategy="scan", accumulation=1):
    cfg = te.RunConfig(
        model_dir=str(model_dir), log_step_count_steps=None,
        tpu_config=te.TPUConfig(
            iterations_per_loop=2, num_cores_per_replica=cores, moving_average_decay=0.9,
            parameter_sharding=sharding, loop_strategy=strategy, gradient_accumulation_steps=accumulation,
        ),
    )
    est = te.TPUEstimator(
        model_fn, config=cfg, use_tpu=use_tpu, params=params or {},
        train_batch_size=32, predict_batch_size=32,
    )
    probe = Probe()
    est.train(input_fn, steps=steps, hooks=[probe])
    return est, probe


def names(est):
    layers = ("Dense_0", "Dense_1", "Dense_2", "moving_average")
    return [n for n, _ in te.list_variables(est.model_dir) if n.split("/")[0] in layers]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("fsdp")
    return {s: (d / s, *train(d / s, s)) for s in ("replicated", "fsdp")}


def test_fsdp_equals_replicated(runs):
    _, rep, rep_probe = runs["replicated"]
    _, fsdp, fsdp_probe = runs["fsdp"]
    np.testing.assert_allclose(fsdp_probe.losses, rep_probe.losses, rtol=1e-5, atol=1e-6)
    assert len(names(fsdp)) == 2 * len(BIG + SMALL)  # the weights and their averages
    for n in names(fsdp):
        np.testing.assert_allclose(fsdp.get_variable_value(n), rep.get_variable_value(n), rtol=1e-4, atol=1e-6)


def leaves(state):
    """(name, array) of the parameters, Adam's mu and nu and the averaged weights."""
    adam = state.opt_state[0]
    trees = {"": state.params, "mu:": adam.mu, "nu:": adam.nu, "avg:": state.extras["moving_average"]}
    for prefix, tree in trees.items():
        for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
            yield prefix + partitioning.path_name(path), x


def test_each_device_holds_an_eighth_of_the_large_leaves(runs):
    state = runs["fsdp"][2].state
    found = 0
    for name, x in leaves(state):
        shard = x.addressable_shards[0].data
        if name.split(":")[-1] in BIG:
            found += 1
            assert "data" in jax.tree.leaves(tuple(x.sharding.spec)), name
            assert shard.nbytes * 8 == x.nbytes, name
        else:
            assert x.sharding.spec == P() and shard.nbytes == x.nbytes, name
    assert found == 4 * len(BIG)
    for name, x in leaves(runs["replicated"][2].state):
        assert x.addressable_shards[0].data.nbytes == x.nbytes, name


def loop_body_collectives(hlo):
    """(collectives in computations a while loop's body reaches, those elsewhere) of HLO text."""
    blocks, name = {}, None
    for line in hlo.splitlines():
        head = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$", line)
        if head:
            name = head.group(1)
            blocks[name] = ""
        elif name is not None:
            blocks[name] += line + "\n"
    todo, body = re.findall(r"body=%?([\w.\-]+)", hlo), set()
    while todo:
        n = todo.pop()
        if n in blocks and n not in body:
            body.add(n)
            todo += re.findall(r"(?:calls|to_apply|body|condition)=%?([\w.\-]+)", blocks[n])
    ops = r"\b(all-gather|reduce-scatter|all-reduce)(?:-start)?\("
    inside = collections.Counter(op for n in body for op in re.findall(ops, blocks[n]))
    outside = {op for n in blocks if n not in body for op in re.findall(ops, blocks[n])}
    return inside, outside


def compiled_collectives(probe):
    state = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), probe.state)
    on_data = NamedSharding(probe.state.step.sharding.mesh, P(None, "data"))
    blocks = (
        jax.ShapeDtypeStruct((2, 32, X.shape[1]), np.float32, sharding=on_data),
        jax.ShapeDtypeStruct((2, 32), np.int32, sharding=on_data),
    )
    return loop_body_collectives(probe.program.lower(state, blocks).compile().as_text())


def test_parameters_are_gathered_in_every_step_of_the_scan(runs):
    inside, outside = compiled_collectives(runs["fsdp"][2])
    # XLA:CPU (collectives.reduces_whole_gradients): per step, in the loop's body, one
    # all-gather per split parameter and the gradients' all-reduces combined into one
    assert inside == {"all-gather": len(BIG), "all-reduce": 1}, inside
    assert "all-gather" not in outside  # not once for the whole program
    inside, outside = compiled_collectives(runs["replicated"][2])
    assert set(inside) == {"all-reduce"} and "all-gather" not in outside


def test_the_reduce_scatter_form_of_other_backends(runs, tmp_path, monkeypatch):
    """Off XLA:CPU the parameters are gathered in the loss and each gradient is
    reduce-scattered (the gather's transpose): forced here, the same results."""
    monkeypatch.setattr(train_loops, "reduces_whole_gradients", lambda: False)
    _, probe = train(tmp_path, "fsdp")
    np.testing.assert_allclose(probe.losses, runs["replicated"][2].losses, rtol=1e-5, atol=1e-6)
    for (name, x), (_, y) in zip(leaves(probe.state), leaves(runs["fsdp"][2].state)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-6, err_msg=name)
    inside, _ = compiled_collectives(probe)
    assert inside == {"all-gather": len(BIG), "reduce-scatter": len(BIG), "all-reduce": 1}, inside


def test_composes_with_gradient_accumulation(tmp_path):
    """Micro-batches with sharded parameters (gathered inside each micro-batch's loss): the
    same losses and weights as "replicated" with the same accumulation."""
    (_, rep), (fsdp, probe) = (train(tmp_path / s, s, steps=2, accumulation=2) for s in ("replicated", "fsdp"))
    np.testing.assert_allclose(probe.losses, rep.losses, rtol=1e-5, atol=1e-6)
    for (name, x), (_, y) in zip(leaves(probe.state), leaves(rep.state)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-6, err_msg=name)
    assert fsdp.get_variable_value("global_step") == 2


def test_checkpoints_move_to_replicated_and_to_one_device(runs, tmp_path):
    source = runs["fsdp"][0]
    results = {}
    for target, kw in {"fsdp": {}, "replicated": {}, "one": {"use_tpu": False}}.items():  # one: a no-op
        d = tmp_path / target
        shutil.copytree(source, d)
        sharding = "replicated" if target == "replicated" else "fsdp"
        est, probe = train(d, sharding, steps=2, **kw)
        assert int(est.get_variable_value("global_step")) == 6
        results[target] = (est, probe)
    base = results["fsdp"][1]
    for target in ("replicated", "one"):
        est, probe = results[target]
        np.testing.assert_allclose(probe.losses, base.losses, rtol=1e-5, atol=1e-6)
        for name, x in leaves(probe.state):  # placed whole, as the target asks
            assert x.sharding.spec == P() and x.addressable_shards[0].data.nbytes == x.nbytes, (target, name)
        for n in BIG:
            np.testing.assert_allclose(
                est.get_variable_value(n), results["fsdp"][0].get_variable_value(n), rtol=1e-4, atol=1e-6
            )


def test_export_holds_whole_weights(runs, tmp_path):
    _, est, _ = runs["fsdp"]
    predicted = np.stack([p["logits"] for p in est.predict(lambda params: iter([X[:32], X[32:64]]))])

    def receiver():
        spec = te.TensorSpec((None, X.shape[1]), np.float32)
        return te.ServingInputReceiver(spec, {"x": spec})

    export = est.export_saved_model(str(tmp_path / "export"), receiver)
    served = te.load_exported(export).signatures["serving_default"](x=X[:64])
    np.testing.assert_allclose(np.asarray(served["logits"]), predicted, rtol=1e-5, atol=1e-6)
    for n in BIG:  # the averages, whole
        assert te.load_variable(export, n).shape == est.get_variable_value("moving_average/" + n).shape


def test_composes_with_num_cores_per_replica_in_the_step_program(runs, tmp_path):
    est, probe = train(tmp_path, "fsdp", cores=2, strategy="step")
    assert est.num_replicas == 4
    np.testing.assert_allclose(probe.losses, runs["replicated"][2].losses, rtol=1e-5, atol=1e-6)
    for name, x in leaves(probe.state):
        if name.split(":")[-1] in BIG:  # over "data" and "model" together: 1/8
            axes = jax.tree.leaves(tuple(x.sharding.spec))
            assert {"data", "model"} <= set(axes), (name, x.sharding.spec)
            assert x.addressable_shards[0].data.nbytes * 8 == x.nbytes, name


def test_specs_for_odd_shapes_and_the_bytes_left_whole(caplog):
    topo = Topology.create(use_tpu=True)
    assert partitioning.over_data(P(), (4096, 3), topo) == P("data", None)
    assert partitioning.over_data(P(), (3, 10, 1500), topo) is None  # 45,000 elements, no dim % 8
    assert partitioning.over_data(P(), (8, 8), topo) == P()  # small: whole on every device
    two = Topology.create(use_tpu=True, cores_per_replica=2)
    assert partitioning.over_data(P(), (64, 128), two) == P(None, ("data", "model"))
    assert partitioning.over_data(P(None, "model"), (64, 128), two) == P("data", "model")
    assert partitioning.over_data(P("model", None), (8, 1024), two) == P("model", "data")
    assert partitioning.over_data(P("model"), (8192,), two) == P(("data", "model"))
    params = {"odd": jnp.zeros((3, 10, 1500)), "big": jnp.zeros((64, 128)), "b": jnp.zeros((5,))}
    with caplog.at_level(logging.INFO, logger="tpu_estimator"):
        specs = partitioning.param_specs(params, topo, fsdp=True)
    assert specs == {"odd": P(), "big": P(None, "data"), "b": P()}
    assert "2 parameters (180020 bytes) stay whole on every replica" in caplog.text
    assert "['odd']" in caplog.text


def test_parameter_sharding_is_checked():
    with pytest.raises(ValueError, match=r"`parameter_sharding` must be 'replicated' or 'fsdp'.*zero3"):
        te.TPUConfig(parameter_sharding="zero3")


def test_a_reducing_optimizer_is_refused(tmp_path):
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-2))
    with pytest.raises(ValueError, match=r"parameter_sharding='fsdp'.*elementwise.*reduce_sum"):
        train(tmp_path, "fsdp", steps=2, params={"tx": tx})


def embedded_model_fn(features, labels, mode, params):
    history = features["history"].reshape(features["history"].shape[0], -1)
    x = jnp.concatenate([features["user"], features["clicked"], history, features["dense"]], axis=1)
    h = nn.relu(nn.Dense(128)(x))  # 51x128: split over "data"
    y = nn.Dense(1)(h)
    loss = jnp.mean((y - labels) ** 2)
    return te.TPUEstimatorSpec(mode, loss=loss, train_op=optax.adam(1e-2))


def test_composes_with_embedding_tables(tmp_path):
    from tests.embedding.test_estimator import BATCHES, B, make_spec

    out = {}
    for sharding in ("replicated", "fsdp"):
        est = te.TPUEstimator(
            embedded_model_fn, model_dir=str(tmp_path / sharding), train_batch_size=B,
            embedding_config_spec=make_spec(),
            config=te.RunConfig(tpu_config=te.TPUConfig(iterations_per_loop=2, parameter_sharding=sharding)),
        )
        probe = Probe()
        est.train(lambda params: iter(BATCHES[:4]), steps=4, hooks=[probe])
        out[sharding] = (est, probe)
    (rep, rep_probe), (fsdp, fsdp_probe) = out["replicated"], out["fsdp"]
    np.testing.assert_allclose(fsdp_probe.losses, rep_probe.losses, rtol=1e-5, atol=1e-6)
    for n in ("Dense_0/kernel", "embedding/users", "embedding/items"):
        np.testing.assert_allclose(fsdp.get_variable_value(n), rep.get_variable_value(n), rtol=1e-4, atol=1e-6)
    kernel = fsdp_probe.state.params["Dense_0"]["kernel"]
    assert kernel.sharding.spec == P(None, "data") and kernel.addressable_shards[0].data.shape == (51, 16)
    table = fsdp_probe.state.extras["embedding"].tables["users"]  # still rows over the devices
    assert table.addressable_shards[0].data.shape[0] * 8 == table.shape[0]
