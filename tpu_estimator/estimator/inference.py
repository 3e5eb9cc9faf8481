"""The loops of `evaluate()` and `predict()`: batches in loops, one loop in flight ahead.

Batches come from `lockstep_feed` (placed on the devices by its thread, in
step on every host) and are grouped into loops of about `iterations_per_loop`
batches. With strategy "scan" a loop runs as on-device programs over stacked
batches (`lax.map`): on one process the feeder thread stacks them on the host
and places each block as one array (`feeding.lockstep.Block`, at most
`MAX_CHUNK_BYTES` each, as training's chunks); on several, a loop's batches
are stacked inside the program. With "step" each batch is its own queued
program. A padded final batch always runs alone (its own program). Outputs
are copied to the host asynchronously (`Engine.submit`) as soon as a
program is dispatched, and the host reads loop L only after loop L+1 is
queued (the policy's `ahead = 1`, estimator/engine.py): the devices compute
while the host merges metrics or hands predictions out.

Batches left at the end (fewer than a block, or a padded one) run batch by
batch, so each call compiles at most one loop length. Hooks see
one `before_run`/`after_run` per loop, as in train(); when one asks to stop,
the loop already queued behind it is dropped unread: results cover exactly
the loops up to the stop.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator, Union

import jax
import numpy as np

from tpu_estimator.api.session_run_hook import RunContext
from tpu_estimator.estimator.engine import Done, Engine
from tpu_estimator.feeding.device import Placer, batch_specs, chunk_steps, stack
from tpu_estimator.feeding.host_batches import HostBatch
from tpu_estimator.feeding.lockstep import Block, Blocking
from tpu_estimator.api.tpu_config import IterationsPerLoop
from tpu_estimator.parallel.mesh import Topology

# Loop length when iterations_per_loop is a duration (inference has no step count to time).
TIMED_LOOP_BATCHES = 16


@dataclasses.dataclass
class Step:
    """One batch: this host's rows, the placed global batch, every host's real row count."""

    host: HostBatch
    device: Any
    counts: np.ndarray

    @property
    def padded(self) -> bool:
        """Some host's rows are padding: the batch runs by itself, its padding dropped."""
        return bool((self.counts < self.host.size).any())


@dataclasses.dataclass
class Program:
    """One queued program: its steps and outputs (on the devices once dispatched, on the host
    once fetched), stacked on a leading axis of len(steps) when `stacked`."""

    steps: list[Step]
    out: Any
    stacked: bool

    def per_step(self) -> Iterator[tuple[Step, Any]]:
        """(step, its outputs) in order."""
        if not self.stacked:
            yield self.steps[0], self.out
            return
        for i, step in enumerate(self.steps):
            yield step, jax.tree.map(lambda x, i=i: x[i], self.out)


@dataclasses.dataclass
class Dispatched:
    """A loop whose programs are queued."""

    programs: list[Program]

    @property
    def num_steps(self) -> int:
        return sum(len(p.steps) for p in self.programs)


Unit = Union[Step, Block]


def loop_size(ipl: IterationsPerLoop) -> int:
    """Batches per loop for `iterations_per_loop`."""
    return ipl.value if ipl.unit == "count" else TIMED_LOOP_BATCHES


def blocking(
    strategy: str, size: int, first: HostBatch, select: Callable[[HostBatch], Any], topology: Topology, axes: Any
) -> Blocking | None:
    """How the feeder stacks a "scan" loop's batches: blocks of at most MAX_CHUNK_BYTES of
    what `select` takes of each batch (`axes`: its batch axes). None for "step"."""
    if strategy != "scan" or size <= 1:
        return None
    per_batch = sum(np.asarray(x).nbytes for x in jax.tree.leaves(select(first)))
    k = chunk_steps(size, per_batch)
    if k <= 1:
        return None
    place = Placer(batch_specs(axes, leading=1), topology)
    return Blocking(k, lambda hosts: place(stack([select(h) for h in hosts])))


def loops(feed: Iterator[Any], size: int) -> Iterator[list[Unit]]:
    """`lockstep_feed`'s steps and blocks in loops of at least `size` batches (the last
    may be shorter; a block is never split)."""
    loop: list[Unit] = []
    count = 0
    for item in feed:
        if isinstance(item, Block):
            loop.append(item)
            count += len(item.hosts)
        else:
            loop.append(Step(*item))
            count += 1
        if count >= size:
            yield loop
            loop, count = [], 0
    if loop:
        yield loop


class InferencePolicy:
    """evaluate()'s and predict()'s shared half of their engine policy (estimator/engine.py):
    one loop queued ahead, a loop's programs dispatched, PreemptedError at a notice.
    A subclass reads a loop (`read`), counting the batches it read in `self.batches`.

    `programs` names the programs: "single" (one batch), "loop" (k stacked
    batches) and "padded" (a padded batch); `args` are the leading arguments
    every program takes (variables, step, rng).
    """

    ahead = 1
    call = "inference"  # "evaluate()" / "predict()" in messages

    def __init__(self, engine: Engine, program: Callable[[str], Callable[..., Any]], programs: dict[str, str],
                 args: tuple[Any, ...], *, strategy: str, size: int, global_step: int) -> None:
        self.engine = engine
        self._program, self._names, self._args = program, programs, args
        self._scan = strategy == "scan" and size > 1
        self._size = size
        self.global_step = global_step
        self.batches = 0

    def begin(self) -> None:
        """Nothing between the hooks' begin and after_create_session."""

    def dispatch(self, loop: list[Unit]) -> Dispatched:
        """Queues `loop`'s programs; their outputs start moving to the host."""
        steps = [u for u in loop if isinstance(u, Step)]
        if self._scan and len(steps) == len(loop) == self._size and not any(s.padded for s in steps):
            # several processes: the batches of a full loop, stacked inside one program
            return Dispatched([Program(steps, self._run("loop", [s.device for s in steps]), True)])
        programs = []
        for u in loop:
            if isinstance(u, Block):
                block_steps = [Step(h, None, np.array([h.num_real])) for h in u.hosts]
                programs.append(Program(block_steps, self._run("loop", u.device), True))
            else:
                programs.append(Program([u], self._run("padded" if u.padded else "single", u.device), False))
        return Dispatched(programs)

    def _run(self, kind: str, data: Any) -> Any:
        return self.engine.submit(self._program(self._names[kind])(*self._args, data))

    def fetch(self, done: Dispatched) -> list[Program]:
        """The loop's programs with their outputs on the host (waits for them)."""
        outs = self.engine.fetch([p.out for p in done.programs])
        return [dataclasses.replace(p, out=out) for p, out in zip(done.programs, outs)]

    def read(self, queued: Dispatched) -> Done:
        raise NotImplementedError  # the mode's: what a loop's outputs mean

    def preempted(self, done: Done, ctx: RunContext) -> None:
        """A preemption notice: PreemptedError, nothing recorded or handed out."""
        raise self.engine.watch.error(self.call, batches=self.batches, global_step=self.global_step)
