"""EstimatorSpec / TPUEstimatorSpec: every validation rule, per mode, also under jit."""

import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tpu_estimator import (
    ClassificationOutput,
    EstimatorSpec,
    ModeKeys,
    PredictOutput,
    RegressionOutput,
    Scaffold,
    SessionRunHook,
    TPUEstimatorSpec,
    metrics,
)

SPECS = [EstimatorSpec, TPUEstimatorSpec]
LOSS = jnp.asarray(0.5)
OPT = optax.sgd(0.1)
LABELS = jnp.arange(8) % 3
LOGITS = jnp.ones((8, 3))


def train(cls, **kw):
    return cls(ModeKeys.TRAIN, **{"loss": LOSS, "train_op": OPT, **kw})


def metric_fn(labels, logits):
    return {"accuracy": metrics.accuracy(labels, logits.argmax(-1))}


# --- mode and required fields ---


@pytest.mark.parametrize("cls", SPECS)
def test_required_fields_per_mode(cls):
    with pytest.raises(ValueError, match=r"In mode 'train', \w+ requires `loss`.*optax"):
        cls(ModeKeys.TRAIN, train_op=OPT)
    with pytest.raises(ValueError, match=r"In mode 'train', \w+ requires `train_op`"):
        cls(ModeKeys.TRAIN, loss=LOSS)
    with pytest.raises(ValueError, match=r"In mode 'eval', \w+ requires `loss`"):
        cls(ModeKeys.EVAL, predictions=LOGITS)
    with pytest.raises(ValueError, match=r"In mode 'infer', \w+ requires `predictions`"):
        cls(ModeKeys.PREDICT, loss=LOSS)
    assert train(cls).mode == "train"
    assert cls(ModeKeys.EVAL, loss=LOSS).train_op is None
    assert cls(ModeKeys.PREDICT, predictions=LOGITS).loss is None


@pytest.mark.parametrize("cls", SPECS)
@pytest.mark.parametrize("mode", ["training", "TRAIN", None, 1, "predict"])
def test_bad_mode(cls, mode):
    with pytest.raises(ValueError, match="`mode` must be one of ModeKeys.TRAIN"):
        cls(mode, loss=LOSS, train_op=OPT, predictions=LOGITS)


@pytest.mark.parametrize("cls", SPECS)
def test_fields_of_other_modes_are_kept_and_validated(cls):
    spec = cls(ModeKeys.PREDICT, predictions=LOGITS, loss=LOSS, train_op=OPT)
    assert spec.train_op is OPT
    with pytest.raises(TypeError, match="train_op"):
        cls(ModeKeys.PREDICT, predictions=LOGITS, train_op="sgd")


# --- loss ---


@pytest.mark.parametrize("cls", SPECS)
@pytest.mark.parametrize("loss", [1.0, 1, [1.0], "1.0", True])
def test_loss_must_be_an_array(cls, loss):
    with pytest.raises(TypeError, match=r"`loss` must be an array of shape \[\] or \[1\].*jnp"):
        train(cls, loss=loss)


def test_python_float_loss_named_in_error():
    with pytest.raises(TypeError, match="Received: loss=1.0 of type float"):
        EstimatorSpec(ModeKeys.TRAIN, loss=1.0, train_op=optax.sgd(0.1))


@pytest.mark.parametrize("cls", SPECS)
@pytest.mark.parametrize("shape", [(2,), (1, 1), (8, 3), (0,)])
def test_loss_must_be_scalar(cls, shape):
    pattern = rf"shape \[\] or \[1\].*{re.escape(f'shape={shape}')}.*mean\(\)"
    with pytest.raises(ValueError, match=pattern):
        train(cls, loss=jnp.zeros(shape))


@pytest.mark.parametrize("cls", SPECS)
def test_loss_must_be_floating(cls):
    with pytest.raises(TypeError, match="floating point.*int32.*astype"):
        train(cls, loss=jnp.asarray(1, jnp.int32))


@pytest.mark.parametrize("cls", SPECS)
@pytest.mark.parametrize(
    "loss",
    [jnp.ones([1]), np.ones([1], np.float32), np.float32(1.0), np.asarray(2.0), jnp.bfloat16(1)],
)
def test_loss_accepted_and_reshaped(cls, loss):
    spec = train(cls, loss=loss)
    assert spec.loss.shape == ()
    assert float(spec.loss) == float(np.asarray(loss, np.float32).reshape(()))


