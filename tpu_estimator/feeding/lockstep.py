"""Keeping the hosts' evaluation/prediction batches in step.

Every program with collectives must run on every host the same number of
times. On several hosts each step first gathers how many real examples each
host has (`process_allgather`, a host-side collective); a host whose input
ended feeds an all-padding batch until every host's has. On one process
there is nothing to agree on, and the feeder may stack full batches into
`Block`s placed as one array (the input of an on-device loop).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from typing import Any, Callable, Iterable, Iterator, Union

import jax
import numpy as np

from tpu_estimator.feeding.host_batches import HostBatch
from tpu_estimator.feeding.prefetch import Prefetch

Step = tuple[HostBatch, Any, np.ndarray]


@dataclasses.dataclass
class Block:
    """Full batches of one process stacked on a new leading axis and placed as one array."""

    hosts: list[HostBatch]
    device: Any


@dataclasses.dataclass(frozen=True)
class Blocking:
    """How the feeder stacks: `size` full batches per block, placed by `place` (a list of
    host batches -> the stacked device array)."""

    size: int
    place: Callable[[list[HostBatch]], Any]


@contextlib.contextmanager
def lockstep_feed(
    first: HostBatch,
    rest: Iterable[HostBatch],
    place: Callable[[HostBatch], Any],
    *,
    steps: int | None = None,
    blocking: Blocking | None = None,
) -> Iterator[Iterator[Union[Step, Block]]]:
    """The steps of an evaluation or prediction: prefetched, placed by `place`, in lockstep.

    Yields an iterator of (host batch, device batch, every host's real count);
    leaving the block stops the prefetch thread. With `blocking` on one process,
    each run of `blocking.size` full batches comes as one `Block` instead (made on the
    feeder thread); batches left over at the end (fewer, or padded) come one by one.
    """
    batches = itertools.islice(itertools.chain([first], rest), steps)
    if blocking is not None and jax.process_count() == 1:
        source: Iterator[Any] = _blocks(batches, place, blocking)
    else:
        source = ((batch, place(batch)) for batch in batches)

    def empty() -> tuple[HostBatch, Any]:
        pad = empty_like(first)
        return pad, place(pad)

    feed = Prefetch(source)
    try:
        yield in_lockstep(feed, empty)
    finally:
        feed.close()


def _blocks(
    batches: Iterator[HostBatch], place: Callable[[HostBatch], Any], blocking: Blocking
) -> Iterator[Union[Block, tuple[HostBatch, Any]]]:
    """Blocks of `blocking.size` full batches, then what is left one by one (runs on the
    feeder thread: stacking and placing overlap the devices' work)."""
    while True:
        group = list(itertools.islice(batches, blocking.size))
        if len(group) == blocking.size and all(b.num_real == b.size for b in group):
            yield Block(group, blocking.place(group))
            continue
        for batch in group:
            yield batch, place(batch)
        return


def in_lockstep(
    pairs: Iterator[Any], empty: Callable[[], tuple[HostBatch, Any]]
) -> Iterator[Union[Step, Block]]:
    """Yields (host batch, device batch, real examples of every host, in host order), or a
    `Block` as it comes (one process only)."""
    if jax.process_count() == 1:
        for item in pairs:
            if isinstance(item, Block):
                yield item
            else:
                host, device = item
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
