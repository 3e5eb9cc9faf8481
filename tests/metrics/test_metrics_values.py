"""Metric values against scikit-learn, merged uneven batches, zero weights, jit."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sklearn import metrics as skm

import tpu_estimator.metrics as metrics

N = 1200
C = 6  # classes for the multi-class cases


@dataclasses.dataclass(frozen=True)
class Case:
    """A metric, its inputs (batch-major, first axis N), and a reference value."""

    name: str
    build: Callable[..., metrics.Metric]  # build(**inputs, weights=w) -> state
    inputs: Callable[[np.random.Generator], dict[str, np.ndarray]]
    reference: Callable[..., float]  # reference(**inputs, weights=w) -> value
    atol: float = 1e-9


def _binary(rng):
    labels = rng.integers(0, 2, N)
    return {"labels": labels, "predictions": (rng.random(N) < 0.3 + 0.4 * labels).astype(int)}


def _classes(rng):
    labels = rng.integers(0, C, N)
    noisy = np.where(rng.random(N) < 0.6, labels, rng.integers(0, C, N))
    return {"labels": labels, "predictions": noisy}


def _scores(rng):
    labels = rng.integers(0, 2, N)
    return {"labels": labels, "predictions": np.clip(0.25 * labels + 0.75 * rng.random(N), 0, 1)}


def _logits(rng):
    return {"labels": rng.integers(0, C, N), "predictions": rng.normal(size=(N, C))}


def _regression(rng):
    labels = rng.normal(size=(N, 2))
    return {"labels": labels, "predictions": labels + rng.normal(size=(N, 2))}


def _present(labels, predictions, weights):
    keep = weights != 0
    return np.union1d(labels[keep], predictions[keep])


def _confusion(labels, predictions, weights):
    return skm.confusion_matrix(labels, predictions, labels=[0, 1], sample_weight=weights)


CASES = [
    Case(
        "mean",
        lambda values, weights: metrics.mean(values, weights),
        lambda rng: {"values": rng.normal(size=(N, 3))},
        # per-example weights [N] broadcast over the trailing axis.
        lambda values, weights: np.average(values, weights=np.repeat(weights[:, None], 3, 1)),
    ),
    Case(
        "accuracy",
        metrics.accuracy,
        _classes,
        lambda labels, predictions, weights: skm.accuracy_score(
            labels, predictions, sample_weight=weights
        ),
    ),
    Case(
        "precision",
        metrics.precision,
        _binary,
        lambda labels, predictions, weights: skm.precision_score(
            labels, predictions, sample_weight=weights
        ),
    ),
    Case(
        "recall",
        metrics.recall,
        _binary,
        lambda labels, predictions, weights: skm.recall_score(
            labels, predictions, sample_weight=weights
        ),
    ),
    Case("true_positives", metrics.true_positives, _binary, lambda **a: _confusion(**a)[1, 1]),
    Case("false_positives", metrics.false_positives, _binary, lambda **a: _confusion(**a)[0, 1]),
    Case("false_negatives", metrics.false_negatives, _binary, lambda **a: _confusion(**a)[1, 0]),
    Case("true_negatives", metrics.true_negatives, _binary, lambda **a: _confusion(**a)[0, 0]),
    Case(
        "auc_roc",
        lambda labels, predictions, weights: metrics.auc(
            labels, predictions, weights, num_thresholds=1000
        ),
        _scores,
        lambda labels, predictions, weights: skm.roc_auc_score(
            labels, predictions, sample_weight=weights
        ),
        atol=2e-3,  # thresholded approximation
    ),
    Case(
        "auc_pr",
        lambda labels, predictions, weights: metrics.auc(
            labels,
            predictions,
            weights,
            num_thresholds=1000,
            curve="PR",
            summation_method="careful_interpolation",
        ),
        _scores,
        lambda labels, predictions, weights: skm.average_precision_score(
            labels, predictions, sample_weight=weights
        ),
        atol=2e-3,
    ),
    Case(
        "mean_squared_error",
        metrics.mean_squared_error,
        _regression,
        lambda labels, predictions, weights: skm.mean_squared_error(
            labels, predictions, sample_weight=weights
        ),
    ),
    Case(
        "root_mean_squared_error",
        metrics.root_mean_squared_error,
        _regression,
        # TF's RMSE is sqrt of the MSE over all elements; sklearn's multi-output
        # RMSE would average per-output RMSEs instead.
        lambda labels, predictions, weights: np.sqrt(
            skm.mean_squared_error(labels, predictions, sample_weight=weights)
        ),
    ),
    Case(
        "mean_absolute_error",
        metrics.mean_absolute_error,
        _regression,
        lambda labels, predictions, weights: skm.mean_absolute_error(
            labels, predictions, sample_weight=weights
        ),
    ),
    Case(
        "top_k_accuracy",
        lambda labels, predictions, weights: metrics.top_k_accuracy(
            labels, predictions, k=3, weights=weights
        ),
        _logits,
        lambda labels, predictions, weights: skm.top_k_accuracy_score(
            labels, predictions, k=3, labels=np.arange(C), sample_weight=weights
        ),
    ),
    Case(
        "mean_iou",
        lambda labels, predictions, weights: metrics.mean_iou(
            labels, predictions, num_classes=C + 2, weights=weights
        ),
        _classes,  # classes C and C+1 never occur: left out of the mean, as in TF
        lambda labels, predictions, weights: skm.jaccard_score(
            labels,
            predictions,
            average="macro",
            labels=_present(labels, predictions, weights),
            sample_weight=weights,
        ),
    ),
]
IDS = [c.name for c in CASES]


def _weights(rng: np.random.Generator) -> np.ndarray:
    w = rng.uniform(0.0, 2.0, N)
    w[rng.random(N) < 0.15] = 0.0
    return w


def _data(case: Case, seed: int = 0) -> tuple[dict[str, np.ndarray], np.ndarray]:
    rng = np.random.default_rng(seed)
    return case.inputs(rng), _weights(rng)


def _take(inputs: dict[str, np.ndarray], index: Any) -> dict[str, np.ndarray]:
    return {k: v[index] for k, v in inputs.items()}


def _assert_states_close(a: metrics.Metric, b: metrics.Metric, rtol: float) -> None:
    assert type(a) is type(b) and a.config() == b.config()
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=1e-6)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_matches_sklearn_with_sample_weights(case: Case) -> None:
    inputs, w = _data(case)
    value = case.build(**inputs, weights=w).compute()
    assert isinstance(value, float)
    assert value == pytest.approx(case.reference(**inputs, weights=w), abs=case.atol)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_uneven_batches_merged_in_random_order_equal_all_at_once(case: Case) -> None:
    inputs, w = _data(case, seed=1)
    rng = np.random.default_rng(2)
    cuts = np.sort(rng.choice(np.arange(1, N), size=11, replace=False))
    bounds = list(zip([0, *cuts], [*cuts, N]))
    states = [case.build(**_take(inputs, slice(a, b)), weights=w[a:b]) for a, b in bounds]
    order = rng.permutation(len(states))
    merged = metrics.merge_all([states[i] for i in order])
    whole = case.build(**inputs, weights=w)
    _assert_states_close(merged, whole, rtol=1e-12)
    assert merged.compute() == pytest.approx(whole.compute(), rel=1e-9, abs=1e-12)
    # Associativity: a different grouping gives the same state.
    left = metrics.Metric.reduce([metrics.merge_all(states[:5]), metrics.merge_all(states[5:])])
    _assert_states_close(left, whole, rtol=1e-12)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_zero_weight_examples_are_excluded_exactly(case: Case) -> None:
    inputs, w = _data(case, seed=3)
    keep = w != 0
    with_zeros = case.build(**inputs, weights=w)
    without = case.build(**_take(inputs, keep), weights=w[keep])
    _assert_states_close(with_zeros, without, rtol=1e-12)
    # Scalar weights and weights=None agree with all-ones weights.
    ones = case.build(**inputs, weights=np.ones(N))
    _assert_states_close(case.build(**inputs, weights=None), ones, rtol=0)
    _assert_states_close(case.build(**inputs, weights=1.0), ones, rtol=0)


def test_zero_weight_padding_may_hold_invalid_values() -> None:
    """Padding of a short final batch can be anything: NaN scores, label -1."""
    labels = np.array([1, 0, 1, -1, -1])
    scores = np.array([0.9, 0.2, 0.4, np.nan, 7.0])
    w = np.array([1.0, 1.0, 1.0, 0.0, 0.0])
    real = slice(0, 3)
    pairs = [
        (metrics.mean(scores, w), metrics.mean(scores[real])),
        (metrics.auc(labels, scores, w), metrics.auc(labels[real], scores[real])),
        (
            metrics.mean_iou(labels, labels, 2, w),
            metrics.mean_iou(labels[real], labels[real], 2),
        ),
        (
            metrics.top_k_accuracy(labels, np.eye(2)[[1, 0, 0, 0, 0]], k=1, weights=w),
            metrics.top_k_accuracy(labels[real], np.eye(2)[[1, 0, 0]], k=1),
        ),
        (metrics.precision(labels, labels, w), metrics.precision(labels[real], labels[real])),
    ]
    for padded, exact in pairs:
        _assert_states_close(padded, exact, rtol=0)


def test_auc_counts_match_tf_thresholding_exactly() -> None:
    """The histogram equals TF's tiled `prediction > threshold` comparison."""
    rng = np.random.default_rng(4)
    labels = rng.integers(0, 2, 500)
    n = 50
    # Include values exactly on thresholds and at 0 and 1.
    scores = np.concatenate([rng.random(480), np.arange(20) / (n - 1)])[rng.permutation(500)]
    scores[:2] = [0.0, 1.0]
    w = _weights(rng)[:500]
    thresholds = np.array(
        [-1e-7] + [(i + 1) / (n - 1) for i in range(n - 2)] + [1 + 1e-7], np.float32
    )
    positive = scores.astype(np.float32)[None, :] > thresholds[:, None]
    is_pos = labels[None, :] == 1
    expected = {
        "true_positives": (positive & is_pos) @ w,
        "false_positives": (positive & ~is_pos) @ w,
        "false_negatives": (~positive & is_pos) @ w,
        "true_negatives": (~positive & ~is_pos) @ w,
    }
    state = metrics.auc(labels, scores, w, num_thresholds=n)
    for name, value in expected.items():
        np.testing.assert_allclose(getattr(state, name), value, rtol=1e-12)


