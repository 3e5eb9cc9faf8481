"""Property tests: random arguments give a valid object or ValueError/TypeError, nothing else."""

import inspect
import os
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpu_estimator import (
    ClassificationOutput,
    ClusterConfig,
    EstimatorSpec,
    InputPipelineConfig,
    ModeKeys,
    PredictOutput,
    RegressionOutput,
    RunConfig,
    Scaffold,
    ServingInputReceiver,
    SessionRunArgs,
    SessionRunHook,
    TensorSpec,
    TPUConfig,
    TPUEstimatorSpec,
    build_raw_serving_input_receiver_fn,
    metrics,
)

# API_PROPERTY_EXAMPLES=5000 for a deeper (slower) search.
SETTINGS = settings(
    max_examples=int(os.environ.get("API_PROPERTY_EXAMPLES", 150)),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def metric_fn(labels, logits):
    return {"m": metrics.mean(logits)}


ARRAYS = [
    np.float32(1.0),
    np.int32(3),
    np.zeros((), np.float32),
    np.zeros((1,), np.float32),
    np.zeros((2,), np.float64),
    np.zeros((4, 3), np.float32),
    np.zeros((4,), np.int32),
    np.zeros((0,), np.float32),
    np.array([True, False]),
    jnp.zeros((), jnp.float32),
    jnp.zeros((1,), jnp.bfloat16),
    jnp.zeros((4, 3)),
    jnp.zeros((4,), jnp.int32),
]
OBJECTS = [
    optax.sgd(0.1),
    optax.adam,
    SessionRunHook(),
    Scaffold(),
    metric_fn,
    lambda: Scaffold(),
    lambda *a, **k: None,
    PredictOutput(np.zeros((4, 3), np.float32)),
    RegressionOutput(np.zeros((4,), np.float32)),
    metrics.mean(np.zeros(3)),
    InputPipelineConfig.PER_HOST_V2,
    InputPipelineConfig.SLICED,
    TPUConfig(),
    ClusterConfig(),
    TensorSpec((None, 3), "float32"),
    object(),
    np.float32,
]
STRINGS = st.sampled_from(
    [
        "",
        "30s",
        "2m",
        "1h",
        "01",
        "0",
        "-5",
        "5x",
        "h:1",
        "localhost:8476",
        "train",
        "infer",
        "loss",
        "serving_default",
        "float32",
        "input",
    ]
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.integers(-3, 130),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4),
    STRINGS,
)
LEAVES = st.one_of(SCALARS, st.sampled_from(ARRAYS), st.sampled_from(OBJECTS))
KEYS = st.one_of(STRINGS, st.text(max_size=3), st.integers(-2, 2), st.none())
NESTED = st.recursive(
    LEAVES,
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.tuples(children, children),
        st.dictionaries(KEYS, children, max_size=3),
    ),
    max_leaves=6,
)
# Biased to arrays and library objects so that valid objects come out often too.
PLAUSIBLE = st.sampled_from([None, None, 0, 1, 2, 4, 8, 100, 1.5, True, False, "30s", "loss"])
VALUES = st.one_of(PLAUSIBLE, st.sampled_from(ARRAYS), st.sampled_from(OBJECTS), NESTED)


def random_kwargs(fn, skip=()):
    """Random values for a random subset of fn's parameters (always the required ones)."""
    params = [p for n, p in inspect.signature(fn).parameters.items() if n not in ("self", *skip)]
    required = {p.name: VALUES for p in params if p.default is p.empty}
    optional = [p.name for p in params if p.default is not p.empty]
    extra = (
        st.dictionaries(st.sampled_from(optional), VALUES, max_size=2) if optional else st.just({})
    )
    return st.tuples(st.fixed_dictionaries(required), extra).map(lambda t: {**t[0], **t[1]})


def only_value_or_type_errors(build):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            return build()
    except (ValueError, TypeError) as e:
        assert "Received:" in str(e), f"{type(e).__name__} without the received value: {e}"
        return None


@SETTINGS
@given(random_kwargs(TPUConfig))
def test_tpu_config_random(kwargs):
    cfg = only_value_or_type_errors(lambda: TPUConfig(**kwargs))
    if cfg is not None:
        assert cfg.iterations_per_loop_parsed.value > 0
        assert cfg.cores_per_replica in (1, 2, 4, 8, 16, 32, 64, 128)
        assert isinstance(cfg.input_pipeline_config, InputPipelineConfig)


@SETTINGS
@given(random_kwargs(RunConfig.__init__))
def test_run_config_random(kwargs):
    cfg = only_value_or_type_errors(lambda: RunConfig(**kwargs))
    if cfg is not None:
        assert cfg.save_checkpoints_steps is None or cfg.save_checkpoints_secs is None
        assert isinstance(cfg.tpu_config, TPUConfig) and isinstance(cfg.seed, int)
        changes = {k: v for k, v in kwargs.items() if k != "save_checkpoints_secs"}
        only_value_or_type_errors(lambda: cfg.replace(**changes))


@SETTINGS
@given(random_kwargs(ClusterConfig))
def test_cluster_config_random(kwargs):
    cfg = only_value_or_type_errors(lambda: ClusterConfig(**kwargs))
    if cfg is not None and cfg.is_explicit:
        assert 0 <= cfg.process_id < cfg.num_processes


