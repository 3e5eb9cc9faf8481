"""Binary confusion counts and what derives from them: precision, recall, TP/FP/FN/TN.

Every state here holds the same four weighted counts; the subclass decides
what `compute` returns, and only states of the same subclass merge.
"""

from __future__ import annotations

from typing import Any, TypeVar

from tpu_estimator.metrics._base import Metric, div_no_nan, host_or_traced, to_scalar
from tpu_estimator.metrics._inputs import (
    Array,
    Scalar,
    align,
    as_arrays,
    broadcast_weights,
    check_values,
    namespace,
    weighted_sum,
)


class BinaryCounts(Metric):
    """Weighted counts of true/false positives/negatives of binary predictions."""

    true_positives: Array
    false_positives: Array
    false_negatives: Array
    true_negatives: Array


class Precision(BinaryCounts):
    """State of `metrics.precision`: TP / (TP + FP), 0 when nothing is predicted positive."""

    def compute(self) -> Scalar:
        xp, s = host_or_traced(self)
        value = div_no_nan(xp, s.true_positives, s.true_positives + s.false_positives)
        return to_scalar(xp, value)


class Recall(BinaryCounts):
    """State of `metrics.recall`: TP / (TP + FN), 0 when no label is positive."""

    def compute(self) -> Scalar:
        xp, s = host_or_traced(self)
        value = div_no_nan(xp, s.true_positives, s.true_positives + s.false_negatives)
        return to_scalar(xp, value)


class TruePositives(BinaryCounts):
    """State of `metrics.true_positives`: the weighted count."""

    def compute(self) -> Scalar:
        xp, s = host_or_traced(self)
        return to_scalar(xp, s.true_positives)


class FalsePositives(BinaryCounts):
    """State of `metrics.false_positives`: the weighted count."""

    def compute(self) -> Scalar:
        xp, s = host_or_traced(self)
        return to_scalar(xp, s.false_positives)


class FalseNegatives(BinaryCounts):
    """State of `metrics.false_negatives`: the weighted count."""

    def compute(self) -> Scalar:
        xp, s = host_or_traced(self)
        return to_scalar(xp, s.false_negatives)


class TrueNegatives(BinaryCounts):
    """State of `metrics.true_negatives`: the weighted count."""

    def compute(self) -> Scalar:
        xp, s = host_or_traced(self)
        return to_scalar(xp, s.true_negatives)


B = TypeVar("B", bound=BinaryCounts)


def binary_counts(
    cls: type[B], labels: Any, predictions: Any, weights: Any, *, fn: str
) -> B:
    """Builds a `cls` state from 0/1 (or bool) labels and predictions."""
    xp = namespace(labels, predictions, weights)
    labels, predictions = as_arrays(xp, labels, predictions)
    labels, predictions = align(
        labels,
        predictions,
        fn=fn,
        fix="Pass one 0/1 prediction per label, e.g. predictions = probabilities > 0.5.",
    )
    w = broadcast_weights(xp, weights, tuple(labels.shape), fn=fn)
    for name, x in (("labels", labels), ("predictions", predictions)):
        check_values(
            xp,
            x,
            w,
            (x == 0) | (x == 1),
            fn=fn,
            name=name,
            expected=f"binary {name}: 0/1 or bool",
            fix="Threshold scores first (e.g. probabilities > 0.5), and give "
            "padding examples weight 0.",
        )
    pos, pred = labels != 0, predictions != 0
    return cls(
        true_positives=weighted_sum(xp, pos & pred, w),
        false_positives=weighted_sum(xp, ~pos & pred, w),
        false_negatives=weighted_sum(xp, pos & ~pred, w),
        true_negatives=weighted_sum(xp, ~pos & ~pred, w),
    )


def precision(labels: Any, predictions: Any, weights: Any = None) -> Precision:
    """Weighted precision TP / (TP + FP) of binary predictions (0.0 if none positive).

    Args:
        labels: 0/1 or bool ground truth, any shape.
        predictions: 0/1 or bool, the shape of `labels` (a trailing axis of
            size 1 on either is squeezed). Inside `jax.jit`, nonzero means 1,
            as in TF; on the host other values raise.
        weights: None (all 1), a scalar, or an array broadcastable to `labels`
            (lower rank aligns with the leading, batch axis). Weight 0
            excludes an example.

    Returns:
        A `Precision` state holding the four weighted counts.

    Raises:
        ValueError: shapes do not match, or (on the host) a label or
            prediction with nonzero weight is not 0/1.

    Example:
        >>> from tpu_estimator import metrics
        >>> metrics.precision([1, 0, 1, 1], [1, 1, 0, 1]).compute()
        0.6666666666666666
    """
    return binary_counts(Precision, labels, predictions, weights, fn="precision")


def recall(labels: Any, predictions: Any, weights: Any = None) -> Recall:
    """Weighted recall TP / (TP + FN) of binary predictions (0.0 if no positive label).

    Args:
        labels: 0/1 or bool ground truth, any shape.
        predictions: 0/1 or bool, the shape of `labels` (a trailing axis of
            size 1 on either is squeezed). Inside `jax.jit`, nonzero means 1,
            as in TF; on the host other values raise.
        weights: None (all 1), a scalar, or an array broadcastable to `labels`
            (lower rank aligns with the leading, batch axis). Weight 0
            excludes an example.

    Returns:
        A `Recall` state holding the four weighted counts.

    Raises:
        ValueError: shapes do not match, or (on the host) a label or
            prediction with nonzero weight is not 0/1.

    Example:
        >>> from tpu_estimator import metrics
        >>> metrics.recall([1, 0, 1, 1], [1, 1, 0, 0]).compute()
        0.3333333333333333
    """
    return binary_counts(Recall, labels, predictions, weights, fn="recall")


def true_positives(labels: Any, predictions: Any, weights: Any = None) -> TruePositives:
    """Weighted count of label 1, prediction 1.

    Arguments and errors as in `precision`.

    Example:
        >>> from tpu_estimator import metrics
        >>> metrics.true_positives([1, 0, 1], [1, 1, 1], weights=[2, 1, 0]).compute()
        2.0
    """
    return binary_counts(TruePositives, labels, predictions, weights, fn="true_positives")


def false_positives(labels: Any, predictions: Any, weights: Any = None) -> FalsePositives:
    """Weighted count of label 0, prediction 1.

    Arguments and errors as in `precision`.

    Example:
        >>> from tpu_estimator import metrics
        >>> metrics.false_positives([1, 0, 0], [1, 1, 1]).compute()
        2.0
    """
    return binary_counts(
        FalsePositives, labels, predictions, weights, fn="false_positives"
    )


def false_negatives(labels: Any, predictions: Any, weights: Any = None) -> FalseNegatives:
    """Weighted count of label 1, prediction 0.

    Arguments and errors as in `precision`.

    Example:
        >>> from tpu_estimator import metrics
        >>> metrics.false_negatives([1, 1, 0], [0, 1, 0]).compute()
        1.0
    """
    return binary_counts(
        FalseNegatives, labels, predictions, weights, fn="false_negatives"
    )


def true_negatives(labels: Any, predictions: Any, weights: Any = None) -> TrueNegatives:
    """Weighted count of label 0, prediction 0.

    Arguments and errors as in `precision`.

    Example:
        >>> from tpu_estimator import metrics
        >>> metrics.true_negatives([1, 0, 0], [0, 0, 0]).compute()
        2.0
    """
    return binary_counts(TrueNegatives, labels, predictions, weights, fn="true_negatives")
