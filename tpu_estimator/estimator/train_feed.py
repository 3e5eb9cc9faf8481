"""train()'s feed plan on the one feeder (feeding/feeder.py): loops from the `LoopSchedule`,
stacked chunks ("scan") or growing lists of batches ("step"), each list with the global
step after each of its batches placed ahead.

One loop = `iterations_per_loop` steps (`LoopSchedule`: a count, or sizes
timed from the loops before). The strategy is decided before the first loop
(`Core.state_for`) and read at each loop's start.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from jax.sharding import PartitionSpec as P

from tpu_estimator.estimator.runtime import Runtime
from tpu_estimator.estimator.schedule import LoopSchedule
from tpu_estimator.feeding import feeder
from tpu_estimator.feeding.device import Placer, stack
from tpu_estimator.feeding.host_batches import HostBatch
from tpu_estimator.feeding.input_state import get_input_state
from tpu_estimator.loops.strategy import LoopStrategy


@dataclasses.dataclass
class Extra:
    """train()'s part of a chunk: the input's position after it, and with a list the global
    step after each batch, placed ahead of time (the step program leaves the counter to the
    host; see loops/train.py step_program)."""

    input_state: Any
    next_steps: Any = None


class TrainPlan:
    """train()'s `feeder.Plan`: every chunk stacked under "scan" (a short last one too)."""

    full_only = False

    def __init__(self, schedule: LoopSchedule, specs: dict[str, Any], runtime: Runtime, strategy: LoopStrategy,
                 iterator: Any, start_step: int = 0) -> None:
        topology = runtime.core.topology
        self.place_kind = {kind: Placer(spec, topology) for kind, spec in specs.items()}
        self.place_step = Placer(P(), topology)
        self.schedule, self.strategy, self.iterator = schedule, strategy, iterator
        self.fed = start_step
        self.scan = False  # the current loop's

    def next_loop(self) -> tuple[int, bool, bool] | None:
        size = self.schedule.next_size()
        if size is None:
            return None
        self.scan = self.strategy.current == "scan"
        return size, self.scan, self.scan

    def chunk_len(self, size: int, per_batch: int) -> int:
        return feeder.chunk_len(size, per_batch)

    def place(self, group: list[HostBatch], stacked: bool) -> Any:
        if stacked:  # written once, into memory XLA:CPU takes without a copy
            return self.place_kind["stacked"](stack([b.tree for b in group]))
        return self.place_kind["single"].many([b.tree for b in group])

    def extra(self, group: list[HostBatch]) -> Extra:
        state = get_input_state(self.iterator)
        first, self.fed = self.fed, self.fed + len(group)
        if self.scan:
            return Extra(state)
        return Extra(state, self.place_step.many([np.int32(first + i + 1) for i in range(len(group))]))
