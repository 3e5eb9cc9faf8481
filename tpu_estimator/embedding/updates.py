"""The embedding optimizers' update rules on gathered rows: pure functions, no sharding.

`update(params, rows, slots, grads, step)` takes the rows a step touched (and
their slots), with each row's gradient already summed over duplicate ids, and
returns the new rows and slots. The order is the original's:

1. gradient: times `experimental_gradient_multiplier_fn(step)`, then clipped
   to `clipping_limit` and `[clip_gradient_min, clip_gradient_max]`;
2. decoupled weight decay (`w -= factor * w`, the factor times the learning rate
   with `multiply_weight_decay_factor_by_learning_rate`), before the update as in
   TF's DecoupledWeightDecayExtension;
3. the optimizer's rule (see each `*Parameters` docstring);
4. the new weights clipped to `[clip_weight_min, clip_weight_max]`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax.numpy as jnp

from tpu_estimator.embedding.config import EmbeddingConfigSpec
from tpu_estimator.embedding.optimizers import (
    AdagradParameters,
    AdamParameters,
    FtrlParameters,
    StochasticGradientDescentParameters,
)

Slots = dict[str, Any]


def slot_initial_values(params: Any) -> dict[str, float]:
    """Slot name -> the value every row of that slot starts at."""
    if isinstance(params, AdagradParameters):
        return {"accumulator": params.initial_accumulator}
    if isinstance(params, AdamParameters):
        return {"m": 0.0, "v": 0.0}
    if isinstance(params, FtrlParameters):
        return {"accumulator": params.initial_accumulator_value, "linear": params.initial_linear_value}
    return {}


def learning_rate(params: Any, step: Any) -> Any:
    lr = params.learning_rate
    return lr(step) if callable(lr) else lr


def prepare_gradients(
    params: Any, grads: Any, step: Any, *, clipping_limit: float | None = None,
    multiplier_fn: Callable[[Any], Any] | None = None,
) -> Any:
    """Step 1: the multiplier, then `clipping_limit` and the optimizer's gradient limits."""
    if multiplier_fn is not None:
        grads = grads * jnp.asarray(multiplier_fn(step), grads.dtype)
    if clipping_limit is not None:
        grads = jnp.clip(grads, -clipping_limit, clipping_limit)
    if params.clip_gradient_min is not None or params.clip_gradient_max is not None:
        grads = jnp.clip(grads, params.clip_gradient_min, params.clip_gradient_max)
    return grads


def update(
    params: Any, rows: Any, slots: Slots, grads: Any, step: Any, lr: Any = None
) -> tuple[Any, Slots]:
    """Steps 2-4 on `rows` [M, dim] with `grads` [M, dim] (prepared); slots the same shape.
    `lr`: the table's own learning rate (`TableConfig.learning_rate_at`), else the optimizer's."""
    if lr is None:
        lr = learning_rate(params, step)
    if params.weight_decay_factor:
        factor = params.weight_decay_factor
        if params.multiply_weight_decay_factor_by_learning_rate:
            factor = factor * lr
        rows = rows - factor * rows
    new_rows, new_slots = _RULES[type(params)](params, lr, rows, slots, grads)
    if params.clip_weight_min is not None or params.clip_weight_max is not None:
        new_rows = jnp.clip(new_rows, params.clip_weight_min, params.clip_weight_max)
    return new_rows, new_slots


def _sgd(params: StochasticGradientDescentParameters, lr: Any, w: Any, slots: Slots, g: Any) -> tuple[Any, Slots]:
    return w - lr * g, {}


def _adagrad(params: AdagradParameters, lr: Any, w: Any, slots: Slots, g: Any) -> tuple[Any, Slots]:
    acc = slots["accumulator"] + g * g
    return w - lr * g / jnp.sqrt(acc), {"accumulator": acc}


def _adam(params: AdamParameters, lr: Any, w: Any, slots: Slots, g: Any) -> tuple[Any, Slots]:
    m = params.beta1 * slots["m"] + (1.0 - params.beta1) * g
    v = params.beta2 * slots["v"] + (1.0 - params.beta2) * g * g
    if params.sum_inside_sqrt:
        denom = jnp.sqrt(v + params.epsilon**2)
    else:
        denom = jnp.sqrt(v) + params.epsilon
    return w - lr * m / denom, {"m": m, "v": v}


def _ftrl(params: FtrlParameters, lr: Any, w: Any, slots: Slots, g: Any) -> tuple[Any, Slots]:
    p = params.learning_rate_power
    acc = slots["accumulator"]
    new_acc = acc + g * g
    linear = slots["linear"] + g - (new_acc ** (-p) - acc ** (-p)) / lr * w
    quadratic = new_acc ** (-p) / lr + 2.0 * params.l2_regularization_strength
    l1 = params.l1_regularization_strength
    new_w = jnp.where(jnp.abs(linear) > l1, (jnp.sign(linear) * l1 - linear) / quadratic, 0.0)
    return new_w.astype(w.dtype), {"accumulator": new_acc, "linear": linear}


