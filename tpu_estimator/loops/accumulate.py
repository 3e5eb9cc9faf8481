"""Gradient accumulation inside a train step (`TPUConfig.gradient_accumulation_steps=k`).

One replica's batch is split into k contiguous micro-batches (micro-batch j
holds examples j*m .. (j+1)*m - 1, m = batch / k); a `lax.scan` over them
computes each one's gradients and sums them in float32; the step then applies
their mean once. Only one micro-batch's activations are alive at a time.

What model_fn's other outputs become over the k micro-batches:

* the loss: the mean of the micro-batches' losses;
* mutable collections (`batch_stats`): carried from one micro-batch to the
  next (each micro-batch's forward pass sees the statistics the previous one
  left, as k small steps would);
* `host_call` tensors: concatenated over the micro-batches on axis 0 (a
  batch-major tensor is the whole batch's; a tensor of shape [1] becomes [k]);
* summaries: scalars averaged over the micro-batches, histograms and images
  those of the last micro-batch;
* the gradients of components' activations (the embedding tables'):
  concatenated, divided by k (the gradient of the mean of the micro-batches'
  losses).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax import lax

from tpu_estimator.api.checks import message

GradFn = Callable[..., Any]  # value_and_grad(loss_fn, argnums=(0, 1), has_aux=True)


def micro_batch_size(batch: int, k: int) -> int:
    """`batch / k`, or a ValueError naming gradient_accumulation_steps."""
    if batch % k:
        divisors = [d for d in range(1, batch + 1) if batch % d == 0]
        raise ValueError(
            message(
                "The per-replica batch must be divisible by `gradient_accumulation_steps`.",
                f"gradient_accumulation_steps={k} with a per-replica batch of {batch}",
                f"Use one of {divisors} for gradient_accumulation_steps, or a batch size "
                "that it divides.",
            )
        )
    return batch // k


def _split(x: Any, k: int, axis: int) -> jax.Array:
    """[..., B, ...] (B on `axis`) -> [k, ..., B/k, ...]."""
    x = jnp.asarray(x)
    m = micro_batch_size(x.shape[axis], k)
    x = x.reshape(x.shape[:axis] + (k, m) + x.shape[axis + 1:])
    return jnp.moveaxis(x, axis, 0)


def _merge(x: jax.Array) -> jax.Array:
    """[k, m, ...] -> [k*m, ...] (micro-batches concatenated on axis 0)."""
    return x.reshape((x.shape[0] * x.shape[1],) + x.shape[2:]) if x.ndim >= 2 else x


def split_batch(batch: tuple[Any, Any], k: int, batch_axes: Any = None) -> tuple[Any, Any]:
    """(features, labels) as k stacked micro-batches, each leaf split on its batch axis."""
    if batch_axes is None:
        return jax.tree.map(lambda x: _split(x, k, 0), batch)
    axes = list(batch_axes)
    if isinstance(axes[0], dict) and isinstance(batch[0], dict):  # a component's inputs (ids) left the features
        axes[0] = {name: axes[0][name] for name in batch[0]}
    return jax.tree.map(lambda ax, x: _split(x, k, int(ax)), tuple(axes), tuple(batch))


def accumulate(
    grad_fn: GradFn,
    k: int,
    params: Any,
    acts: dict[str, Any],
    batch: tuple[Any, Any],
    collections: dict[str, Any],
    rng: jax.Array,
    batch_axes: Any = None,
) -> tuple[Any, Any, Any, Any, Any, Any]:
    """(loss, collections, host_call tensors, summaries, grads, act_grads) of one replica's
    batch, over k micro-batches (see the module docstring). k == 1: one call of `grad_fn`.

    `grad_fn(params, acts, features, labels, collections, rng)` returns
    `((scaled loss, (loss, mutated, host_tensors, summaries)), (grads, act_grads))`.
    """
    features, labels = batch
    if k == 1:
        (_, (loss, mutated, host, summaries)), (grads, act_grads) = grad_fn(
            params, acts, features, labels, collections, rng
        )
        return loss, mutated, host, summaries, grads, act_grads
    micro = split_batch(batch, k, batch_axes)
    micro_acts = jax.tree.map(lambda x: _split(x, k, 0), acts)

    def one(carry: Any, xs: Any) -> Any:
        total, colls = carry
        j, (f, l), a = xs
        (_, (loss, mutated, host, summaries)), (g, ag) = grad_fn(params, a, f, l, colls, jax.random.fold_in(rng, j))
        total = jax.tree.map(lambda s, x: s + x.astype(jnp.float32), total, g)
        colls = {**colls, **{n: _like(colls[n], t) for n, t in dict(mutated).items()}}
        return (total, colls), (loss, host, summaries, ag)

    zeros = jax.tree.map(lambda p: jnp.zeros(jnp.shape(p), jnp.float32), params)
    (total, colls), (losses, host, summaries, act_grads) = lax.scan(
        one, (zeros, dict(collections)), (jnp.arange(k), micro, micro_acts)
    )
    grads = jax.tree.map(lambda s, p: (s / k).astype(jnp.result_type(p)), total, params)
    act_grads = jax.tree.map(lambda g: _merge(g) / k, act_grads)
    summaries = {
        kind: {name: (v.mean(0) if kind == "scalar" else v[-1]) for name, v in values.items()}
        for kind, values in summaries.items()
    }
    return jnp.mean(losses), colls, jax.tree.map(_merge, host), summaries, grads, act_grads


def _like(old: Any, new: Any) -> Any:
    """`new` in the tree structure and dtypes of `old` (a scan carries one structure)."""
    leaves = jax.tree.leaves(new)
    return jax.tree.unflatten(
        jax.tree.structure(old), [x.astype(o.dtype) for x, o in zip(leaves, jax.tree.leaves(old))]
    )
