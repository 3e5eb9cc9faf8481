"""Input handling shared by the metric factories: array namespace, shapes, weights.

Every factory runs in one of two namespaces:

* host (`numpy`, statistics in float64): the inputs are numpy arrays, Python
  values or concrete, fully addressable `jax.Array`s (pulled to the host);
  values are validated (binary labels, class ids in range, ...).
* traced (`jax.numpy`, statistics in JAX's default float dtype): some input is
  a tracer (inside `jax.jit`, `lax.scan`, ...) or a non-addressable global
  array. Nothing data-dependent can be checked there.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeAlias, Union

import jax
import jax.numpy as jnp
import numpy as np

from tpu_estimator.api.checks import message

if TYPE_CHECKING:
    from jax.typing import ArrayLike

# A statistic: a numpy array on the host, a jax.Array inside a program.
Array: TypeAlias = Union[jax.Array, np.ndarray]
# What `compute()` returns: a Python float on the host, the JAX scalar inside a trace.
Scalar: TypeAlias = Union[float, jax.Array]


def is_traced(x: object) -> bool:
    """True where `x` must stay a JAX value: a tracer or a non-addressable array."""
    if isinstance(x, jax.core.Tracer):
        return True
    return isinstance(x, jax.Array) and not x.is_fully_addressable


def namespace(*xs: ArrayLike | None) -> ModuleType:
    """`jax.numpy` when any of `xs` is traced, else `numpy`."""
    return jnp if any(is_traced(x) for x in xs if x is not None) else np


def float_dtype(xp: ModuleType) -> Any:
    """The dtype statistics are accumulated in: float64 on the host."""
    return np.float64 if xp is np else jax.dtypes.canonicalize_dtype(np.float64)


def as_arrays(xp: ModuleType, *xs: ArrayLike | None) -> list[Any]:
    """Converts each of `xs` (None kept) to an array of namespace `xp`."""
    return [None if x is None else xp.asarray(x) for x in xs]


def align(
    labels: Any,
    predictions: Any,
    *,
    fn: str,
    fix: str,
) -> tuple[Any, Any]:
    """Squeezes a trailing size-1 axis where ranks differ by one; requires equal shapes.

    This is TF's `remove_squeezable_dimensions`: labels of shape `[batch, 1]`
    go with predictions of shape `[batch]` and vice versa.
    """
    if labels.ndim == predictions.ndim + 1 and labels.shape[-1] == 1:
        labels = labels[..., 0]
    elif predictions.ndim == labels.ndim + 1 and predictions.shape[-1] == 1:
        predictions = predictions[..., 0]
    if labels.shape != predictions.shape:
        raise ValueError(
            message(
                f"`{fn}` expects `labels` and `predictions` of the same shape "
                "(a trailing axis of size 1 on either is squeezed).",
                f"labels.shape={tuple(labels.shape)}, "
                f"predictions.shape={tuple(predictions.shape)}",
                fix,
            )
        )
    return labels, predictions


def broadcast_weights(
    xp: ModuleType,
    weights: Any,
    shape: tuple[int, ...],
    *,
    fn: str,
    target: str = "labels",
) -> Any:
    """`weights` (None: all ones) broadcast to `shape`, as float statistics.

    Accepted: a scalar; an array of the same rank whose axes are 1 or equal
    to `shape`'s; a lower-rank array aligned with the *leading* (batch) axes,
    e.g. one weight per example, `[batch]`, for labels of shape `[batch, d]`;
    or one extra trailing axis of size 1 (squeezed), as in TF.
    """
    dtype = float_dtype(xp)
    if weights is None:
        return xp.ones(shape, dtype)
    w = xp.asarray(weights, dtype)
    received = tuple(w.shape)
    if w.ndim == len(shape) + 1 and w.shape[-1] == 1:
        w = w[..., 0]
    if 0 < w.ndim < len(shape):
        w = w.reshape(tuple(w.shape) + (1,) * (len(shape) - w.ndim))
    ok = w.ndim == 0 or (
        w.ndim == len(shape) and all(a in (1, b) for a, b in zip(w.shape, shape))
    )
    if not ok:
        raise ValueError(
            message(
                f"`{fn}` expects `weights` to be a scalar or broadcastable to "
                f"{target}.shape; lower-rank weights align with the leading "
                "(batch) axis.",
                f"weights.shape={received}, {target}.shape={tuple(shape)}",
                f"Pass one weight per example (shape {tuple(shape[:1])}) or per "
                f"element (shape {tuple(shape)}).",
            )
        )
    return xp.broadcast_to(w, shape)


def weighted_sum(xp: ModuleType, values: Any, weights: Any) -> Any:
    """sum(values * weights), where a weight of 0 drops its value even if NaN/inf."""
    dtype = float_dtype(xp)
    values = xp.asarray(values, dtype)
    return xp.asarray(xp.sum(xp.where(weights != 0, values * weights, 0)), dtype)


def check_values(
    xp: ModuleType,
    x: Any,
    weights: Any,
    ok: Any,
    *,
    fn: str,
    name: str,
    expected: str,
    fix: str,
) -> None:
    """On the host, raises ValueError unless `ok` holds wherever the weight is nonzero.

    Entries with weight 0 (padding of a short final batch) are not checked.
    Inside a trace this does nothing: values are unknown there.
    """
    if xp is not np:
        return
    bad = ~np.asarray(ok) & (np.asarray(weights) != 0)
    if not bad.any():
        return
    offending = np.asarray(x)[bad]
    shown = np.unique(offending)[:5].tolist()
    raise ValueError(
        message(
            f"`{fn}` expects {expected}.",
            f"{name} containing {shown} ({int(bad.sum())} entries with nonzero weight)",
            fix,
        )
    )
