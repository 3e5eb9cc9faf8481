"""Calling a user's `model_fn` / `input_fn` with the arguments it asks for."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from tpu_estimator.api.checks import message

if TYPE_CHECKING:
    from tpu_estimator.api.spec import ModelFn

R = TypeVar("R")

MODEL_FN_ARGS = ("features", "labels", "mode", "params", "config")
INPUT_FN_ARGS = ("params", "config", "mode", "input_context")


def accepted_args(fn: Callable[..., object], allowed: tuple[str, ...], what: str) -> frozenset[str]:
    """The names in `allowed` that `fn` takes; any other required parameter is an error."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as e:
        raise TypeError(message(f"`{what}` must be a callable.", f"{what}={fn!r}")) from e
    names = set()
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.name in allowed:
            names.add(p.name)
        elif p.default is p.empty:
            raise ValueError(
                message(
                    f"`{what}` may only take the arguments {', '.join(allowed)}.",
                    f"{what} has an argument named {p.name!r}",
                    "Rename it, give it a default, or bind it with functools.partial.",
                )
            )
    return frozenset(names)


def check_model_fn(model_fn: ModelFn) -> frozenset[str]:
    """Validates the signature of `model_fn`; returns the argument names it takes."""
    if not callable(model_fn):
        raise TypeError(message("`model_fn` must be a callable.", f"model_fn={model_fn!r}"))
    names = accepted_args(model_fn, MODEL_FN_ARGS, "model_fn")
    if "features" not in names:
        raise ValueError(
            message(
                "`model_fn` must take an argument named `features`.",
                f"model_fn{inspect.signature(model_fn)}",
                "Use def model_fn(features, labels, mode, params): ...",
            )
        )
    return names


def call_with(fn: Callable[..., R], names: frozenset[str], **available: Any) -> R:
    """Calls `fn` with the keyword arguments among `available` it takes."""
    return fn(**{k: v for k, v in available.items() if k in names})
