"""Thresholded AUC (ROC or PR), the algorithm of `tf.compat.v1.metrics.auc`.

Thresholds are `[-1e-7, 1/(n-1), ..., (n-2)/(n-1), 1 + 1e-7]` in float32; at
threshold i, a prediction is positive when `prediction > thresholds[i]`. The
state holds the weighted TP/FP/TN/FN count at every threshold, found in
O(batch + n) from a histogram of which interval each prediction falls into.
"""

from __future__ import annotations

import functools
from typing import Any, Literal, get_args

import numpy as np
from flax import struct

from tpu_estimator.api.checks import is_int
from tpu_estimator.metrics._base import Metric, div_no_nan, host_or_traced, to_scalar
from tpu_estimator.metrics._inputs import (
    Array,
    Scalar,
    align,
    as_arrays,
    broadcast_weights,
    check_values,
    message,
    namespace,
)

Curve = Literal["ROC", "PR"]
Summation = Literal["trapezoidal", "careful_interpolation", "minoring", "majoring"]

_EPSILON = 1e-6  # TF's guard against 0/0 in the rates.


class AUC(Metric):
    """State of `metrics.auc`: per-threshold weighted confusion counts, shape [n]."""

    true_positives: Array
    false_positives: Array
    true_negatives: Array
    false_negatives: Array
    num_thresholds: int = struct.field(pytree_node=False)
    curve: str = struct.field(pytree_node=False)
    summation_method: str = struct.field(pytree_node=False)

    def compute(self) -> Scalar:
        xp, s = host_or_traced(self)
        tp, fp = s.true_positives, s.false_positives
        tn, fn = s.true_negatives, s.false_negatives
        if self.curve == "PR" and self.summation_method == "careful_interpolation":
            return to_scalar(xp, _interpolate_pr_auc(xp, tp, fp, fn))
        recall = (tp + _EPSILON) / (tp + fn + _EPSILON)
        if self.curve == "ROC":
            x, y = fp / (fp + tn + _EPSILON), recall
        else:
            x, y = recall, (tp + _EPSILON) / (tp + fp + _EPSILON)
        if self.summation_method == "minoring":
            height = xp.minimum(y[:-1], y[1:])
        elif self.summation_method == "majoring":
            height = xp.maximum(y[:-1], y[1:])
        else:
            height = (y[:-1] + y[1:]) / 2.0
        return to_scalar(xp, xp.sum((x[:-1] - x[1:]) * height))


def _interpolate_pr_auc(xp: Any, tp: Any, fp: Any, fn: Any) -> Any:
    """PR-AUC interpolating TP and FP linearly between thresholds (Davis & Goadrich)."""
    dtp = tp[:-1] - tp[1:]
    p = tp + fp
    slope = div_no_nan(xp, dtp, xp.maximum(p[:-1] - p[1:], 0))
    intercept = tp[1:] - slope * p[1:]
    both = (p[:-1] > 0) & (p[1:] > 0)
    ratio = xp.where(both, div_no_nan(xp, p[:-1], xp.maximum(p[1:], 0)), 1.0)
    return xp.sum(
        div_no_nan(
            xp, slope * (dtp + intercept * xp.log(ratio)), xp.maximum(tp[1:] + fn[1:], 0)
        )
    )


@functools.cache
def thresholds(num_thresholds: int) -> np.ndarray:
    """TF's thresholds for `num_thresholds`, as float32 (read-only)."""
    inner = [(i + 1) * 1.0 / (num_thresholds - 1) for i in range(num_thresholds - 2)]
    out = np.array([0.0 - 1e-7] + inner + [1.0 + 1e-7], np.float32)
    out.flags.writeable = False
    return out