# --- train_op ---


@pytest.mark.parametrize("cls", SPECS)
def test_train_op_kinds(cls):
    plain = optax.GradientTransformation(lambda p: (), lambda u, s, p=None: (u, s))
    assert train(cls, train_op=plain).train_op is plain
    extra = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3))
    assert isinstance(extra, optax.GradientTransformationExtraArgs)
    assert train(cls, train_op=extra).train_op is extra
    with pytest.raises(TypeError, match=r"optax.GradientTransformation.*Received: train_op=.*adam"):
        train(cls, train_op=optax.adam)  # the factory, not the transformation
    with pytest.raises(TypeError, match="gradient_transformation"):
        train(cls, train_op=optax.MultiSteps(optax.sgd(0.1), 2))


# --- predictions ---


@pytest.mark.parametrize("cls", SPECS)
def test_predictions_forms(cls):
    assert cls(ModeKeys.PREDICT, predictions=LOGITS).predictions is LOGITS
    d = {"logits": LOGITS, "classes": LOGITS.argmax(-1)}
    spec = cls(ModeKeys.PREDICT, predictions=d)
    d["extra"] = LOGITS
    assert sorted(spec.predictions) == ["classes", "logits"]  # copied


@pytest.mark.parametrize("cls", SPECS)
@pytest.mark.parametrize(
    "predictions, error, pattern",
    [
        ({}, ValueError, "must not be empty"),
        ({1: LOGITS}, TypeError, "keys of `predictions` must be strings"),
        ({"a": [1.0]}, TypeError, r"predictions\['a'\]` must be an array"),
        ({"a": {"b": LOGITS}}, TypeError, "dicts are not nested"),
        ([LOGITS], TypeError, "`predictions` must be an array or a dict"),
        ({"a": jnp.asarray(1.0)}, ValueError, r"batch-major \(rank >= 1\)"),
        (
            {"a": LOGITS, "b": jnp.ones(4)},
            ValueError,
            r"same batch size.*shape\[0\]=8.*shape\[0\]=4",
        ),
    ],
)
def test_predictions_invalid_in_predict(cls, predictions, error, pattern):
    with pytest.raises(error, match=pattern):
        cls(ModeKeys.PREDICT, predictions=predictions)


@pytest.mark.parametrize("cls", SPECS)
def test_predictions_outside_predict_need_not_be_batch_major(cls):
    spec = cls(ModeKeys.EVAL, loss=LOSS, predictions={"mean": jnp.asarray(1.0)})
    assert spec.predictions["mean"].shape == ()


# --- export_outputs ---


@pytest.mark.parametrize("cls", SPECS)
def test_export_outputs_default_in_predict(cls):
    for given in (None, {}):
        spec = cls(ModeKeys.PREDICT, predictions={"p": LOGITS}, export_outputs=given)
        ((key, out),) = spec.export_outputs.items()
        assert key == "serving_default" and isinstance(out, PredictOutput)
        assert out.outputs["p"] is LOGITS
    assert train(cls).export_outputs is None
    assert train(cls, export_outputs={}).export_outputs is None


@pytest.mark.parametrize("cls", SPECS)
def test_export_outputs_single_head_copied_to_default(cls):
    head = RegressionOutput(LOGITS[:, 0])
    spec = cls(ModeKeys.PREDICT, predictions=LOGITS, export_outputs={"regress": head})
    assert spec.export_outputs == {"regress": head, "serving_default": head}
    spec = cls(ModeKeys.PREDICT, predictions=LOGITS, export_outputs={"serving_default": head})
    assert spec.export_outputs == {"serving_default": head}


@pytest.mark.parametrize("cls", SPECS)
def test_export_outputs_several_heads(cls):
    a, b = PredictOutput(LOGITS), ClassificationOutput(scores=LOGITS)
    spec = cls(ModeKeys.PREDICT, predictions=LOGITS, export_outputs={"serving_default": a, "b": b})
    assert set(spec.export_outputs) == {"serving_default", "b"}
    with pytest.raises(ValueError, match="one must be named 'serving_default'.*\\['a', 'b'\\]"):
        cls(ModeKeys.PREDICT, predictions=LOGITS, export_outputs={"a": a, "b": b})


