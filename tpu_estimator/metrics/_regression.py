"""Regression errors: mean squared, root mean squared and mean absolute error."""

from __future__ import annotations

from typing import Any, Callable, TypeVar

from tpu_estimator.metrics._base import div_no_nan, host_or_traced, to_scalar
from tpu_estimator.metrics._inputs import (
    Scalar,
    align,
    as_arrays,
    broadcast_weights,
    float_dtype,
    namespace,
)
from tpu_estimator.metrics._mean import WeightedMean, weighted_mean_stats


class MeanSquaredError(WeightedMean):
    """State of `metrics.mean_squared_error`."""


class MeanAbsoluteError(WeightedMean):
    """State of `metrics.mean_absolute_error`."""


class RootMeanSquaredError(WeightedMean):
    """State of `metrics.root_mean_squared_error`: the square root of the merged MSE."""

    def compute(self) -> Scalar:
        xp, s = host_or_traced(self)
        return to_scalar(xp, xp.sqrt(div_no_nan(xp, s.total, s.count)))


W = TypeVar("W", bound=WeightedMean)


def _error_state(
    cls: type[W],
    labels: Any,
    predictions: Any,
    weights: Any,
    error: Callable[[Any], Any],
    fn: str,
) -> W:
    xp = namespace(labels, predictions, weights)
    labels, predictions = as_arrays(xp, labels, predictions)
    labels, predictions = align(
        labels, predictions, fn=fn, fix="Reshape predictions to labels' shape."
    )
    w = broadcast_weights(xp, weights, tuple(labels.shape), fn=fn)
    dtype = float_dtype(xp)
    diff = predictions.astype(dtype) - labels.astype(dtype)
    return cls(**weighted_mean_stats(xp, error(diff), w))


def mean_squared_error(
    labels: Any, predictions: Any, weights: Any = None
) -> MeanSquaredError:
    """Weighted mean of (predictions - labels)**2 over all elements.

    Args:
        labels: ground truth, any shape.
        predictions: the shape of `labels` (a trailing axis of size 1 on
            either is squeezed).
        weights: None (all 1), a scalar, or an array broadcastable to `labels`
            (lower rank aligns with the leading, batch axis); every element
            counts with its weight. Weight 0 excludes an example.

    Returns:
        A `MeanSquaredError` state; `.compute()` gives 0.0 when all weights are 0.

    Raises:
        ValueError: shapes of `labels`, `predictions` or `weights` do not match.

    Example:
        >>> from tpu_estimator import metrics
        >>> metrics.mean_squared_error([0.0, 1.0], [1.0, 3.0]).compute()
        2.5
    """
    return _error_state(
        MeanSquaredError, labels, predictions, weights, lambda d: d * d, "mean_squared_error"
    )


def root_mean_squared_error(
    labels: Any, predictions: Any, weights: Any = None
) -> RootMeanSquaredError:
    """Square root of the weighted mean squared error (of all merged data).

    As in TF, this is sqrt(MSE over all elements); for multi-output labels
    scikit-learn's `root_mean_squared_error` instead averages per-output RMSEs.

    Arguments and errors as in `mean_squared_error`.

    Example:
        >>> from tpu_estimator import metrics
        >>> metrics.root_mean_squared_error([0.0, 0.0], [3.0, 4.0], weights=[1, 1]).compute()
        3.5355339059327378
    """
    return _error_state(
        RootMeanSquaredError,
        labels,
        predictions,
        weights,
        lambda d: d * d,
        "root_mean_squared_error",
    )


def mean_absolute_error(
    labels: Any, predictions: Any, weights: Any = None
) -> MeanAbsoluteError:
    """Weighted mean of |predictions - labels| over all elements.

    Arguments and errors as in `mean_squared_error`.

    Example:
        >>> from tpu_estimator import metrics
        >>> labels, predictions = [0.0, 1.0, 5.0], [1.0, 3.0, 0.0]
        >>> metrics.mean_absolute_error(labels, predictions, weights=[1, 1, 0]).compute()
        1.5
    """
    return _error_state(
        MeanAbsoluteError, labels, predictions, weights, abs, "mean_absolute_error"
    )