def test_auc_summation_methods_bound_each_other() -> None:
    inputs, w = _data(CASES[IDS.index("auc_roc")])
    values = {
        method: metrics.auc(**inputs, weights=w, num_thresholds=50, summation_method=method)
        .compute()
        for method in ("minoring", "trapezoidal", "majoring")
    }
    assert values["minoring"] < values["trapezoidal"] < values["majoring"]
    pr = metrics.auc(**inputs, weights=w, num_thresholds=1000, curve="PR").compute()
    precision, recall, _ = skm.precision_recall_curve(
        inputs["labels"], inputs["predictions"], sample_weight=w
    )
    assert pr == pytest.approx(skm.auc(recall, precision), abs=2e-3)


def test_empty_and_all_zero_weights_compute_to_zero() -> None:
    assert metrics.mean(np.zeros(0)).compute() == 0.0
    assert metrics.accuracy([1, 2], [1, 2], weights=0.0).compute() == 0.0
    assert metrics.precision([0, 0], [0, 0]).compute() == 0.0
    assert metrics.recall([0, 0], [1, 1]).compute() == 0.0
    assert metrics.mean_iou([0], [0], 3, weights=[0]).compute() == 0.0
    assert metrics.root_mean_squared_error([1.0], [2.0], weights=[0]).compute() == 0.0


