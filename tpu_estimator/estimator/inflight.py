"""How much the host keeps queued on the devices.

Dispatch is asynchronous: the host runs ahead of the devices by up to
`MAX_IN_FLIGHT` programs, so the devices never wait for the host's Python,
and the host never queues so much that XLA:CPU's collectives deadlock (with
~50 programs in flight the rendezvous of their all-reduces aborts). The
device input the queued programs hold (a loop's stacked chunks, lists of
batches) is bounded too, by `MAX_INPUT_BYTES`: with one chunk running and one
queued, the feeder making the next, about 3 chunks of input are alive, not a
loop's worth.
"""

from __future__ import annotations

import collections

import jax

from tpu_estimator.feeding import feeder

MAX_IN_FLIGHT = 16


def max_input_bytes() -> int:
    """Most device input bytes queued programs may hold: two chunks of the feeder's bound
    (read at each call: tests lower `feeder.MAX_CHUNK_BYTES`)."""
    return 2 * feeder.MAX_CHUNK_BYTES


def bound(in_flight: collections.deque, done_marker: jax.Array, holds: int = 0) -> bool:
    """Adds a dispatched program (any of its outputs, and the bytes of device input it holds)
    and waits while more than MAX_IN_FLIGHT programs, or more than `max_input_bytes()` of
    input, are queued. Beyond MAX_IN_FLIGHT the host waits until half remain: the device
    never runs dry waiting for the host, and the host sleeps once per MAX_IN_FLIGHT // 2
    programs rather than once per program. Over the byte bound it waits for the oldest
    programs until the rest hold at most the bound (the newest one always stays queued).
    Programs run in order, so waiting for one waits for all before it. True when it waited."""
    in_flight.append((done_marker, holds))
    drop = 0
    if len(in_flight) > MAX_IN_FLIGHT:
        drop = len(in_flight) - (MAX_IN_FLIGHT // 2 + 1)
    held = sum(b for _, b in in_flight)
    limit = max_input_bytes()
    for i in range(len(in_flight) - 1):
        if held <= limit:
            break
        held -= in_flight[i][1]
        drop = max(drop, i + 1)
    if not drop:
        return False
    for _ in range(drop - 1):
        in_flight.popleft()
    in_flight.popleft()[0].block_until_ready()
    return True
