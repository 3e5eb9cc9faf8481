"""train()'s feeder: host batches grouped into loops and placed on the devices, on the
feeder thread (a `Prefetch` around `chunks`), handed to the loop engine as `loops`.

One loop = `iterations_per_loop` steps (`LoopSchedule`: a count, or sizes
timed from the loops before). "scan" loops come stacked, at most
MAX_CHUNK_BYTES per chunk; "step" loops as lists of batches growing 1, 2, 4,
... STEP_CHUNK, each with the global step after each batch placed ahead.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Iterator

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

from tpu_estimator.estimator.runtime import Runtime
from tpu_estimator.estimator.schedule import LoopSchedule
from tpu_estimator.feeding import device
from tpu_estimator.feeding.device import Placer, stack
from tpu_estimator.feeding.host_batches import HostBatch
from tpu_estimator.feeding.input_state import get_input_state
from tpu_estimator.loops.strategy import LoopStrategy

# Most bytes of stacked input one program receives (tests lower it).
MAX_CHUNK_BYTES = device.MAX_CHUNK_BYTES
# Most batches in one chunk fed to per-step dispatch (each chunk is one hand-off between threads).
STEP_CHUNK = 16



@dataclasses.dataclass
class Chunk:
    """Device input for some steps of one loop."""

    data: Any  # stacked [k, B, ...] (scan) or a list of k batches (step)
    steps: int
    end_of_loop: bool
    input_state: Any
    # With a list: the global step after each batch, placed ahead of time (the step
    # program leaves the counter to the host; see loops/train.py step_program).
    next_steps: Any = None


def chunks(
    batches: Iterator[HostBatch],
    schedule: LoopSchedule,
    specs: Any,
    runtime: Runtime,
    strategy: LoopStrategy,
    iterator: Any,
    start_step: int = 0,
) -> Iterator[Chunk]:
    """Runs on the feeder thread: groups host batches into loops, moves them to the devices.

    "scan" loops come stacked, in chunks of at most MAX_CHUNK_BYTES. "step" loops
    come as lists of batches growing 1, 2, 4, ... STEP_CHUNK: the first step
    starts as soon as one batch is placed, with few hand-offs between threads.
    The strategy is decided before the first chunk (`Core.state_for`).
    """
    place = {kind: Placer(spec, runtime.core.topology) for kind, spec in specs.items()}
    place_step = Placer(P(), runtime.core.topology)
    fed = start_step
    step_chunk = 1
    while (size := schedule.next_size()) is not None:
        stacked = strategy.current == "scan"
        done = 0
        while done < size:
            first = next(batches, None)
            if first is None:
                return
            if not stacked:
                limit, step_chunk = min(size - done, step_chunk), min(2 * step_chunk, STEP_CHUNK)
            else:
                per_batch = sum(x.nbytes for x in jax.tree.leaves(first.tree))
                limit = min(size - done, device.chunk_steps(size, per_batch, MAX_CHUNK_BYTES))
            group = [first, *itertools.islice(batches, limit - 1)]
            done += len(group)
            state = get_input_state(iterator)
            last = done >= size or len(group) < limit
            if stacked:  # written once, into memory XLA:CPU takes without a copy
                data = place["stacked"](stack([b.tree for b in group]))
                next_steps = None
            else:
                data = place["single"].many([b.tree for b in group])
                next_steps = place_step.many([np.int32(fed + i + 1) for i in range(len(group))])
            fed += len(group)
            yield Chunk(data, len(group), last, state, next_steps)
            if len(group) < limit:
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
