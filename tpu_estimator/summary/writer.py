"""Writing TensorBoard event files (tensorboardX's writer; no TensorFlow needed)."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np


def write_scalars(logdir: str, step: int, values: Mapping[str, Any]) -> None:
    """Writes every scalar-valued entry of `values` at `step` into `logdir`."""
    from tensorboardX import SummaryWriter

    with SummaryWriter(logdir) as writer:
        for tag, value in values.items():
            arr = np.asarray(value)
            if arr.ndim == 0 and np.issubdtype(arr.dtype, np.number):
                writer.add_scalar(tag, float(arr), global_step=step)
