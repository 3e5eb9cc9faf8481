"""How a training step computes: gradient accumulation, precision policy, rematerialization.

The checks of `TPUConfig.gradient_accumulation_steps`, `precision_policy` and
`remat_policy` (each error names the argument), and the values they stand
for: the compute dtype of a policy, the `jax.checkpoint` policy of a name.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Literal

import jax
import jax.numpy as jnp

from tpu_estimator.api.checks import message, positive_int

PrecisionPolicy = Literal["float32", "mixed_bfloat16", "mixed_float16"]

COMPUTE_DTYPES = {"float32": jnp.float32, "mixed_bfloat16": jnp.bfloat16, "mixed_float16": jnp.float16}
FULL_REMAT = "full"  # save nothing: the whole forward pass is recomputed in the backward pass


def check_gradient_accumulation_steps(value: Any) -> int:
    return positive_int(
        value, "gradient_accumulation_steps",
        fix="Use e.g. gradient_accumulation_steps=4 (1: no accumulation).",
    )


def check_precision_policy(value: Any) -> str:
    if not isinstance(value, str) or value not in COMPUTE_DTYPES:
        raise ValueError(
            message(
                "`precision_policy` must be 'float32', 'mixed_bfloat16' or 'mixed_float16'.",
                f"precision_policy={value!r}",
                "Use 'mixed_bfloat16' on TPUs and recent GPUs, 'mixed_float16' (with dynamic "
                "loss scaling) on older GPUs.",
            )
        )
    return value


def policy_names() -> list[str]:
    """The `jax.checkpoint_policies` that are policies (not factories needing arguments)."""
    found = []
    for name in dir(jax.checkpoint_policies):
        obj = getattr(jax.checkpoint_policies, name)
        if name.startswith("_") or not callable(obj):
            continue
        try:
            params = inspect.signature(obj).parameters.values()
        except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
            continue
        if any(p.kind is p.VAR_KEYWORD for p in params):  # policy(prim, *args, **params)
            found.append(name)
    return sorted(found)


def check_remat_policy(value: Any) -> str | None:
    if value is None or (isinstance(value, str) and value == FULL_REMAT):
        return value
    names = policy_names()
    if not isinstance(value, str) or value not in names:
        raise ValueError(
            message(
                "`remat_policy` must be None, 'full' or the name of a jax.checkpoint_policies "
                f"policy: {', '.join(names)}.",
                f"remat_policy={value!r}",
                "Use e.g. remat_policy='dots_with_no_batch_dims_saveable' (keeps matmul outputs, "
                "recomputes the rest) or 'full'.",
            )
        )
    return value


def checkpoint_policy(remat_policy: str | None) -> Callable[..., Any] | None:
    """The `policy=` of `jax.checkpoint` for a (valid) `remat_policy` other than None."""
    if remat_policy == FULL_REMAT:
        return None
    return getattr(jax.checkpoint_policies, remat_policy)
