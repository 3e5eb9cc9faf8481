"""The embedding optimizers' parameters: the original's `tf.tpu.experimental.*Parameters`.

Tables are not trained by `train_op` (optax) but by one of these, applied lazily
to the rows a step looked up (embedding/updates.py holds the maths). The
arguments and defaults are the original's (tensorflow/python/tpu/tpu_embedding.py),
plus `clip_gradient_min`/`clip_gradient_max` of its later releases.

`use_gradient_accumulation` is accepted for compatibility: the gradients of one
step are always summed per row exactly (in the table's dtype) before one update,
which is what the original's accumulation gave.
"""

from __future__ import annotations

import numbers
from typing import Any, Callable, Union

from tpu_estimator.api.checks import message
from tpu_estimator.api.keywords import suggest_keywords

LearningRate = Union[float, Callable[[Any], Any]]


def _number(value: Any, name: str, owner: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(message(f"`{owner}({name}=...)` must be a number.", f"{name}={value!r}"))
    return float(value)


def _optional_number(value: Any, name: str, owner: str) -> float | None:
    return None if value is None else _number(value, name, owner)


class _OptimizationParameters:
    """What every embedding optimizer shares: learning rate, clipping, weight decay.

    `learning_rate` is a number or a function of the global step (an int32
    scalar inside the compiled step) returning one.
    """

    def __init__(
        self,
        learning_rate: LearningRate,
        use_gradient_accumulation: bool,
        clip_weight_min: float | None,
        clip_weight_max: float | None,
        weight_decay_factor: float | None,
        multiply_weight_decay_factor_by_learning_rate: bool | None,
        clip_gradient_min: float | None,
        clip_gradient_max: float | None,
    ) -> None:
        owner = type(self).__name__
        if not callable(learning_rate):
            learning_rate = _number(learning_rate, "learning_rate", owner)
        self.learning_rate = learning_rate
        self.use_gradient_accumulation = bool(use_gradient_accumulation)
        self.clip_weight_min = _optional_number(clip_weight_min, "clip_weight_min", owner)
        self.clip_weight_max = _optional_number(clip_weight_max, "clip_weight_max", owner)
        self.weight_decay_factor = _optional_number(weight_decay_factor, "weight_decay_factor", owner)
        self.multiply_weight_decay_factor_by_learning_rate = bool(
            multiply_weight_decay_factor_by_learning_rate
        )
        self.clip_gradient_min = _optional_number(clip_gradient_min, "clip_gradient_min", owner)
        self.clip_gradient_max = _optional_number(clip_gradient_max, "clip_gradient_max", owner)
        for low, high in (("clip_weight_min", "clip_weight_max"), ("clip_gradient_min", "clip_gradient_max")):
            lo, hi = getattr(self, low), getattr(self, high)
            if lo is not None and hi is not None and lo > hi:
                raise ValueError(
                    message(
                        f"`{owner}`'s `{low}` must not exceed `{high}`.",
                        f"{low}={lo}, {high}={hi}",
                        "Swap them, or leave one None (no limit on that side).",
                    )
                )

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other: Any) -> bool:
        return type(other) is type(self) and vars(other) == vars(self)

    def __hash__(self) -> int:
        return hash((type(self).__name__, repr(self)))


@suggest_keywords
class AdagradParameters(_OptimizationParameters):
    """Adagrad for embedding tables: `acc += g**2; w -= lr * g / sqrt(acc)`.

    Example:
      >>> from tpu_estimator.embedding import AdagradParameters
      >>> AdagradParameters(0.1).initial_accumulator
      0.1
    """

    def __init__(
        self,
        learning_rate: LearningRate,
        initial_accumulator: float = 0.1,
        use_gradient_accumulation: bool = True,
        clip_weight_min: float | None = None,
        clip_weight_max: float | None = None,
        weight_decay_factor: float | None = None,
        multiply_weight_decay_factor_by_learning_rate: bool | None = None,
        clip_gradient_min: float | None = None,
        clip_gradient_max: float | None = None,
    ) -> None:
        super().__init__(
            learning_rate, use_gradient_accumulation, clip_weight_min, clip_weight_max,
            weight_decay_factor, multiply_weight_decay_factor_by_learning_rate,
            clip_gradient_min, clip_gradient_max,
        )
        initial_accumulator = _number(initial_accumulator, "initial_accumulator", "AdagradParameters")
        if initial_accumulator <= 0:
            raise ValueError(
                message(
                    "Adagrad's `initial_accumulator` must be positive.",
                    f"initial_accumulator={initial_accumulator}",
                    "Use a small positive value such as 0.1 (the default).",
                )
            )
        self.initial_accumulator = initial_accumulator


