"""Streaming, mergeable evaluation metrics (the `tf.compat.v1.metrics` functions).

Each factory, e.g. `accuracy(labels, predictions, weights=None)`, returns a
`Metric` state: an immutable pytree of additive statistics. `a.merge(b)`
combines two states exactly; `merge_all(states)` a list, `merge_stacked(s)` a
state stacked by `lax.scan`; `.compute()` gives the value. Factories run on
the host with numpy inputs (in `metric_fn`) and inside `jax.jit` with traced
inputs (in `eval_metric_ops`); both kinds of state merge with each other.
"""

from tpu_estimator.metrics._accuracy import Accuracy as Accuracy
from tpu_estimator.metrics._accuracy import TopKAccuracy as TopKAccuracy
from tpu_estimator.metrics._accuracy import accuracy as accuracy
from tpu_estimator.metrics._accuracy import top_k_accuracy as top_k_accuracy
from tpu_estimator.metrics._auc import AUC as AUC
from tpu_estimator.metrics._auc import auc as auc
from tpu_estimator.metrics._base import Metric as Metric
from tpu_estimator.metrics._base import merge_all as merge_all
from tpu_estimator.metrics._base import merge_stacked as merge_stacked
from tpu_estimator.metrics._confusion import FalseNegatives as FalseNegatives
from tpu_estimator.metrics._confusion import FalsePositives as FalsePositives
from tpu_estimator.metrics._confusion import Precision as Precision
from tpu_estimator.metrics._confusion import Recall as Recall
from tpu_estimator.metrics._confusion import TrueNegatives as TrueNegatives
from tpu_estimator.metrics._confusion import TruePositives as TruePositives
from tpu_estimator.metrics._confusion import false_negatives as false_negatives
from tpu_estimator.metrics._confusion import false_positives as false_positives
from tpu_estimator.metrics._confusion import precision as precision
from tpu_estimator.metrics._confusion import recall as recall
from tpu_estimator.metrics._confusion import true_negatives as true_negatives
from tpu_estimator.metrics._confusion import true_positives as true_positives
from tpu_estimator.metrics._iou import MeanIoU as MeanIoU
from tpu_estimator.metrics._iou import mean_iou as mean_iou
from tpu_estimator.metrics._mean import Mean as Mean
from tpu_estimator.metrics._mean import mean as mean
from tpu_estimator.metrics._regression import MeanAbsoluteError as MeanAbsoluteError
from tpu_estimator.metrics._regression import MeanSquaredError as MeanSquaredError
from tpu_estimator.metrics._regression import (
    RootMeanSquaredError as RootMeanSquaredError,
)
from tpu_estimator.metrics._regression import mean_absolute_error as mean_absolute_error
from tpu_estimator.metrics._regression import mean_squared_error as mean_squared_error
from tpu_estimator.metrics._regression import (
    root_mean_squared_error as root_mean_squared_error,
)

__all__ = [
    # base and merging
    "Metric",
    "merge_all",
    "merge_stacked",
    # factories
    "accuracy",
    "auc",
    "false_negatives",
    "false_positives",
    "mean",
    "mean_absolute_error",
    "mean_iou",
    "mean_squared_error",
    "precision",
    "recall",
    "root_mean_squared_error",
    "top_k_accuracy",
    "true_negatives",
    "true_positives",
    # state classes
    "AUC",
    "Accuracy",
    "FalseNegatives",
    "FalsePositives",
    "Mean",
    "MeanAbsoluteError",
    "MeanIoU",
    "MeanSquaredError",
    "Precision",
    "Recall",
    "RootMeanSquaredError",
    "TopKAccuracy",
    "TrueNegatives",
    "TruePositives",
]
