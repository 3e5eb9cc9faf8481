"""The public signatures name the user's contracts (api/contracts.py), and every annotation
of a public name resolves to a real object (a misspelt or unimported type fails here)."""

from __future__ import annotations

import ast
import importlib
import inspect
import pathlib
import typing

import pytest

import tpu_estimator
from tpu_estimator.api import contracts
from tpu_estimator.api.spec import ModelFn

ROOT = pathlib.Path(tpu_estimator.__file__).parent


def _type_checking_names() -> dict[str, object]:
    """What the package's `if TYPE_CHECKING:` blocks import, imported for real."""
    names: dict[str, object] = {}
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
                for stmt in node.body:
                    if isinstance(stmt, ast.ImportFrom) and stmt.module:
                        module = importlib.import_module(stmt.module)
                        for alias in stmt.names:
                            names[alias.asname or alias.name] = getattr(module, alias.name)
    return names


@pytest.fixture(scope="module")
def hints():
    extra = _type_checking_names()

    def of(obj):
        module = importlib.import_module(obj.__module__)
        return typing.get_type_hints(obj, globalns={**extra, **vars(module)})

    return of


def _public_callables():
    for name in sorted(tpu_estimator.__all__):
        value = getattr(tpu_estimator, name)
        if inspect.isclass(value):
            yield name, value.__init__
            for member, fn in vars(value).items():
                if inspect.isfunction(fn) and not member.startswith("_"):
                    yield f"{name}.{member}", fn
        elif inspect.isfunction(value):
            yield name, value


@pytest.mark.parametrize("name, fn", list(_public_callables()), ids=lambda v: v if isinstance(v, str) else "")
def test_every_public_annotation_resolves(hints, name, fn):
    if getattr(fn, "__module__", "").startswith("tpu_estimator"):
        hints(fn)  # raises NameError / TypeError on an annotation that names nothing


def test_the_entry_points_take_the_contracts(hints):
    init = hints(tpu_estimator.TPUEstimator.__init__)
    assert init["model_fn"] is ModelFn
    assert init["batch_axis"] == contracts.BatchAxis
    for method in ("train", "evaluate", "predict"):
        assert hints(getattr(tpu_estimator.TPUEstimator, method))["input_fn"] is contracts.InputFn
    assert hints(tpu_estimator.Estimator.__init__)["model_fn"] is ModelFn
    spec = hints(tpu_estimator.TPUEstimatorSpec.__init__)
    for field, fn in (("eval_metrics", contracts.MetricFn), ("host_call", contracts.HostCallFn)):
        pair, none = typing.get_args(spec[field])  # Optional[(fn, tensors)]
        assert none is type(None) and typing.get_origin(pair) is tuple
        assert typing.get_args(pair)[0] is fn


def test_the_contracts_are_protocols_exported_by_the_package():
    for name in ("ModelFn", "InputFn", "MetricFn", "HostCallFn"):
        value = getattr(tpu_estimator, name)
        assert getattr(value, "_is_protocol", False), name
        assert name in tpu_estimator.__all__
