"""The loops of `evaluate()` and `predict()`: their feed plan and their shared engine policy.

Batches come from the one feeder (feeding/feeder.py, on its thread, as
train()'s) in loops of about `iterations_per_loop` batches, then through the
hosts' agreement (feeding/lockstep.py `in_lockstep`, on the host loop's
thread). With strategy "scan" a loop runs as on-device programs over chunks
of k full batches (`lax.map`), k chunks of at most MAX_CHUNK_BYTES: on one
process the feeder stacks each chunk on the host and places it as one array;
on several, a chunk is a list of placed batches stacked inside the program
(when every host's batches are full), so an uneven end runs batch by batch.
With "step" each batch is its own queued program. A padded batch always runs
alone (its own program).

A loop's chunks are dispatched as they arrive (the engine bounds the input
bytes queued on the devices: estimator/inflight.py), their outputs copied to
the host asynchronously (`Engine.submit`); the host reads loop L once loop
L+1 is queued (the policy's `ahead = 1`, estimator/engine.py): the devices
compute while the host merges metrics or hands predictions out. Hooks see
one `before_run`/`after_run` per loop, as in train(); when one asks to stop,
the loop already queued behind it is dropped unread: results cover exactly
the loops up to the stop.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, Iterator

import jax
import numpy as np

from tpu_estimator.api.session_run_hook import RunContext
from tpu_estimator.api.tpu_config import IterationsPerLoop
from tpu_estimator.estimator.engine import Done, Engine
from tpu_estimator.feeding import feeder
from tpu_estimator.feeding.device import Placer, batch_specs, stack
from tpu_estimator.feeding.host_batches import HostBatch
from tpu_estimator.feeding.lockstep import Agreed, empty_like, in_lockstep
from tpu_estimator.parallel.mesh import Topology

# Loop length when iterations_per_loop is a duration (inference has no step count to time).
TIMED_LOOP_BATCHES = 16


def loop_size(ipl: IterationsPerLoop) -> int:
    """Batches per loop for `iterations_per_loop`."""
    return ipl.value if ipl.unit == "count" else TIMED_LOOP_BATCHES


class InferencePlan:
    """evaluate()'s and predict()'s feed plan (feeding/feeder.py `Plan`): loops of `size`
    batches (rounded up to whole chunks: one compiled loop length), chunks of `k` full
    batches stacked on one process; `select` takes a batch's input (features and labels, or
    features), whose batch axes are `axes`."""

    full_only = True

    def __init__(self, strategy: str, size: int, first: HostBatch, select: Callable[[HostBatch], Any],
                 topology: Topology, axes: Any) -> None:
        per_batch = feeder.nbytes(select(first))
        self.k = feeder.chunk_len(size, per_batch) if strategy == "scan" and size > 1 else 1
        self.scan = self.k > 1
        self.size = -(-size // self.k) * self.k
        self.select = select
        self._one = Placer(batch_specs(axes), topology)
        self._stacked = Placer(batch_specs(axes, leading=1), topology)

    def next_loop(self) -> tuple[int, bool, bool]:
        return self.size, self.scan, self.scan and jax.process_count() == 1

    def chunk_len(self, size: int, per_batch: int) -> int:
        return self.k

    def place(self, group: list[HostBatch], stacked: bool) -> Any:
        if stacked:
            return self._stacked(stack([self.select(b) for b in group]))
        return self._one.many([self.select(b) for b in group])

    def extra(self, group: list[HostBatch]) -> None:
        return None

    def empty(self, first: HostBatch) -> Callable[[], Any]:
        """An all-padding batch like `first`, placed once when a host first needs it."""
        placed: list[Any] = []

        def get() -> Any:
            if not placed:
                placed.append(self._one(self.select(empty_like(first))))
            return placed[0]

        return get


@contextlib.contextmanager
def feed(batches: Iterator[HostBatch], first: HostBatch, plan: InferencePlan) -> Iterator[Iterator[Iterator[Agreed]]]:
    """The loops of an evaluation or prediction: each an iterator of agreed chunks, placed
    on the feeder thread (leaving the block stops it)."""
    with feeder.open_feed(batches, plan) as chunks:
        width = max(plan.size, feeder.STEP_CHUNK)
        yield feeder.loops(in_lockstep(chunks, plan.empty(first), width=width, size=first.size))


@dataclasses.dataclass
class Step:
    """One batch as the host reads its outputs: every host's real row count, rows per host."""

    counts: np.ndarray
    size: int
    num_real: int  # this host's

    @property
    def padded(self) -> bool:
        """Some host's rows are padding: the batch runs by itself, its padding dropped."""
        return bool((self.counts < self.size).any())


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


class InferencePolicy:
    """evaluate()'s and predict()'s shared half of their engine policy (estimator/engine.py):
    one loop queued ahead, a loop's chunks dispatched as they arrive, PreemptedError at a
    notice. A subclass reads a loop (`read`), counting the batches it read in `self.batches`.

    `programs` names the programs: "single" (one batch), "loop" (k stacked
    batches) and "padded" (a padded batch); `args` are the leading arguments
    every program takes (variables, step, rng); `k`: the batches of a full "scan" chunk.
    """

    ahead = 1
    call = "inference"  # "evaluate()" / "predict()" in messages

    def __init__(self, engine: Engine, program: Callable[[str], Callable[..., Any]], programs: dict[str, str],
                 args: tuple[Any, ...], *, k: int, global_step: int) -> None:
        self.engine = engine
        self._program, self._names, self._args = program, programs, args
        self._k = k
        self.global_step = global_step
        self.batches = 0

    def begin(self) -> None:
        """Nothing between the hooks' begin and after_create_session."""

    def dispatch(self, loop: Iterator[Agreed]) -> Dispatched:
        """Queues `loop`'s programs chunk by chunk as the feeder hands them over; their outputs
        start moving to the host. Nothing of a chunk's device input is kept here."""
        programs: list[Program] = []
        for chunk in loop:
            programs.extend(self._queue(chunk))
        return Dispatched(programs)

    def _queue(self, chunk: Agreed) -> list[Program]:
        """One chunk's programs, queued. They hold the chunk's input; nothing else does once
        this returns."""
        data, chunk.data = chunk.data, None
        steps = [Step(c, chunk.size, int(c[jax.process_index()])) for c in chunk.counts]
        whole = self._k > 1 and len(steps) == self._k and not any(s.padded for s in steps)
        if chunk.stacked or whole:  # several processes: stacked inside the program
            return [Program(steps, self._run("loop", data), True)]
        return [
            Program([step], self._run("padded" if step.padded else "single", batch), False)
            for step, batch in zip(steps, data)
        ]

    def _run(self, kind: str, data: Any) -> Any:
        return self.engine.submit(self._program(self._names[kind])(*self._args, data), holds=data)

    def fetch(self, done: Dispatched) -> list[Program]:
        """The loop's programs with their outputs on the host (waits for them)."""
        outs = self.engine.fetch([p.out for p in done.programs])
        return [dataclasses.replace(p, out=out) for p, out in zip(done.programs, outs)]

    def read(self, queued: Dispatched) -> Done:
        raise NotImplementedError  # the mode's: what a loop's outputs mean

    def preempted(self, done: Done, ctx: RunContext) -> None:
        """A preemption notice: PreemptedError, nothing recorded or handed out."""
        raise self.engine.watch.error(self.call, batches=self.batches, global_step=self.global_step)
