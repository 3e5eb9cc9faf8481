"""Variable names: the slash-joined paths of a Flax variables dict, as users see them.

`params` variables are named by their path alone (`Dense_0/kernel`); other
collections keep theirs as a prefix (`batch_stats/BatchNorm_0/mean`); the
global step is `global_step`. `get_variable_names()` and warm start use these.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from tpu_estimator.checkpoint.manager import Checkpointer


def variable_name(path: Any) -> str:
    """The name of the leaf at a `tree_flatten_with_path` path."""
    keys = [str(getattr(p, "key", getattr(p, "idx", p))) for p in path]
    return "/".join(keys[1:] if keys and keys[0] == "params" else keys)


def flatten(variables: Any) -> dict[str, Any]:
    """{name: leaf} of a Flax variables dict (`{'params': ..., other collections}`)."""
    return {variable_name(p): leaf for p, leaf in jax.tree_util.tree_flatten_with_path(variables)[0]}


def saved_variables(ckpt: Checkpointer, step: int) -> dict[str, Any]:
    """The variables of checkpoint `step` by name, plus `global_step` (no model needed)."""
    raw = ckpt.restore_raw(step)
    out = flatten({"params": raw["params"], **dict(raw.get("collections") or {})})
    out["global_step"] = np.asarray(raw["step"])
    return out
