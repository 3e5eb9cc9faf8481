"""Keeping the hosts' evaluation/prediction chunks in step (inference's part of the feeder).

Every program with collectives must run on every host the same number of
times. On several hosts each chunk first gathers how many real examples each
host has in each of its batches (`process_allgather`, a host-side collective,
on the host loop's thread: every process issues it in the same order); a host
whose input ended, or whose chunk is shorter, feeds all-padding batches until
every host's input has ended. There the feeder's chunks are lists of placed
batches (feeding/feeder.py), so any of them can run alone. On one process
there is nothing to agree on: the counts are the host's own.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator

import jax
import numpy as np

from tpu_estimator.feeding.feeder import Chunk
from tpu_estimator.feeding.host_batches import HostBatch


@dataclasses.dataclass
class Agreed:
    """A chunk every host runs: its device input, and every host's real rows per batch."""

    data: Any  # as `Chunk.data`; on several processes a list with every agreed batch
    counts: list[np.ndarray]  # per batch: real rows of each host, in host order
    size: int  # rows per batch on each host
    stacked: bool
    end_of_loop: bool

    @property
    def steps(self) -> int:
        return len(self.counts)


def in_lockstep(chunks: Iterator[Chunk], empty: Callable[[], Any], *, width: int, size: int) -> Iterator[Agreed]:
    """The feeder's chunks as every host runs them. `empty()` is an all-padding batch placed;
    `width`: the most batches in one chunk; `size`: rows per batch (both the same on every host)."""
    if jax.process_count() == 1:
        for chunk in chunks:
            counts = [np.array([real]) for real, _ in chunk.rows]
            yield Agreed(chunk.data, counts, size, chunk.stacked, chunk.end_of_loop)
        return
    from jax.experimental import multihost_utils

    while True:
        chunk = next(chunks, None)
        mine = np.full(width + 1, -1, np.int64)
        if chunk is not None:
            mine[: chunk.steps] = [real for real, _ in chunk.rows]
            mine[width] = int(chunk.end_of_loop)
        every = np.asarray(multihost_utils.process_allgather(mine)).reshape(-1, width + 1)
        counts = every[:, :width]
        steps = int((counts >= 0).any(axis=0).sum())
        if steps == 0:
            return
        longest = int(np.argmax((counts >= 0).sum(axis=1)))
        data = list(chunk.data) if chunk is not None else []
        data += [empty() for _ in range(steps - len(data))]
        yield Agreed(
            data, [np.maximum(counts[:, i], 0) for i in range(steps)], size, False, bool(every[longest, width]),
        )


def real_rows(counts: np.ndarray, size: int) -> np.ndarray:
    """Mask of the real rows of outputs gathered host by host, `size` rows per host."""
    return np.concatenate([np.arange(size) < c for c in counts])


def empty_like(batch: HostBatch) -> HostBatch:
    """An all-padding batch shaped like `batch`."""
    zeros = jax.tree.map(np.zeros_like, (batch.features, batch.labels))
    return HostBatch(zeros[0], zeros[1], 0, batch.size)