_RULES: dict[type, Callable[..., tuple[Any, Slots]]] = {
    StochasticGradientDescentParameters: _sgd,
    AdagradParameters: _adagrad,
    AdamParameters: _adam,
    FtrlParameters: _ftrl,
}


def zero_gradient_keeps_rows(spec: EmbeddingConfigSpec) -> bool:
    """Whether `spec`'s optimizer leaves a row and its slots exactly as they are when the row's
    gradient is 0, so that updating every row with the dense gradient (0 where no id looked the
    row up) equals the lazy update of the rows looked up, with no mask of the rows touched.

    True for SGD (`w - lr * 0 = w`) and Adagrad (`acc + 0 * 0 = acc`, `w - lr * 0 / sqrt(acc)
    = w`; acc >= initial_accumulator > 0), unless something moves rows on a zero gradient:
    weight decay, weight clipping (a row outside the limits would be clipped), a gradient
    clip interval without 0 (`clip_gradient_min > 0` or `clip_gradient_max < 0` turns 0 into
    a limit), a gradient multiplier (kept lazy: a user function). False for FTRL (the new
    weight is recomputed from the slots: `linear` = 0 gives w = 0, not the initial value) and
    Adam (the moments decay). Assumes a finite learning rate (an infinite one makes the rows
    looked up NaN either way).
    """
    opt = spec.optimization_parameters
    if not isinstance(opt, (StochasticGradientDescentParameters, AdagradParameters)):
        return False
    moves_rows = (
        bool(opt.weight_decay_factor)
        or opt.clip_weight_min is not None
        or opt.clip_weight_max is not None
        or (opt.clip_gradient_min is not None and opt.clip_gradient_min > 0)
        or (opt.clip_gradient_max is not None and opt.clip_gradient_max < 0)
        or spec.experimental_gradient_multiplier_fn is not None
    )
    return not moves_rows


@dataclasses.dataclass(frozen=True)
class TableRule:
    """The embedding optimizer of one table at one step, on a device's block."""

    spec: EmbeddingConfigSpec
    table: str
    step: Any

    def _update(self, rows: Any, slots: Any, grads: Any) -> tuple[Any, Any]:
        opt, spec = self.spec.optimization_parameters, self.spec
        grads = prepare_gradients(
            opt, grads, self.step, clipping_limit=spec.clipping_limit,
            multiplier_fn=spec.experimental_gradient_multiplier_fn,
        )
        lr = spec.tables[self.table].learning_rate_at(self.step)  # None: the optimizer's
        return update(opt, rows, slots, grads, self.step, lr)

    @property
    def lazy(self) -> bool:
        opt = self.spec.optimization_parameters
        return not (isinstance(opt, AdamParameters) and not opt.lazy_adam)

    def rows(self, local: Any, local_slots: Any, unique: Any, grads: Any) -> tuple[Any, Any]:
        """Updated block from the summed gradients `grads` [M, dim] of local rows `unique` [M]
        (padded with the out-of-range `rows_per_shard`)."""
        if not self.lazy:
            dense = jnp.zeros(local.shape, jnp.float32).at[unique].add(grads, mode="drop")
            return self.dense(local, local_slots, dense, None)
        # the pads read as 0 (slots as 1, so no rule divides by 0) and are never written back
        def take(a: Any, fill: float) -> Any:
            return a.at[unique].get(mode="fill", fill_value=fill).astype(jnp.float32)

        rows, row_slots = take(local, 0.0), {k: take(v, 1.0) for k, v in local_slots.items()}
        new_rows, new_s = self._update(rows, row_slots, grads)
        table = local.at[unique].set(new_rows.astype(local.dtype), mode="drop")
        slots = {
            k: local_slots[k].at[unique].set(v.astype(local_slots[k].dtype), mode="drop") for k, v in new_s.items()
        }
        return table, slots

    def dense(self, local: Any, local_slots: Any, dense: Any, touched: Any) -> tuple[Any, Any]:
        """Updated block from the gradient of every local row `dense`; lazy rules keep the rows
        not `touched` (non-lazy Adam updates all)."""
        f32 = {k: v.astype(jnp.float32) for k, v in local_slots.items()}
        new_rows, new_s = self._update(local.astype(jnp.float32), f32, dense)
        if self.lazy and touched is not None:
            keep = touched[:, None]
            new_rows = jnp.where(keep, new_rows, local)
            new_s = {k: jnp.where(keep, v, local_slots[k]) for k, v in new_s.items()}
        return new_rows.astype(local.dtype), {k: v.astype(local_slots[k].dtype) for k, v in new_s.items()}