def auc(
    labels: Any,
    predictions: Any,
    weights: Any = None,
    num_thresholds: int = 200,
    curve: Curve = "ROC",
    summation_method: Summation = "trapezoidal",
) -> AUC:
    """Approximate area under the ROC or PR curve, like `tf.compat.v1.metrics.auc`.

    The curve is sampled at `num_thresholds` evenly spaced thresholds, so the
    result approaches the exact AUC as `num_thresholds` grows (and when the
    predictions spread over [0, 1]). The defaults are TF's;
    `summation_method='careful_interpolation'` is TF's recommended PR-AUC.

    Args:
        labels: 0/1 or bool ground truth, any shape.
        predictions: probabilities in [0, 1], the shape of `labels` (a
            trailing axis of size 1 on either is squeezed).
        weights: None (all 1), a scalar, or an array broadcastable to `labels`
            (lower rank aligns with the leading, batch axis). Weight 0
            excludes an example.
        num_thresholds: number of thresholds, >= 2.
        curve: 'ROC' (true-positive rate over false-positive rate) or 'PR'
            (precision over recall).
        summation_method: 'trapezoidal', 'careful_interpolation' (same as
            trapezoidal for ROC), 'minoring' (lower Riemann bound) or
            'majoring' (upper bound).

    Returns:
        An `AUC` state with four count arrays of shape `[num_thresholds]`.

    Raises:
        TypeError: `num_thresholds` is not an int.
        ValueError: a bad `num_thresholds`, `curve` or `summation_method`;
            shapes do not match; on the host, a label not 0/1 or a
            prediction outside [0, 1] (with nonzero weight). Inside
            `jax.jit`, nonzero labels count as 1, as in TF.

    Example:
        >>> from tpu_estimator import metrics
        >>> state = metrics.auc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8])
        >>> round(state.compute(), 2)
        0.75
    """
    _check_config(num_thresholds, curve, summation_method)
    xp = namespace(labels, predictions, weights)
    labels, predictions = as_arrays(xp, labels, predictions)
    labels, predictions = align(
        labels,
        predictions,
        fn="auc",
        fix="Pass the probability of the positive class, one per label.",
    )
    w = broadcast_weights(xp, weights, tuple(labels.shape), fn="auc")
    check_values(
        xp,
        labels,
        w,
        (labels == 0) | (labels == 1),
        fn="auc",
        name="labels",
        expected="binary labels: 0/1 or bool",
        fix="Give padding examples weight 0, or fix the labels.",
    )
    predictions = predictions.astype(xp.float32)
    check_values(
        xp,
        predictions,
        w,
        (predictions >= 0) & (predictions <= 1),
        fn="auc",
        name="predictions",
        expected="probabilities in [0, 1]",
        fix="Apply a sigmoid (or softmax) to logits first.",
    )
    n = num_thresholds
    # bucket[j] = number of thresholds strictly below the prediction, so the
    # prediction is positive at threshold i exactly when i < bucket[j].
    bucket = xp.searchsorted(xp.asarray(thresholds(n)), predictions.ravel(), side="left")
    bucket = xp.where(xp.isnan(predictions.ravel()), 0, bucket)
    w, pos = w.ravel(), labels.ravel() != 0
    pos_w, neg_w = xp.where(pos, w, 0), xp.where(pos, 0, w)
    if xp is np:
        pos_hist = np.bincount(bucket, weights=pos_w, minlength=n + 1)
        neg_hist = np.bincount(bucket, weights=neg_w, minlength=n + 1)
    else:
        pos_hist = xp.bincount(bucket, weights=pos_w, length=n + 1)
        neg_hist = xp.bincount(bucket, weights=neg_w, length=n + 1)
    below_pos, below_neg = xp.cumsum(pos_hist)[:n], xp.cumsum(neg_hist)[:n]
    above_pos = xp.cumsum(pos_hist[::-1])[::-1][1:]
    above_neg = xp.cumsum(neg_hist[::-1])[::-1][1:]
    return AUC(
        true_positives=above_pos,
        false_positives=above_neg,
        true_negatives=below_neg,
        false_negatives=below_pos,
        num_thresholds=n,
        curve=curve,
        summation_method=summation_method,
    )


def _check_config(num_thresholds: Any, curve: Any, summation_method: Any) -> None:
    fix = "e.g. metrics.auc(labels, probs, num_thresholds=200, curve='ROC')."
    if not is_int(num_thresholds):
        raise TypeError(
            message(
                "`num_thresholds` must be an int >= 2.",
                f"num_thresholds={num_thresholds!r}",
                f"Pass an int, {fix}",
            )
        )
    if num_thresholds < 2:
        raise ValueError(
            message(
                "`num_thresholds` must be an int >= 2.",
                f"num_thresholds={num_thresholds!r}",
                f"Pass at least 2; more thresholds give a closer AUC, {fix}",
            )
        )
    if curve not in get_args(Curve):
        raise ValueError(
            message(
                f"`curve` must be one of {get_args(Curve)}.",
                f"curve={curve!r}",
                "Use curve='ROC' for ROC-AUC or curve='PR' for precision-recall AUC.",
            )
        )
    if summation_method not in get_args(Summation):
        raise ValueError(
            message(
                f"`summation_method` must be one of {get_args(Summation)}.",
                f"summation_method={summation_method!r}",
                "Use 'careful_interpolation' for PR-AUC or 'trapezoidal' (TF's default).",
            )
        )
