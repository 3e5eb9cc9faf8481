"""Every user mistake gets: what was expected, `Received: ...`, then the fix."""

from __future__ import annotations

import numpy as np
import pytest

import tpu_estimator.metrics as metrics


def test_mismatched_label_and_prediction_shapes() -> None:
    with pytest.raises(
        ValueError,
        match=r"`accuracy` expects `labels` and `predictions` of the same shape .*"
        r"Received: labels\.shape=\(4,\), predictions\.shape=\(4, 3\)\. "
        r"For per-class scores, pass their arg max",
    ):
        metrics.accuracy(np.zeros(4), np.zeros((4, 3)))
    for fn in (metrics.precision, metrics.recall, metrics.auc, metrics.mean_squared_error):
        with pytest.raises(ValueError, match=rf"`{fn.__name__}` expects .*same shape"):
            fn(np.zeros(4), np.zeros(5))
    with pytest.raises(ValueError, match=r"`mean_iou` expects .*labels\.shape=\(2, 2\)"):
        metrics.mean_iou(np.zeros((2, 2)), np.zeros((2, 3)), num_classes=3)


def test_weights_that_do_not_broadcast() -> None:
    with pytest.raises(
        ValueError,
        match=r"`accuracy` expects `weights` to be a scalar or broadcastable to labels\.shape.*"
        r"Received: weights\.shape=\(3,\), labels\.shape=\(4,\)\. "
        r"Pass one weight per example \(shape \(4,\)\)",
    ):
        metrics.accuracy(np.zeros(4), np.zeros(4), weights=np.ones(3))
    with pytest.raises(ValueError, match=r"`mean` expects .*values\.shape.*"
                       r"Received: weights\.shape=\(2, 3\), values\.shape=\(2, 2\)"):
        metrics.mean(np.zeros((2, 2)), weights=np.ones((2, 3)))


@pytest.mark.parametrize(
    "fn", [metrics.precision, metrics.recall, metrics.true_positives, metrics.true_negatives]
)
def test_non_binary_labels_or_predictions(fn) -> None:
    with pytest.raises(
        ValueError,
        match=rf"`{fn.__name__}` expects binary predictions: 0/1 or bool\. "
        r"Received: predictions containing \[0\.3, 0\.9\] \(2 entries with nonzero weight\)\. "
        r"Threshold scores first",
    ):
        fn([1, 0, 1], [0.3, 0.9, 1.0])
    with pytest.raises(ValueError, match=r"binary labels.*Received: labels containing \[2\]"):
        fn([2, 0, 1], [1, 0, 1])
    # Non-binary values with weight 0 (padding) are not checked.
    fn([2, 0, 1], [1, 0, 1], weights=[0, 1, 1])


def test_auc_argument_errors() -> None:
    with pytest.raises(ValueError, match=r"`num_thresholds` must be an int >= 2\. "
                       r"Received: num_thresholds=1\. Pass at least 2"):
        metrics.auc([1], [0.5], num_thresholds=1)
    with pytest.raises(TypeError, match=r"Received: num_thresholds=2\.5\. Pass an int"):
        metrics.auc([1], [0.5], num_thresholds=2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"`curve` must be one of \('ROC', 'PR'\)\. "
                       r"Received: curve='roc'\. Use curve='ROC'"):
        metrics.auc([1], [0.5], curve="roc")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"`summation_method` must be one of .*"
                       r"Received: summation_method='simpson'\. Use 'careful_interpolation'"):
        metrics.auc([1], [0.5], summation_method="simpson")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"`auc` expects probabilities in \[0, 1\]\. "
                       r"Received: predictions containing \[-2\.0, 3\.0\].*Apply a sigmoid"):
        metrics.auc([1, 0, 1], [3.0, -2.0, 0.5])
    with pytest.raises(ValueError, match=r"`auc` expects binary labels.*labels containing \[5\]"):
        metrics.auc([5, 0], [0.5, 0.5])


def test_top_k_accuracy_argument_errors() -> None:
    scores = np.full((2, 3), 1 / 3)
    with pytest.raises(ValueError, match=r"`k` must be an int >= 1\. Received: k=0\. Pass k >= 1"):
        metrics.top_k_accuracy([0, 1], scores, k=0)
    with pytest.raises(TypeError, match=r"Received: k=1\.5"):
        metrics.top_k_accuracy([0, 1], scores, k=1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"Received: k=True"):
        metrics.top_k_accuracy([0, 1], scores, k=True)
    with pytest.raises(
        ValueError,
        match=r"expects `predictions` of shape labels\.shape \+ \(num_classes,\).*"
        r"Received: labels\.shape=\(2,\), predictions\.shape=\(2,\)\. "
        r"Pass the logits or probabilities, not their arg max",
    ):
        metrics.top_k_accuracy([0, 1], [0, 1], k=1)
    with pytest.raises(ValueError, match=r"integer class ids in \[0, 3\).*"
                       r"Received: labels containing \[-1, 3\]"):
        metrics.top_k_accuracy([-1, 3], scores, k=1)


def test_mean_iou_argument_errors() -> None:
    with pytest.raises(ValueError, match=r"`num_classes` must be an int >= 2\. "
                       r"Received: num_classes=1\. Pass the number of classes"):
        metrics.mean_iou([0], [0], num_classes=1)
    with pytest.raises(TypeError, match=r"Received: num_classes='3'"):
        metrics.mean_iou([0], [0], num_classes="3")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"`mean_iou` expects class ids in \[0, num_classes=3\)\. "
                       r"Received: predictions containing \[7\].*Raise num_classes"):
        metrics.mean_iou([0, 1], [7, 1], num_classes=3)