@pytest.mark.parametrize("cls", SPECS)
def test_export_outputs_types(cls):
    with pytest.raises(TypeError, match="`export_outputs` must be a dict"):
        cls(ModeKeys.PREDICT, predictions=LOGITS, export_outputs=[PredictOutput(LOGITS)])
    with pytest.raises(TypeError, match=r"must be ExportOutput instances.*export_outputs\['a'\]"):
        cls(ModeKeys.PREDICT, predictions=LOGITS, export_outputs={"a": LOGITS})
    with pytest.raises(TypeError, match="keys of `export_outputs` must be strings"):
        cls(ModeKeys.PREDICT, predictions=LOGITS, export_outputs={0: PredictOutput(LOGITS)})


# --- hooks and scaffold ---


HOOK_FIELDS = {
    EstimatorSpec: [
        "training_chief_hooks",
        "training_hooks",
        "evaluation_hooks",
        "prediction_hooks",
    ],
    TPUEstimatorSpec: ["training_hooks", "evaluation_hooks", "prediction_hooks"],
}


@pytest.mark.parametrize("cls", SPECS)
def test_hooks(cls):
    h1, h2 = SessionRunHook(), SessionRunHook()
    for field in HOOK_FIELDS[cls]:
        assert getattr(train(cls), field) == ()
        assert getattr(train(cls, **{field: [h1, h2]}), field) == (h1, h2)
        assert getattr(train(cls, **{field: (h for h in [h1])}), field) == (h1,)
        with pytest.raises(TypeError, match=rf"`{field}` must be a list.*{field}=\[hook\]"):
            train(cls, **{field: h1})
        with pytest.raises(TypeError, match=rf"SessionRunHook instances.*{field}\[1\]="):
            train(cls, **{field: [h1, "hook"]})
        with pytest.raises(TypeError, match=field):
            train(cls, **{field: "hooks"})


def test_scaffold():
    assert train(EstimatorSpec).scaffold == Scaffold()
    s = Scaffold(init_fn=lambda v: v)
    assert train(EstimatorSpec, scaffold=s).scaffold is s
    with pytest.raises(TypeError, match="`scaffold` must be a tpu_estimator.Scaffold"):
        train(EstimatorSpec, scaffold=lambda: s)


def test_scaffold_class():
    with pytest.raises(TypeError, match="`init_fn` must be a callable"):
        Scaffold(init_fn=3)
    with pytest.raises(TypeError, match="exactly one argument.*def init_fn\\(variables\\)"):
        Scaffold(init_fn=lambda: None)
    with pytest.raises(TypeError, match="exactly one argument"):
        Scaffold(init_fn=lambda a, b: None)
    Scaffold(init_fn=lambda variables, extra=None: variables)
    with pytest.raises(dataclasses.FrozenInstanceError):
        Scaffold().init_fn = None


def test_scaffold_fn():
    spec = train(TPUEstimatorSpec, scaffold_fn=lambda: Scaffold())
    assert isinstance(spec.as_estimator_spec().scaffold, Scaffold)
    for bad in (Scaffold(), lambda x: Scaffold(), 3):
        with pytest.raises(TypeError, match="`scaffold_fn` must be a callable taking no arguments"):
            train(TPUEstimatorSpec, scaffold_fn=bad)
    spec = train(TPUEstimatorSpec, scaffold_fn=lambda: None)
    with pytest.raises(TypeError, match="`scaffold_fn` must return a tpu_estimator.Scaffold"):
        spec.as_estimator_spec()


# --- eval_metric_ops ---


def test_eval_metric_ops():
    ops = {"accuracy": metrics.accuracy(LABELS, LOGITS.argmax(-1)), "m": metrics.mean(LOGITS)}
    spec = EstimatorSpec(ModeKeys.EVAL, loss=LOSS, eval_metric_ops=ops)
    assert spec.eval_metric_ops == ops and spec.eval_metric_ops is not ops


