"""Choosing how a training loop runs: one `lax.scan` program, or one program per step.

Measured (DESIGN.md): XLA:CPU runs convolution training inside `lax.scan`
~10x slower than one jitted step per dispatch, while MLPs gain from scan.
"auto" picks "step" on the CPU backend when the model has a convolution,
and "scan" otherwise.
"""

from __future__ import annotations

from typing import Any

import jax

_CONV = "conv_general_dilated"


def has_convolution(jaxpr: Any) -> bool:
    """True if `jaxpr` (or any sub-jaxpr) contains a convolution."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == _CONV:
            return True
        for value in eqn.params.values():
            subs = value if isinstance(value, (list, tuple)) else [value]
            for sub in subs:
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns") and has_convolution(inner):
                    return True
    return False


def choose_strategy(setting: str, runtime: Any, state: Any, first: Any, axes: Any) -> str:
    """'scan' or 'step' for this model on this backend (`setting` 'auto' decides)."""
    if setting != "auto":
        return setting
    if jax.default_backend() != "cpu":
        return "scan"
    sample = runtime.replica_sample(first, axes)
    key = jax.random.PRNGKey(0)
    jaxpr = jax.make_jaxpr(lambda f, l: runtime.model.init(key, f, l)[1])(*sample)
    return "step" if has_convolution(jaxpr.jaxpr) else "scan"
