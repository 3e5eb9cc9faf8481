"""The benchmarks' host batches: numpy only (a hand-written script's child imports no more)."""

from __future__ import annotations

import numpy as np


def make_batches(shape, batch, n, pool, seed=0):
    """`n` host batches (x, y): `pool` distinct ones, repeated in turn (the same objects)."""
    rng = np.random.RandomState(seed)
    distinct = [
        (rng.rand(batch, *shape).astype(np.float32), rng.randint(0, 10, batch).astype(np.int32))
        for _ in range(min(n, pool))
    ]
    return [distinct[i % len(distinct)] for i in range(n)]
