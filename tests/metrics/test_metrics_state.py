"""Metric states as pytrees: merging, stacking, compiled programs, merge errors."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tpu_estimator.metrics as metrics


def _batches(num: int = 4, size: int = 16, seed: int = 0):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, (num, size))
    scores = np.clip(0.3 * labels + 0.7 * rng.random((num, size)), 0, 1).astype(np.float32)
    weights = (rng.random((num, size)) < 0.8).astype(np.float32)
    return labels, scores, weights


def test_state_is_a_pytree_of_statistics_with_static_config() -> None:
    state = metrics.auc([0, 1], [0.2, 0.7], num_thresholds=7, curve="PR")
    leaves, treedef = jax.tree.flatten(state)
    assert len(leaves) == 4 and all(np.shape(x) == (7,) for x in leaves)
    rebuilt = jax.tree.unflatten(treedef, leaves)
    assert type(rebuilt) is metrics.AUC
    assert rebuilt.config() == {
        "num_thresholds": 7,
        "curve": "PR",
        "summation_method": "trapezoidal",
    }
    assert state.describe() == (
        "AUC(num_thresholds=7, curve='PR', summation_method='trapezoidal')"
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.curve = "ROC"  # type: ignore[misc]


def _build(lab, sc, w):
    return {
        "acc": metrics.accuracy(lab, sc > 0.5, w),
        "auc": metrics.auc(lab, sc, w, num_thresholds=20),
    }


def _is_metric(x) -> bool:
    return isinstance(x, metrics.Metric)


def test_compiled_program_returns_states_that_scan_stacks_and_merges() -> None:
    """One jit: per-step states stacked by scan, and states merged in the carry.

    All-zero statistics are the identity of merge, so `jnp.zeros_like` of
    the state's shape is the empty state that starts the carry.
    """
    labels, scores, weights = _batches()

    @jax.jit
    def evaluate(labels, scores, weights):
        def step(carry, batch):
            now = _build(*batch)
            return jax.tree.map(lambda a, b: a.merge(b), carry, now, is_leaf=_is_metric), now

        shapes = jax.eval_shape(_build, labels[0], scores[0], weights[0])
        empty = jax.tree.map(jnp.zeros_like, shapes)
        carry, stacked = jax.lax.scan(step, empty, (labels, scores, weights))
        return carry, stacked, carry["acc"].compute()

    carry, stacked, acc_on_device = evaluate(labels, scores, weights)
    whole = _build(labels.ravel(), scores.ravel(), weights.ravel())
    for name, expected in whole.items():
        assert np.shape(jax.tree.leaves(stacked[name])[0])[0] == 4
        for state in (carry[name], metrics.merge_stacked(stacked[name])):
            assert state.config() == expected.config()
            for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(expected), strict=True):
                np.testing.assert_allclose(a, b, rtol=1e-6)
            assert state.compute() == pytest.approx(expected.compute(), rel=1e-6)
    assert isinstance(acc_on_device, jax.Array) and acc_on_device.shape == ()
    assert float(acc_on_device) == pytest.approx(whole["acc"].compute(), rel=1e-6)


def test_merge_stacked_equals_merge_all_on_the_host() -> None:
    labels, scores, weights = _batches(num=5)
    states = [metrics.auc(labels[i], scores[i], weights[i]) for i in range(5)]
    stacked = jax.tree.map(lambda *xs: np.stack(xs), *states)
    merged = metrics.merge_stacked(stacked)
    expected = metrics.merge_all(states)
    for a, b in zip(jax.tree.leaves(merged), jax.tree.leaves(expected), strict=True):
        assert isinstance(a, np.ndarray)
        np.testing.assert_allclose(a, b, rtol=1e-12)


def test_device_get_and_compute_types() -> None:
    state = jax.jit(lambda l, p: metrics.accuracy(l, p))(jnp.array([1, 2]), jnp.array([1, 0]))
    host = jax.device_get(state)
    assert type(host) is metrics.Accuracy
    assert host.compute() == 0.5 and isinstance(host.compute(), float)
    assert isinstance(state.compute(), float)  # concrete jax arrays compute on the host
    eager = metrics.accuracy(jnp.array([1, 2]), jnp.array([1, 2]))
    assert all(isinstance(x, np.ndarray) for x in jax.tree.leaves(eager))


def test_merging_different_metrics_is_a_type_error() -> None:
    acc = metrics.accuracy([1], [1])
    with pytest.raises(TypeError, match=r"Accuracy.merge expects another Accuracy state.*"
                       r"Received: self=Accuracy\(\), other=Mean\(\)\. Merge the states"):
        acc.merge(metrics.mean([1.0]))
    with pytest.raises(TypeError, match=r"other=dict"):
        acc.merge({"total": 1.0})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"Precision.merge expects another Precision"):
        metrics.merge_all([metrics.precision([1], [1]), metrics.recall([1], [1])])


def test_merging_different_configs_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"same configuration.*Received: self=AUC\("
                       r"num_thresholds=200.*other=AUC\(num_thresholds=100.*same arguments"):
        metrics.auc([1], [0.5]).merge(metrics.auc([1], [0.5], num_thresholds=100))
    with pytest.raises(ValueError, match=r"Received: self=TopKAccuracy\(k=1\), "
                       r"other=TopKAccuracy\(k=2\)"):
        scores = [[0.1, 0.9]]
        metrics.top_k_accuracy([1], scores, k=1).merge(metrics.top_k_accuracy([1], scores, k=2))
    with pytest.raises(ValueError, match=r"MeanIoU\(num_classes=2\).*MeanIoU\(num_classes=3\)"):
        metrics.mean_iou([1], [1], 2).merge(metrics.mean_iou([1], [1], 3))


def test_merging_a_stacked_with_an_unstacked_state_is_a_value_error() -> None:
    states = [metrics.mean([1.0]), metrics.mean([2.0])]
    stacked = jax.tree.map(lambda *xs: np.stack(xs), *states)
    with pytest.raises(ValueError, match=r"equal shapes\. Received: self\.total\.shape=\(2,\), "
                       r"other\.total\.shape=\(\)\. .*merge_stacked\(state\) first"):
        stacked.merge(states[0])


def test_merge_all_and_merge_stacked_argument_errors() -> None:
    with pytest.raises(ValueError, match=r"at least one metric state\. Received: states=\[\]"):
        metrics.merge_all([])
    with pytest.raises(ValueError, match=r"at least one"):
        metrics.Metric.reduce([])
    with pytest.raises(TypeError, match=r"Accuracy\.reduce expects Accuracy states\. "
                       r"Received: a state of type Mean\. Use merge_all"):
        metrics.Accuracy.reduce([metrics.accuracy([1], [1]), metrics.mean([1.0])])
    with pytest.raises(TypeError, match=r"Received: state of type list\. .*merge_all\(states\)"):
        metrics.merge_stacked([metrics.mean([1.0])])  # type: ignore[arg-type]
    with pytest.raises(NotImplementedError, match=r"Metric does not implement compute"):
        metrics.Metric().compute()