@pytest.mark.parametrize(
    "ops, error, pattern",
    [
        ([metrics.mean(LOGITS)], TypeError, "`eval_metric_ops` must be a dict"),
        (
            {"m": jnp.mean(LOGITS)},
            TypeError,
            r"Metric instances.*eval_metric_ops\['m'\].*metrics.mean",
        ),
        ({"m": (LOSS, LOSS)}, TypeError, "Metric instances"),
        ({1: metrics.mean(LOGITS)}, TypeError, "keys of `eval_metric_ops`"),
        ({"loss": metrics.mean(LOGITS)}, ValueError, "reserved"),
        ({"global_step": metrics.mean(LOGITS)}, ValueError, "reserved"),
    ],
)
def test_eval_metric_ops_invalid(ops, error, pattern):
    with pytest.raises(error, match=pattern):
        EstimatorSpec(ModeKeys.EVAL, loss=LOSS, eval_metric_ops=ops)


def test_eval_metric_ops_accepts_any_metric_subclass():
    from tpu_estimator.metrics import Metric

    class Constant(Metric):
        def compute(self):
            return 1.0

    spec = EstimatorSpec(ModeKeys.EVAL, loss=LOSS, eval_metric_ops={"c": Constant()})
    assert spec.eval_metric_ops["c"].compute() == 1.0


# --- eval_metrics and host_call ---


def evaluate(**kw):
    return TPUEstimatorSpec(ModeKeys.EVAL, loss=LOSS, **kw)


def train_with_host_call(host_call):
    return train(TPUEstimatorSpec, host_call=host_call)


BUILDERS = {"eval_metrics": lambda v: evaluate(eval_metrics=v), "host_call": train_with_host_call}


@pytest.mark.parametrize("name", ["eval_metrics", "host_call"])
@pytest.mark.parametrize(
    "value, error, pattern",
    [
        (metric_fn, TypeError, "must be a 2-tuple \\(fn, tensors\\)"),
        ((metric_fn,), TypeError, "must be a 2-tuple"),
        ((metric_fn, [LABELS, LOGITS], 1), TypeError, "must be a 2-tuple"),
        (("metric_fn", [LABELS, LOGITS]), TypeError, r"\[0\]` must be callable"),
        ((metric_fn, LOGITS), TypeError, r"\[1\]` must be a list, tuple or dict of arrays"),
        ((metric_fn, [LABELS, [1, 2]]), TypeError, r"\[1\]\[1\]` must be an array"),
        ((metric_fn, {1: LABELS}), TypeError, "must be strings"),
        ((metric_fn, [LABELS]), ValueError, "takes 2 positional arguments.*1 tensors"),
        ((metric_fn, [LABELS, LOGITS, LOGITS]), ValueError, "takes 2 positional.*3 tensors"),
        ((metric_fn, {"labels": LABELS}), ValueError, r"missing \['logits'\]"),
        (
            (metric_fn, {"labels": LABELS, "logits": LOGITS, "x": LABELS}),
            ValueError,
            r"unknown \['x'\]",
        ),
        (
            (metric_fn, [LABELS, jnp.asarray(1.0)]),
            ValueError,
            r"rank >= 1.*reshape a scalar to \[1\]",
        ),
    ],
)
def test_host_call_like_invalid(name, value, error, pattern):
    with pytest.raises(error, match=pattern):
        BUILDERS[name](value)


@pytest.mark.parametrize("name", ["eval_metrics", "host_call"])
def test_host_call_like_valid_arity(name):
    build = BUILDERS[name]
    build((metric_fn, [LABELS, LOGITS]))
    build([metric_fn, (LABELS, LOGITS)])  # a list pair and a tuple of tensors, as in TF
    build((metric_fn, {"logits": LOGITS, "labels": LABELS}))
    with_default = lambda a, b=None: {}  # noqa: E731
    build((with_default, [LABELS]))
    build((with_default, [LABELS, LABELS]))
    with pytest.raises(ValueError, match="takes 1 to 2 positional"):
        build((with_default, [LABELS] * 3))
    build((lambda *xs: {}, [LABELS] * 5))
    build((lambda a, *xs: {}, [LABELS] * 3))
    with pytest.raises(ValueError, match="takes 1\\+ positional"):
        build((lambda a, *xs: {}, []))
    build((lambda **kw: {}, {"anything": LABELS}))
    build((lambda a, *, b: {}, {"a": LABELS, "b": LABELS}))
    build((functools.partial(metric_fn, LABELS), [LOGITS]))
    build((lambda: {}, []))
    with pytest.raises(ValueError, match=r"missing \['a'\]"):
        build((lambda a, /: {}, {"a": LABELS}))  # positional-only cannot be passed by name


