"""`Precision`: the compute dtype model_fn runs in (`TPUConfig.precision_policy`).

Under "mixed_bfloat16" / "mixed_float16" `BoundModel.apply` hands model_fn
the `params` collection and the floating features cast to the compute dtype
(integer features, labels and the other collections as they are), and casts
every floating array of the spec model_fn returns (loss, predictions, metric
and host_call tensors) back to float32. The parameters themselves stay
float32: the cast is inside the differentiated function, so gradients,
optimizer state and checkpoints are float32 ("master weights"). Mutable
collections (`batch_stats`) come back in their stored dtype. The
initialisation (`BoundModel.init`) runs in float32: it creates the float32
parameters.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from tpu_estimator.api.step_options import COMPUTE_DTYPES


def _is_float(x: Any) -> bool:
    return isinstance(x, (jax.Array, jnp.ndarray)) and jnp.issubdtype(x.dtype, jnp.floating)


def cast_floating(tree: Any, dtype: Any) -> Any:
    """`tree` with its floating arrays cast to `dtype` (others as they are)."""
    return jax.tree.map(lambda x: x.astype(dtype) if _is_float(x) and x.dtype != dtype else x, tree)


@dataclasses.dataclass(frozen=True)
class Precision:
    """A precision policy: "float32", "mixed_bfloat16" or "mixed_float16"."""

    policy: str = "float32"

    @property
    def compute_dtype(self) -> Any:
        return COMPUTE_DTYPES[self.policy]

    @property
    def mixed(self) -> bool:
        return self.policy != "float32"

    def inputs(self, variables: dict[str, Any], features: Any) -> tuple[dict[str, Any], Any]:
        """What model_fn sees: `params` and floating features in the compute dtype."""
        if not self.mixed:
            return variables, features
        dtype = self.compute_dtype
        if "params" in variables:
            variables = {**variables, "params": cast_floating(variables["params"], dtype)}
        return variables, cast_floating(features, dtype)

    def outputs(self, spec: Any, mutated: Any, stored: dict[str, Any]) -> tuple[Any, Any]:
        """The spec's floating arrays as float32; mutated collections in the dtypes `stored`
        (the collections passed in) had."""
        if not self.mixed:
            return spec, mutated
        spec = cast_floating(spec, jnp.float32)
        if mutated:
            mutated = {
                name: jax.tree.map(lambda new, old: new.astype(old.dtype), tree, stored[name])
                if name in stored else tree
                for name, tree in dict(mutated).items()
            }
        return spec, mutated
