"""The public API: every exported name imports, and the api/hooks names are there."""

import importlib

import pytest

import tpu_estimator

PUBLIC = sorted(
    getattr(tpu_estimator, "__all__", None)
    or [n for n in dir(tpu_estimator) if not n.startswith("_")]
)

SPEC_AND_HOOK_NAMES = [
    "DEFAULT_SERVING_SIGNATURE_DEF_KEY",
    "ClassificationOutput",
    "EstimatorSpec",
    "ExportOutput",
    "PredictOutput",
    "RegressionOutput",
    "Scaffold",
    "ServingInputReceiver",
    "TPUEstimatorSpec",
    "TensorSpec",
    "build_raw_serving_input_receiver_fn",
    "CheckpointSaverListener",
    "RunContext",
    "SessionRunArgs",
    "SessionRunHook",
    "SessionRunValues",
]


@pytest.mark.parametrize("name", PUBLIC)
def test_every_public_name_imports(name):
    namespace = {}
    exec(f"from tpu_estimator import {name}", namespace)
    assert namespace[name] is getattr(tpu_estimator, name)


@pytest.mark.parametrize("name", SPEC_AND_HOOK_NAMES)
def test_spec_and_hook_names_are_public(name):
    assert name in PUBLIC
    obj = getattr(tpu_estimator, name)
    if isinstance(obj, type) or callable(obj):
        assert obj.__doc__, f"{name} needs a docstring"


def test_hooks_subpackage_matches_top_level():
    hooks = importlib.import_module("tpu_estimator.hooks")
    for name in SPEC_AND_HOOK_NAMES:
        if name in hooks.__all__:
            assert getattr(hooks, name) is getattr(tpu_estimator, name)


def test_all_names_exist_if_all_is_defined():
    for name in getattr(tpu_estimator, "__all__", ()):
        assert hasattr(tpu_estimator, name), name