def test_host_call_scalar_error_mentions_reshape():
    with pytest.raises(ValueError, match=r"host_call\[1\]\[0\]=Array\(shape=\(\), dtype=float32\)"):
        train_with_host_call((lambda loss: None, [LOSS]))
    spec = train_with_host_call((lambda loss: None, [LOSS.reshape(1)]))
    assert spec.host_call[1][0].shape == (1,)


# --- as_estimator_spec ---


def test_as_estimator_spec_list_and_dict():
    for tensors in ([LABELS, LOGITS], {"logits": LOGITS, "labels": LABELS}):
        est = evaluate(eval_metrics=(metric_fn, tensors)).as_estimator_spec()
        assert isinstance(est, EstimatorSpec) and est.mode == ModeKeys.EVAL
        assert est.eval_metric_ops["accuracy"].compute() == pytest.approx(3 / 8)
        assert est.loss is LOSS


def test_as_estimator_spec_carries_fields():
    h = SessionRunHook()
    spec = TPUEstimatorSpec(
        ModeKeys.TRAIN,
        predictions={"p": LOGITS},
        loss=LOSS,
        train_op=OPT,
        host_call=(lambda x: None, [LOGITS]),
        training_hooks=[h],
        evaluation_hooks=[h],
        prediction_hooks=[h, h],
    )
    est = spec.as_estimator_spec()
    assert est.train_op is OPT and est.predictions == spec.predictions
    assert est.training_hooks == (h,) and est.evaluation_hooks == (h,)
    assert est.prediction_hooks == (h, h) and est.training_chief_hooks == ()
    assert est.eval_metric_ops is None and not hasattr(est, "host_call")
    assert est.scaffold == Scaffold()


def test_as_estimator_spec_predict_exports():
    spec = TPUEstimatorSpec(ModeKeys.PREDICT, predictions=LOGITS)
    assert set(spec.as_estimator_spec().export_outputs) == {"serving_default"}
    head = RegressionOutput(LOGITS[:, 0])
    spec = TPUEstimatorSpec(ModeKeys.PREDICT, predictions=LOGITS, export_outputs={"r": head})
    assert spec.as_estimator_spec().export_outputs == {"r": head, "serving_default": head}


def test_as_estimator_spec_metric_fn_must_return_metrics():
    with pytest.raises(TypeError, match="must return a dict.*returned Array"):
        evaluate(eval_metrics=(lambda x: x.mean(), [LOGITS])).as_estimator_spec()
    with pytest.raises(TypeError, match=r"Metric instances.*eval_metric_ops\['m'\]"):
        evaluate(eval_metrics=(lambda x: {"m": x.mean()}, [LOGITS])).as_estimator_spec()


# --- immutability and _replace ---


@pytest.mark.parametrize("cls", SPECS)
def test_immutable(cls):
    spec = train(cls)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.loss = LOSS
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.mode = ModeKeys.EVAL


@pytest.mark.parametrize("cls", SPECS)
def test_replace(cls):
    spec = train(cls)
    new = spec._replace(loss=jnp.ones([1]))
    assert new.loss.shape == () and spec.loss is LOSS and new.train_op is OPT
    assert spec._replace(mode="train").mode == "train"
    with pytest.raises(ValueError, match="cannot change the mode.*Build a new spec"):
        spec._replace(mode=ModeKeys.EVAL)
    with pytest.raises(ValueError, match=r"takes only its fields.*\['lost'\]"):
        spec._replace(lost=LOSS)
    with pytest.raises(ValueError, match="requires `loss`"):
        spec._replace(loss=None)
    with pytest.raises(TypeError, match="`loss` must be an array"):
        spec._replace(loss=2.0)


@pytest.mark.parametrize("cls", SPECS)
def test_replace_rebuilds_default_export_outputs(cls):
    spec = cls(ModeKeys.PREDICT, predictions={"a": LOGITS})
    new = spec._replace(predictions={"b": LOGITS})
    assert list(new.export_outputs["serving_default"].outputs) == ["b"]
    head = PredictOutput({"x": LOGITS})
    given = cls(ModeKeys.PREDICT, predictions={"a": LOGITS}, export_outputs={"h": head})
    assert given._replace(predictions={"b": LOGITS}).export_outputs["serving_default"] is head