@suggest_keywords
class AdamParameters(_OptimizationParameters):
    """Adam for embedding tables, lazy by default (the original's `lazy_adam=True`).

    `m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g**2`; then
    `w -= lr * m / sqrt(v + eps**2)` (`sum_inside_sqrt`, the default) or
    `w -= lr * m / (sqrt(v) + eps)`. As in the original there is no bias
    correction: pass a `learning_rate` function of the step for one. Lazy Adam
    updates only the rows looked up in the step; `lazy_adam=False` decays the
    moments of, and moves, every row.
    """

    def __init__(
        self,
        learning_rate: LearningRate,
        beta1: float = 0.9,
        beta2: float = 0.999,
        epsilon: float = 1e-08,
        lazy_adam: bool = True,
        sum_inside_sqrt: bool = True,
        use_gradient_accumulation: bool = True,
        clip_weight_min: float | None = None,
        clip_weight_max: float | None = None,
        weight_decay_factor: float | None = None,
        multiply_weight_decay_factor_by_learning_rate: bool | None = None,
        clip_gradient_min: float | None = None,
        clip_gradient_max: float | None = None,
    ) -> None:
        super().__init__(
            learning_rate, use_gradient_accumulation, clip_weight_min, clip_weight_max,
            weight_decay_factor, multiply_weight_decay_factor_by_learning_rate,
            clip_gradient_min, clip_gradient_max,
        )
        for name, value in (("beta1", beta1), ("beta2", beta2)):
            value = _number(value, name, "AdamParameters")
            if not 0.0 <= value < 1.0:
                raise ValueError(
                    message(
                        f"Adam's `{name}` must be in [0, 1).", f"{name}={value}",
                        "The default is 0.9 for beta1, 0.999 for beta2.",
                    )
                )
        epsilon = _number(epsilon, "epsilon", "AdamParameters")
        if epsilon <= 0:
            raise ValueError(
                message("Adam's `epsilon` must be positive.", f"epsilon={epsilon}", "The default is 1e-08.")
            )
        if not use_gradient_accumulation and not lazy_adam:
            raise ValueError(
                message(
                    "When disabling lazy Adam, gradient accumulation must be used.",
                    "lazy_adam=False, use_gradient_accumulation=False",
                    "Set use_gradient_accumulation=True.",
                )
            )
        self.beta1 = float(beta1)
        self.beta2 = float(beta2)
        self.epsilon = epsilon
        self.lazy_adam = bool(lazy_adam)
        self.sum_inside_sqrt = bool(sum_inside_sqrt)


@suggest_keywords
class FtrlParameters(_OptimizationParameters):
    """FTRL-proximal for embedding tables (McMahan et al.), the original's update:

    `acc' = acc + g**2`;
    `linear += g - (acc'**-p - acc**-p) / lr * w` (p = `learning_rate_power`);
    `w = (sign(linear)*l1 - linear) / (acc'**-p / lr + 2*l2)` if `|linear| > l1` else 0.
    """

    def __init__(
        self,
        learning_rate: LearningRate,
        learning_rate_power: float = -0.5,
        initial_accumulator_value: float = 0.1,
        l1_regularization_strength: float = 0.0,
        l2_regularization_strength: float = 0.0,
        use_gradient_accumulation: bool = True,
        clip_weight_min: float | None = None,
        clip_weight_max: float | None = None,
        weight_decay_factor: float | None = None,
        multiply_weight_decay_factor_by_learning_rate: bool | None = None,
        clip_gradient_min: float | None = None,
        clip_gradient_max: float | None = None,
    ) -> None:
        super().__init__(
            learning_rate, use_gradient_accumulation, clip_weight_min, clip_weight_max,
            weight_decay_factor, multiply_weight_decay_factor_by_learning_rate,
            clip_gradient_min, clip_gradient_max,
        )
        owner = "FtrlParameters"
        power = _number(learning_rate_power, "learning_rate_power", owner)
        if power > 0:
            raise ValueError(
                message(
                    "FTRL's `learning_rate_power` must be <= 0.", f"learning_rate_power={power}",
                    "The default is -0.5; 0 keeps the learning rate fixed.",
                )
            )
        checks = (
            ("initial_accumulator_value", initial_accumulator_value),
            ("l1_regularization_strength", l1_regularization_strength),
            ("l2_regularization_strength", l2_regularization_strength),
        )
        for name, value in checks:
            if _number(value, name, owner) < 0:
                raise ValueError(message(f"FTRL's `{name}` must be >= 0.", f"{name}={value}"))
        self.learning_rate_power = power
        self.initial_accumulator_value = float(initial_accumulator_value)
        self.initial_linear_value = 0.0
        self.l1_regularization_strength = float(l1_regularization_strength)
        self.l2_regularization_strength = float(l2_regularization_strength)


@suggest_keywords
class StochasticGradientDescentParameters(_OptimizationParameters):
    """Plain SGD for embedding tables: `w -= lr * g` on the rows looked up."""

    def __init__(
        self,
        learning_rate: LearningRate,
        clip_weight_min: float | None = None,
        clip_weight_max: float | None = None,
        weight_decay_factor: float | None = None,
        multiply_weight_decay_factor_by_learning_rate: bool | None = None,
        clip_gradient_min: float | None = None,
        clip_gradient_max: float | None = None,
    ) -> None:
        super().__init__(
            learning_rate, False, clip_weight_min, clip_weight_max, weight_decay_factor,
            multiply_weight_decay_factor_by_learning_rate, clip_gradient_min, clip_gradient_max,
        )


OPTIMIZERS = (AdagradParameters, AdamParameters, FtrlParameters, StochasticGradientDescentParameters)
