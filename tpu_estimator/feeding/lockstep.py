"""Keeping the hosts' evaluation/prediction batches in step.

Every program with collectives must run on every host the same number of
times. On several hosts each step first gathers how many real examples each
host has (`process_allgather`, a host-side collective); a host whose input
ended feeds an all-padding batch until every host's has. On one process
there is nothing to agree on.
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Any, Callable, Iterable, Iterator

import jax
import numpy as np

from tpu_estimator.feeding.host_batches import HostBatch
from tpu_estimator.feeding.prefetch import Prefetch

Step = tuple[HostBatch, Any, np.ndarray]


@contextlib.contextmanager
def lockstep_feed(
    first: HostBatch,
    rest: Iterable[HostBatch],
    place: Callable[[HostBatch], Any],
    *,
    steps: int | None = None,
) -> Iterator[Iterator[Step]]:
    """The steps of an evaluation or prediction: prefetched, placed by `place`, in lockstep.

    Yields an iterator of (host batch, device batch, every host's real count);
    leaving the block stops the prefetch thread.
    """

    def placed() -> Iterator[tuple[HostBatch, Any]]:
        for i, batch in enumerate(itertools.chain([first], rest)):
            if steps is not None and i >= steps:
                return
            yield batch, place(batch)

    def empty() -> tuple[HostBatch, Any]:
        pad = empty_like(first)
        return pad, place(pad)

    feed = Prefetch(placed())
    try:
        yield in_lockstep(feed, empty)
    finally:
        feed.close()


def in_lockstep(
    pairs: Iterator[tuple[HostBatch, Any]], empty: Callable[[], tuple[HostBatch, Any]]
) -> Iterator[Step]:
    """Yields (host batch, device batch, real examples of every host, in host order)."""
    if jax.process_count() == 1:
        for host, device in pairs:
            yield host, device, np.array([host.num_real])
        return
    from jax.experimental import multihost_utils

    while True:
        item = next(pairs, None)
        mine = -1 if item is None else item[0].num_real
        counts = np.asarray(multihost_utils.process_allgather(np.array(mine))).reshape(-1)
        if (counts < 0).all():
            return
        yield (*(item if item is not None else empty()), np.maximum(counts, 0))


def real_rows(counts: np.ndarray, size: int) -> np.ndarray:
    """Mask of the real rows of outputs gathered host by host, `size` rows per host."""
    return np.concatenate([np.arange(size) < c for c in counts])


def empty_like(batch: HostBatch) -> HostBatch:
    """An all-padding batch shaped like `batch`."""
    zeros = jax.tree.map(np.zeros_like, (batch.features, batch.labels))
    return HostBatch(zeros[0], zeros[1], 0, batch.size)