def test_replace_tpu_fields():
    spec = evaluate(eval_metrics=(metric_fn, [LABELS, LOGITS]))
    assert spec._replace(loss=LOSS).eval_metrics[0] is metric_fn
    with pytest.raises(ValueError, match="1 tensors"):
        spec._replace(eval_metrics=(metric_fn, [LABELS]))


def test_repr_shows_shapes_not_values():
    spec = TPUEstimatorSpec(
        ModeKeys.EVAL,
        loss=LOSS,
        eval_metrics=(metric_fn, [LABELS, LOGITS]),
        predictions={"p": jnp.arange(500.0)},
    )
    text = repr(spec)
    assert "mode='eval'" in text and "shape=(500,)" in text and "metric_fn" in text
    assert "499" not in text and "training_hooks" not in text


# --- under JAX tracing ---


@pytest.mark.parametrize("cls", SPECS)
def test_built_inside_jit_from_tracers(cls):
    seen = {}

    @jax.jit
    def step(x, y):
        logits = x @ jnp.ones((3, 4))
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean().reshape(1)
        spec = cls(ModeKeys.TRAIN, loss=loss, train_op=OPT, predictions={"logits": logits})
        seen["loss_shape"] = spec.loss.shape
        return spec.loss

    loss = step(jnp.ones((8, 3)), jnp.zeros(8, jnp.int32))
    assert seen["loss_shape"] == () and loss.shape == ()


def test_tpu_spec_with_eval_metrics_inside_jit_and_returned():
    def model(x, y):
        logits = x @ jnp.ones((3, 3))
        return TPUEstimatorSpec(
            ModeKeys.EVAL,
            loss=logits.mean(),
            eval_metrics=(metric_fn, {"labels": y, "logits": logits}),
            host_call=(lambda x: None, [logits[:, 0]]),
        )

    spec = jax.jit(model)(jnp.ones((8, 3)), LABELS)
    assert isinstance(spec, TPUEstimatorSpec) and spec.eval_metrics[0] is metric_fn
    assert spec.eval_metrics[1]["logits"].shape == (8, 3) and spec.host_call[1][0].shape == (8,)
    est = spec.as_estimator_spec()
    assert est.eval_metric_ops["accuracy"].compute() == pytest.approx(3 / 8)
    # the metric state itself can come out of a compiled program too
    ops = jax.jit(lambda x, y: model(x, y).as_estimator_spec().eval_metric_ops)(
        jnp.ones((8, 3)), LABELS
    )
    assert ops["accuracy"].compute() == pytest.approx(3 / 8)


def test_eval_shape_gives_abstract_spec():
    def model(x):
        return EstimatorSpec(ModeKeys.PREDICT, predictions={"y": x * 2})

    spec = jax.eval_shape(model, jax.ShapeDtypeStruct((5, 2), jnp.float32))
    assert spec.predictions["y"].shape == (5, 2)
    assert spec.export_outputs["serving_default"].outputs["y"].shape == (5, 2)


def test_errors_raised_while_tracing_show_shapes():
    def bad(x):
        return EstimatorSpec(ModeKeys.TRAIN, loss=x.sum(0), train_op=OPT)

    with pytest.raises(ValueError, match=r"Received: loss=Array\(shape=\(3,\), dtype=float32\)"):
        jax.jit(bad)(jnp.ones((4, 3)))


def test_pytree_leaves_and_static_parts():
    h = SessionRunHook()
    spec = TPUEstimatorSpec(
        ModeKeys.TRAIN,
        loss=LOSS,
        train_op=OPT,
        host_call=(metric_fn, [LABELS, LOGITS]),
        training_hooks=[h],
    )
    leaves, treedef = jax.tree.flatten(spec)
    assert len(leaves) == 3  # loss and the two host_call tensors
    back = jax.tree.unflatten(treedef, leaves)
    assert back.train_op is OPT and back.training_hooks == (h,) and back.host_call[0] is metric_fn
    doubled = jax.tree.map(lambda a: a * 2, spec)
    assert float(doubled.loss) == 1.0
