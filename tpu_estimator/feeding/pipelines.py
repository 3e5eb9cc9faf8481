"""Calling `input_fn` as the input pipeline mode says, and merging what it yields.

PER_HOST_V1/V2 call it once per host; PER_SHARD_V1 once per local replica
(each with its own `InputContext.input_pipeline_id`), and the replicas'
batches are taken in turn; BROADCAST and SLICED call it on host 0 only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

from tpu_estimator.api.contracts import ArrayTree, BatchAxis, InputFn
from tpu_estimator.api.tpu_config import InputPipelineConfig
from tpu_estimator.feeding.broadcast import broadcast_batches, received_batches
from tpu_estimator.feeding.host_batches import HostArrays, HostBatches, as_iterable
from tpu_estimator.feeding.input_state import get_input_state, is_checkpointable, set_input_state
from tpu_estimator.model.call import call_with
from tpu_estimator.parallel.input_context import InputContext
from tpu_estimator.parallel.layout import DataLayout

if TYPE_CHECKING:
    from tpu_estimator.api.run_config import RunConfig


class Interleaved:
    """Yields one element of each iterator in turn (stops when one ends).

    Checkpointable (`get_state`/`set_state`) when every iterator is.
    """

    def __init__(self, iterators: list[Iterator[ArrayTree]]) -> None:
        self._its = iterators
        self._next = 0
        if all(is_checkpointable(it) for it in iterators):
            self.get_state = self._get_state
            self.set_state = self._set_state

    def __iter__(self) -> "Interleaved":
        return self

    def __next__(self) -> ArrayTree:
        item = next(self._its[self._next])
        self._next = (self._next + 1) % len(self._its)
        return item

    def _get_state(self) -> dict[str, object]:
        return {"next": self._next, "pipelines": [get_input_state(it) for it in self._its]}

    def _set_state(self, state: Mapping[str, Any]) -> None:
        self._next = int(state["next"])
        for it, saved in zip(self._its, state["pipelines"]):
            set_input_state(it, saved)


def contexts(layout: DataLayout) -> list[InputContext]:
    """The `InputContext` of each input_fn call this host makes (may be empty: not host 0)."""
    calls = layout.input_fn_calls_per_host
    per_replica = layout.per_replica_batch_size if layout.global_batch_size else None
    if layout.pipeline is InputPipelineConfig.PER_SHARD_V1:
        first = layout.host_id * layout.local_replicas
        return [
            InputContext(layout.num_replicas, first + i, layout.num_replicas, per_replica)
            for i in range(calls)
        ]
    if layout.host0_reads:
        return [InputContext(1, 0, layout.num_replicas, per_replica)] * calls
    return [InputContext(layout.num_hosts, layout.host_id, layout.num_replicas, per_replica)]


def open_input(
    input_fn: InputFn,
    names: frozenset[str],
    *,
    layout: DataLayout,
    params: dict[str, Any],
    config: RunConfig,
    mode: str,
    batch_axis: BatchAxis,
    pad_final: bool,
    features_fn: Callable[[HostArrays], HostArrays] | None = None,
) -> tuple[HostBatches, Iterator[ArrayTree]]:
    """Calls input_fn as `layout` says; (validated host batches, the raw iterator).
    `features_fn` checks and converts each element's features first (embedding ids)."""
    params = dict(params)
    if layout.global_batch_size:
        params["batch_size"] = layout.input_fn_batch_size
    iterators = [
        iter(as_iterable(call_with(input_fn, names, params=dict(params), config=config, mode=mode,
                                   input_context=ctx)))
        for ctx in contexts(layout)
    ]
    if not iterators:  # not host 0 in BROADCAST/SLICED: host 0's batches arrive by broadcast
        iterator: Iterator[ArrayTree] = received_batches()
    elif len(iterators) == 1:
        iterator = iterators[0]
    else:
        iterator = Interleaved(iterators)
    if layout.host0_reads and layout.num_hosts > 1 and iterators:
        iterator = broadcast_batches(iterator, num_hosts=layout.num_hosts)
    batches = HostBatches(
        iterator,
        batch_size=layout.read_batch_size if layout.global_batch_size else None,
        batch_axis=batch_axis,
        pad_final=pad_final,
        pulls=layout.batches_per_pull,
        features_fn=features_fn,
    )
    return batches, iterator

