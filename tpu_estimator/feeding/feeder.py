"""The one feeder of train(), evaluate() and predict(): host batches -> per-loop chunks on the devices.

`chunks` runs on the feeder thread (`open_feed`: a `Prefetch`, one chunk made
ahead of the one the host dispatches): it asks the mode's `Plan` for each
loop's size and layout, reads that many host batches, and places them in
chunks, each handed over as soon as it is placed:

* "scan" loops: chunks of at most MAX_CHUNK_BYTES of input (`chunk_len`);
  stacked on the host into one array (`Plan.stack`; XLA:CPU takes it without a
  copy, feeding/device.py `stack`), or lists of that many placed batches
  (several processes' inference: stacked inside the program).
* "step" loops: lists of batches growing 1, 2, 4, ... STEP_CHUNK (and at most
  MAX_CHUNK_BYTES): the first step starts as soon as one batch is placed,
  with few hand-offs between threads.

With `Plan.full_only` (inference) a chunk is stacked only when it holds its
full length of full batches: what is left at the end (fewer batches, or the
padded last one) comes as a list, run batch by batch. `loops` hands the
engine each loop as an iterator of its chunks, so a loop's programs are
dispatched chunk by chunk as they arrive (estimator/engine.py bounds the
input bytes queued on the devices).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from typing import Any, Iterator, Protocol

import jax

from tpu_estimator.feeding import device
from tpu_estimator.feeding.host_batches import HostBatch
from tpu_estimator.feeding.prefetch import Prefetch

# Most bytes of stacked input one program receives (tests lower it).
MAX_CHUNK_BYTES = device.MAX_CHUNK_BYTES
# Most batches in one list chunk of per-step dispatch (each chunk is one hand-off between threads).
STEP_CHUNK = 16


@dataclasses.dataclass
class Chunk:
    """Device input for some steps of one loop, and what the host keeps of its batches."""

    data: Any  # stacked [k, B, ...] (`stacked`) or a list of k placed batches
    rows: list[tuple[int, int]]  # each batch's (real rows, rows) on this host
    stacked: bool
    end_of_loop: bool  # the loop's last chunk (or the input's)
    extra: Any = None  # the plan's own (train(): input state, step counters)

    @property
    def steps(self) -> int:
        return len(self.rows)


class Plan(Protocol):
    """What one mode decides about its feed; called on the feeder thread only."""

    full_only: bool  # stack only full chunks of full batches (inference), else every chunk (train)

    def next_loop(self) -> tuple[int, bool, bool] | None:
        """The next loop's (batches, "scan"?, stacked on the host?), or None: no more loops."""

    def chunk_len(self, size: int, per_batch: int) -> int:
        """Batches per chunk of a "scan" loop of `size` batches of `per_batch` bytes."""

    def place(self, group: list[HostBatch], stacked: bool) -> Any:
        """The group on the devices: one stacked array tree, or a list of placed batches."""

    def extra(self, group: list[HostBatch]) -> Any:
        """The plan's own data for a chunk of `group`, made right after it was read."""


def chunk_len(size: int, per_batch: int) -> int:
    """Batches per "scan" chunk: at most MAX_CHUNK_BYTES each (feeding/device.py chunk_steps)."""
    return device.chunk_steps(size, per_batch, MAX_CHUNK_BYTES)


def nbytes(tree: Any) -> int:
    """Bytes of the arrays of `tree` (a placed chunk, a host batch)."""
    return sum(int(getattr(x, "nbytes", 0)) for x in jax.tree.leaves(tree))


def chunks(batches: Iterator[HostBatch], plan: Plan) -> Iterator[Chunk]:
    """Runs on the feeder thread: `batches` in loops as `plan` says, placed chunk by chunk."""
    step_chunk = 1
    while (loop := plan.next_loop()) is not None:
        size, scan, stack = loop
        done = 0
        while done < size:
            first = next(batches, None)
            if first is None:
                return
            per_batch = nbytes(first.tree)
            if scan:
                limit = min(size - done, plan.chunk_len(size, per_batch))
            else:
                by_bytes = max(1, MAX_CHUNK_BYTES // max(per_batch, 1))
                limit = min(size - done, step_chunk, by_bytes)
                step_chunk = min(2 * step_chunk, STEP_CHUNK)
            group = [first, *itertools.islice(batches, limit - 1)]
            done += len(group)
            ended = len(group) < limit
            rows = [(b.num_real, b.size) for b in group]
            full = not ended and all(real == n for real, n in rows)
            stacked = stack and (full or not plan.full_only)
            extra = plan.extra(group)
            chunk = Chunk(plan.place(group, stacked), rows, stacked, done >= size or ended, extra)
            del group, first  # (the host loop drops `chunk.data` once dispatched: nothing here keeps it)
            yield chunk
            if ended:
                return


def loops(feed: Iterator[Chunk]) -> Iterator[Iterator[Chunk]]:
    """The chunks of each loop, as they come: a loop is handed out once its first chunk is
    placed, and the engine dispatches each chunk as soon as it arrives."""
    for first in feed:
        yield _through_end(first, feed)


def _through_end(first: Chunk, feed: Iterator[Chunk]) -> Iterator[Chunk]:
    yield first
    if first.end_of_loop:
        return
    for chunk in feed:
        yield chunk
        if chunk.end_of_loop:
            return


@contextlib.contextmanager
def open_feed(batches: Iterator[HostBatch], plan: Plan) -> Iterator[Prefetch[Chunk]]:
    """`chunks` on a feeder thread, one chunk made ahead; leaving the block stops the thread
    and frees what it made."""
    feed = Prefetch(chunks(batches, plan))
    try:
        yield feed
    finally:
        feed.close()
