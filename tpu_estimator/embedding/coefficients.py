"""Each id's weight in its example's activation, and each id's gradient: the combiners' maths.

A feature's activation is the sum over its ids of coefficient x row (a sequence
feature keeps one row per position). The coefficients come from the combiner
("sum": the weights; "mean": weights / their sum; "sqrtn": weights / their norm);
each id's gradient is its coefficient x the activation's gradient. Per device,
no collectives: embedding/lookup.py and embedding/fused.py use both.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from tpu_estimator.embedding.config import EmbeddingConfigSpec


def coefficients(spec: EmbeddingConfigSpec, feature: str, ids: Any, weights: Any) -> Any:
    """[B, width] weight of each id in its example's activation (0 for padding)."""
    valid = ids >= 0
    w = jnp.where(valid, 1.0 if weights is None else weights.astype(jnp.float32), 0.0)
    if spec.features[feature].max_sequence_length:
        return w
    combiner = spec.table_of(feature).combiner
    if combiner == "mean":
        total = w.sum(axis=1, keepdims=True)
        return w / jnp.where(total == 0, 1.0, total)
    if combiner == "sqrtn":
        norm = jnp.sqrt((w * w).sum(axis=1, keepdims=True))
        return w / jnp.where(norm == 0, 1.0, norm)
    return w


def id_gradients(
    spec: EmbeddingConfigSpec, feature: str, ids: dict[str, Any], weights: dict[str, Any],
    activation_grads: dict[str, Any], grad_scale: float,
) -> Any:
    """`[ids[feature].size, dim]`: the gradient of each of this replica's id slots (0 for padding)."""
    g = activation_grads[feature].astype(jnp.float32) * grad_scale
    coef = coefficients(spec, feature, ids[feature], weights.get(feature))
    if not spec.features[feature].max_sequence_length:
        g = g[:, None, :]
    return (coef[..., None] * g).reshape(-1, g.shape[-1])


def combine(spec: EmbeddingConfigSpec, feature: str, rows: Any, ids: Any, weights: Any) -> Any:
    """One feature's activations from its ids' rows `[B, width, dim]` (float32): `[B, dim]`,
    or `[B, width, dim]` for a sequence feature."""
    scaled = rows * coefficients(spec, feature, ids, weights)[..., None]
    return scaled if spec.features[feature].max_sequence_length else scaled.sum(axis=1)
