"""Mean intersection-over-union over classes, from a weighted confusion matrix."""

from __future__ import annotations

from typing import Any

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


class MeanIoU(Metric):
    """State of `metrics.mean_iou`: `confusion_matrix[label, prediction]` weights."""

    confusion_matrix: Array
    num_classes: int = struct.field(pytree_node=False)

    def compute(self) -> Scalar:
        """Mean over classes present in labels or predictions of TP / (TP + FP + FN)."""
        xp, s = host_or_traced(self)
        cm = s.confusion_matrix
        tp = xp.diagonal(cm)
        union = cm.sum(axis=0) + cm.sum(axis=1) - tp
        present = union > 0
        iou = div_no_nan(xp, tp, union)
        return to_scalar(xp, div_no_nan(xp, xp.sum(iou), xp.sum(present)))


def mean_iou(
    labels: Any, predictions: Any, num_classes: int, weights: Any = None
) -> MeanIoU:
    """Mean intersection-over-union, like `tf.compat.v1.metrics.mean_iou`.

    For each class c, IoU_c = TP_c / (TP_c + FP_c + FN_c) from the weighted
    confusion matrix of all merged data. The mean runs over the classes that
    occur (with nonzero weight) in the labels or the predictions; absent
    classes are left out, not counted as 0. This equals scikit-learn's
    `jaccard_score(average='macro', labels=<present classes>)`. Result 0.0
    when no class occurs.

    Args:
        labels: integer class ids in [0, num_classes), any shape (flattened).
        predictions: integer class ids, the shape of `labels` (a trailing
            axis of size 1 on either is squeezed).
        num_classes: number of classes, >= 2.
        weights: None (all 1), a scalar, or an array broadcastable to `labels`
            (lower rank aligns with the leading, batch axis). Weight 0
            excludes an element.

    Returns:
        A `MeanIoU` state holding a `[num_classes, num_classes]` confusion matrix.

    Raises:
        TypeError: `num_classes` is not an int.
        ValueError: `num_classes` < 2; shapes do not match; on the host, an id
            with nonzero weight outside [0, num_classes). Inside `jax.jit`
            such elements are dropped.

    Example:
        >>> from tpu_estimator import metrics
        >>> metrics.mean_iou([0, 0, 1, 1], [0, 1, 1, 1], num_classes=2).compute()
        0.5833333333333333
    """
    fix_n = "Pass the number of classes, e.g. metrics.mean_iou(labels, preds, num_classes=21)."
    if not is_int(num_classes):
        raise TypeError(
            message("`num_classes` must be an int >= 2.", f"num_classes={num_classes!r}", fix_n)
        )
    if num_classes < 2:
        raise ValueError(
            message("`num_classes` must be an int >= 2.", f"num_classes={num_classes!r}", fix_n)
        )
    n = int(num_classes)
    xp = namespace(labels, predictions, weights)
    labels, predictions = as_arrays(xp, labels, predictions)
    labels, predictions = align(
        labels,
        predictions,
        fn="mean_iou",
        fix="Pass class ids for both (e.g. predictions = logits.argmax(-1)).",
    )
    w = broadcast_weights(xp, weights, tuple(labels.shape), fn="mean_iou")
    valid = xp.ones(labels.shape, bool)
    for name, x in (("labels", labels), ("predictions", predictions)):
        ok = (x >= 0) & (x < n)
        check_values(
            xp,
            x,
            w,
            ok,
            fn="mean_iou",
            name=name,
            expected=f"class ids in [0, num_classes={n})",
            fix="Raise num_classes, or give those elements weight 0.",
        )
        valid = valid & ok
    index = xp.where(valid, labels * n + predictions, 0).astype(xp.int32).ravel()
    cell_w = xp.where(valid, w, 0).ravel()
    if xp is np:
        flat = np.bincount(index, weights=cell_w, minlength=n * n)
    else:
        flat = xp.bincount(index, weights=cell_w, length=n * n)
    return MeanIoU(confusion_matrix=flat.reshape(n, n), num_classes=n)