VALID = {
    ModeKeys.TRAIN: dict(loss=jnp.zeros(()), train_op=optax.sgd(0.1)),
    ModeKeys.EVAL: dict(loss=jnp.zeros(())),
    ModeKeys.PREDICT: dict(predictions={"p": jnp.zeros((4, 3))}),
}
MODES = st.one_of(st.sampled_from(ModeKeys.ALL), st.sampled_from(ModeKeys.ALL), SCALARS)


def check_spec(spec):
    assert spec.mode in ModeKeys.ALL
    assert spec.loss is None or spec.loss.shape == ()
    assert all(isinstance(h, SessionRunHook) for h in spec.training_hooks)
    if spec.mode == ModeKeys.PREDICT:
        assert "serving_default" in spec.export_outputs
    repr(spec)
    leaves, treedef = jax.tree.flatten(spec)
    assert type(jax.tree.unflatten(treedef, leaves)) is type(spec)
    assert type(spec._replace()) is type(spec)


@pytest.mark.parametrize("cls", [EstimatorSpec, TPUEstimatorSpec])
@SETTINGS
@given(mode=MODES, valid_base=st.integers(0, 3).map(bool), data=st.data())
def test_specs_random(cls, mode, valid_base, data):
    kwargs = data.draw(random_kwargs(cls.__init__, skip=("mode",)))
    base = dict(VALID.get(mode, {})) if valid_base and isinstance(mode, str) else {}
    base.update(kwargs)
    spec = only_value_or_type_errors(lambda: cls(mode, **base))
    if spec is not None:
        check_spec(spec)
        if cls is TPUEstimatorSpec:
            only_value_or_type_errors(lambda: check_spec(spec.as_estimator_spec()))


@SETTINGS
@given(st.sampled_from([PredictOutput, ClassificationOutput, RegressionOutput]), st.data())
def test_export_outputs_random(cls, data):
    kwargs = data.draw(random_kwargs(cls.__init__))
    out = only_value_or_type_errors(lambda: cls(**kwargs))
    if out is not None:
        assert out.outputs and all(isinstance(k, str) for k in out.outputs)
        assert isinstance(out.method_name, str)
        repr(out)


@SETTINGS
@given(VALUES, VALUES, VALUES)
def test_serving_input_random(a, b, c):
    only_value_or_type_errors(lambda: TensorSpec(a, b, c if isinstance(c, str) else None))
    only_value_or_type_errors(lambda: ServingInputReceiver(a, b, c))
    fn = only_value_or_type_errors(lambda: build_raw_serving_input_receiver_fn(a, b))
    if fn is not None:
        assert isinstance(fn(), ServingInputReceiver)


@SETTINGS
@given(VALUES, VALUES)
def test_session_run_args_random(fetches, feed_dict):
    args = only_value_or_type_errors(lambda: SessionRunArgs(fetches, feed_dict))
    if args is not None:
        try:
            args.resolve({"loss": 1.0})
        except ValueError:
            pass


HOOK = SessionRunHook()
X, Y = jnp.zeros((4, 3)), jnp.zeros((4,), jnp.int32)
OK_FIELDS = {
    "predictions": [X, {"p": X}, {"a": Y, "b": X}],
    "loss": [jnp.zeros(()), jnp.zeros((1,)), np.float32(1.0), np.zeros((1,), np.float64)],
    "train_op": [optax.sgd(0.1), optax.chain(optax.clip(1.0), optax.adam(1e-3))],
    "eval_metric_ops": [None, {}, {"m": metrics.mean(X)}],
    "export_outputs": [
        None,
        {},
        {"a": PredictOutput(X)},
        {"serving_default": ClassificationOutput(X, Y), "r": RegressionOutput(X[:, 0])},
    ],
    "training_chief_hooks": [None, [], [HOOK]],
    "training_hooks": [None, (HOOK, HOOK)],
    "evaluation_hooks": [None, [HOOK]],
    "prediction_hooks": [None, iter([HOOK])],
    "scaffold": [None, Scaffold(), Scaffold(lambda v: v)],
    "eval_metrics": [None, (metric_fn, [Y, X]), (metric_fn, {"labels": Y, "logits": X})],
    "host_call": [None, (lambda *xs: None, [X, Y.reshape(4, 1)]), (metric_fn, (Y, X))],
    "scaffold_fn": [None, lambda: Scaffold()],
}


@pytest.mark.parametrize("cls", [EstimatorSpec, TPUEstimatorSpec])
@SETTINGS
@given(mode=st.sampled_from(ModeKeys.ALL), data=st.data())
def test_specs_valid_combinations_always_construct(cls, mode, data):
    names = [n for n in inspect.signature(cls.__init__).parameters if n in OK_FIELDS]
    chosen = data.draw(st.lists(st.sampled_from(names), unique=True))
    kwargs = {n: data.draw(st.sampled_from(OK_FIELDS[n])) for n in chosen}
    for n, v in VALID[mode].items():
        kwargs.setdefault(n, v)
    spec = cls(mode, **kwargs)
    check_spec(spec)
    if cls is TPUEstimatorSpec:
        check_spec(spec.as_estimator_spec())
