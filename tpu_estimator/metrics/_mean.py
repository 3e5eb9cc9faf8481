"""Weighted means: the `(total, count)` statistic and `metrics.mean`."""

from __future__ import annotations

from typing import Any

from tpu_estimator.metrics._base import Metric, div_no_nan, host_or_traced, to_scalar
from tpu_estimator.metrics._inputs import (
    Array,
    Scalar,
    as_arrays,
    broadcast_weights,
    namespace,
    weighted_sum,
)


class WeightedMean(Metric):
    """`total / count`: sum of weighted values over sum of weights (0 if no weight).

    The state behind `mean`, `accuracy`, `top_k_accuracy` and the regression
    errors; each is its own subclass, so states of different metrics never merge.
    """

    total: Array
    count: Array

    def compute(self) -> Scalar:
        xp, s = host_or_traced(self)
        return to_scalar(xp, div_no_nan(xp, s.total, s.count))


class Mean(WeightedMean):
    """State of `metrics.mean`."""


def weighted_mean_stats(xp: Any, values: Any, weights: Any) -> dict[str, Any]:
    """The `total` and `count` statistics of `values` under broadcast `weights`."""
    return {
        "total": weighted_sum(xp, values, weights),
        "count": weighted_sum(xp, xp.ones_like(weights), weights),
    }


def mean(values: Any, weights: Any = None) -> Mean:
    """Weighted mean of `values`, like `tf.compat.v1.metrics.mean`.

    Args:
        values: array of any shape.
        weights: None (all 1), a scalar, or an array broadcastable to `values`
            (lower rank aligns with the leading axis). Weight 0 excludes a value.

    Returns:
        A `Mean` state; `.compute()` is sum(values * weights) / sum(weights),
        or 0.0 when the weights sum to 0.

    Raises:
        ValueError: `weights` does not broadcast to `values`.

    Example:
        >>> from tpu_estimator import metrics
        >>> metrics.mean([1.0, 2.0, 6.0], weights=[1, 1, 0]).compute()
        1.5
    """
    xp = namespace(values, weights)
    (values,) = as_arrays(xp, values)
    w = broadcast_weights(xp, weights, tuple(values.shape), fn="mean", target="values")
    return Mean(**weighted_mean_stats(xp, values, w))