def test_squeezable_trailing_axis_and_leading_weights() -> None:
    labels, preds = np.array([[1], [0], [2]]), np.array([1, 1, 2])
    assert metrics.accuracy(labels, preds).compute() == pytest.approx(2 / 3)
    assert metrics.accuracy(preds, labels, weights=[[1], [0], [1]]).compute() == 1.0
    # Per-example weights for per-element values align with the batch axis.
    values = np.array([[1.0, 3.0], [10.0, 10.0]])
    assert metrics.mean(values, weights=[1, 0]).compute() == 2.0
    assert metrics.top_k_accuracy([[0], [1]], [[0.9, 0.1], [0.8, 0.2]], k=1).compute() == 0.5


def test_top_k_ties_count_as_hits_like_in_top_k() -> None:
    scores = [[0.5, 0.5, 0.5, 0.1], [0.2, 0.9, 0.9, 0.9]]
    assert metrics.top_k_accuracy([2, 0], scores, k=1).compute() == 0.5
    # A NaN score is never higher than another; a NaN true-class score misses.
    assert metrics.top_k_accuracy([1, 0], [[np.nan, 0, np.nan, 0]] * 2, k=1).compute() == 0.5


@pytest.fixture(scope="module")
def jit_states() -> dict[str, tuple[metrics.Metric, metrics.Metric]]:
    """(jit state, numpy state) for every case, from one compiled program."""
    data = {c.name: _data(c, seed=5) for c in CASES}

    def build_all(d):
        return {c.name: c.build(**d[c.name][0], weights=d[c.name][1]) for c in CASES}

    traced = jax.jit(build_all)(jax.tree.map(jnp.asarray, data))
    host = build_all(data)
    return {c.name: (traced[c.name], host[c.name]) for c in CASES}


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_jit_state_equals_numpy_state_and_merges_with_it(case: Case, jit_states) -> None:
    traced, host = jit_states[case.name]
    assert isinstance(jax.tree.leaves(traced)[0], jax.Array)
    _assert_states_close(traced, host, rtol=1e-5)  # float32 on device, float64 on host
    assert traced.compute() == pytest.approx(host.compute(), rel=1e-4, abs=1e-5)
    both = traced.merge(host)
    assert all(isinstance(x, np.ndarray) for x in jax.tree.leaves(both))
    _assert_states_close(both, host.merge(host), rtol=1e-5)
    _assert_states_close(host.merge(traced), both, rtol=0)
