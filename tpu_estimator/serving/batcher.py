"""Dynamic batching: concurrent requests of one signature merged into padded batches.

A request of `n` rows is queued; a worker takes the first waiting request,
adds more until `max_batch_size` rows or `batch_timeout_micros` have passed,
pads the rows up to the next allowed batch size (so only those shapes ever
compile), runs the signature once and hands every request its slice.

The queue is bounded as TF Serving's is: at most `max_enqueued_batches`
batches of `max_batch_size` rows wait; a request that does not fit is refused
whole (`QueueFull`, answered 503), so overload sheds instead of piling up.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import queue
import threading
import time
from typing import Any, Callable

import numpy as np

from tpu_estimator.api.checks import message, positive_int
from tpu_estimator.export.inference import batching_settings

log = logging.getLogger("tpu_estimator.serving")

Arrays = dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class BatchingOptions:
    """How a server batches: the `inference_on_tpu` settings, or flags, or defaults."""

    enabled: bool = True
    max_batch_size: int = 32
    batch_timeout_micros: int = 2000
    num_batch_threads: int = 1
    allowed_batch_sizes: tuple[int, ...] = ()
    max_enqueued_batches: int = 10

    @classmethod
    def create(cls, recorded: dict[str, Any] | None = None, *, enabled: bool = True, **flags: Any) -> "BatchingOptions":
        """Flags (non-None) override the settings recorded in the manifest, which override defaults."""
        enqueued = flags.pop("max_enqueued_batches", None)
        enqueued = cls.max_enqueued_batches if enqueued is None else positive_int(enqueued, "max_enqueued_batches")
        base = dataclasses.asdict(cls())
        del base["max_enqueued_batches"]
        base.update({k: v for k, v in (recorded or {}).items() if v is not None})
        if flags.get("max_batch_size") is not None and flags.get("allowed_batch_sizes") is None:
            base["allowed_batch_sizes"] = None  # recorded sizes end at the recorded maximum
        base.update({k: v for k, v in flags.items() if v is not None})
        settings = batching_settings(
            base["num_batch_threads"], base["max_batch_size"], base["batch_timeout_micros"],
            base["allowed_batch_sizes"] or None,
        )
        sizes = settings["allowed_batch_sizes"] or _powers_of_two(settings["max_batch_size"])
        return cls(
            enabled=enabled,
            max_batch_size=settings["max_batch_size"],
            batch_timeout_micros=settings["batch_timeout_micros"],
            num_batch_threads=settings["num_batch_threads"],
            allowed_batch_sizes=tuple(sizes),
            max_enqueued_batches=enqueued,
        )

    def padded_size(self, rows: int) -> int:
        """The smallest allowed batch size >= rows (rows itself beyond the largest)."""
        return next((s for s in self.allowed_batch_sizes if s >= rows), rows)


def _powers_of_two(maximum: int) -> list[int]:
    sizes = [1]
    while sizes[-1] * 2 < maximum:
        sizes.append(sizes[-1] * 2)
    return sorted(set(sizes + [maximum]))


def pad_rows(inputs: Arrays, size: int) -> Arrays:
    """Each input padded along dim 0 to `size` rows (zeros)."""
    out = {}
    for name, a in inputs.items():
        extra = size - a.shape[0]
        out[name] = a if extra <= 0 else np.concatenate([a, np.zeros((extra,) + a.shape[1:], a.dtype)])
    return out


def run_padded(run: Callable[[Arrays], Arrays], inputs: Arrays, rows: int, options: BatchingOptions) -> Arrays:
    """Runs `rows` rows padded to an allowed batch size; returns the outputs of the real rows."""
    outputs = run(pad_rows(inputs, options.padded_size(rows)))
    return {k: v[:rows] for k, v in outputs.items()}


class ModelRetired(RuntimeError):
    """The batcher's model version was replaced; the caller retries on the current one."""


class QueueFull(RuntimeError):
    """The queue holds `max_enqueued_batches` batches already: the request is refused (503)."""

    def __init__(self, rows: int, options: BatchingOptions) -> None:
        super().__init__(message(
            f"The server is overloaded: at most max_enqueued_batches={options.max_enqueued_batches} "
            f"batches of {options.max_batch_size} rows may wait.",
            f"a request of {rows} rows with the queue full", "Retry later.",
        ))


class Gate:
    """Bounds calls that are not batched: at most `limit` running or waiting at once."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held = 0
        self._lock = threading.Lock()

    def enter(self, rows: int, options: BatchingOptions) -> None:
        """Takes a place, or raises `QueueFull`; `leave()` gives it back."""
        with self._lock:
            if self._held >= self.limit:
                raise QueueFull(rows, options)
            self._held += 1

    def leave(self) -> None:
        with self._lock:
            self._held -= 1

    @property
    def held(self) -> int:
        """Calls running or waiting now."""
        return self._held


@dataclasses.dataclass
class _Request:
    inputs: Arrays
    rows: int
    future: concurrent.futures.Future


_CLOSE = object()


class Batcher:
    """Batches the calls of one signature on `num_batch_threads` worker threads."""

    def __init__(self, run: Callable[[Arrays], Arrays], options: BatchingOptions, name: str = "",
                 on_batch: Callable[[int, int], None] | None = None) -> None:
        """`on_batch(rows, padded_rows)` is called after each batch run (metrics)."""
        self._run = run
        self._on_batch = on_batch
        self.options = options
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._closed = False
        self._capacity = options.max_enqueued_batches * options.max_batch_size
        self._waiting = 0  # rows queued and not yet taken by a worker
        self.batches_run = 0
        self._workers = [
            threading.Thread(target=self._work, name=f"batcher-{name}-{i}", daemon=True)
            for i in range(options.num_batch_threads)
        ]
        for w in self._workers:
            w.start()

    def submit(self, inputs: Arrays, rows: int) -> list[concurrent.futures.Future]:
        """Queues `rows` rows (in chunks of at most max_batch_size); one future per chunk.

        Raises `QueueFull` (nothing queued) when the rows would not fit in the
        `max_enqueued_batches * max_batch_size` rows the queue holds.
        """
        step = self.options.max_batch_size
        futures = []
        with self._lock:
            if self._closed:
                raise ModelRetired()
            if self._waiting and self._waiting + rows > self._capacity:  # alone, any size fits
                raise QueueFull(rows, self.options)
            self._waiting += rows
            for start in range(0, rows, step):
                n = min(step, rows - start)
                chunk = {k: v[start : start + n] for k, v in inputs.items()}
                fut: concurrent.futures.Future = concurrent.futures.Future()
                self._queue.put(_Request(chunk, n, fut))
                futures.append(fut)
        return futures

    @property
    def waiting_rows(self) -> int:
        """Rows queued and not yet taken by a worker."""
        return self._waiting

    def _get(self, timeout: float | None = None) -> Any:
        """The next queued request (or _CLOSE), no longer counted as waiting."""
        item = self._queue.get(timeout=timeout)
        if item is not _CLOSE:
            with self._lock:
                self._waiting -= item.rows
        return item

    def close(self) -> None:
        """Stops accepting requests; the workers finish what is queued, then exit."""
        with self._lock:
            self._closed = True
            self._queue.put(_CLOSE)

    def join(self, timeout: float | None = None) -> None:
        """Waits (after `close()`) until the workers have run what was queued and ended."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for w in self._workers:
            w.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def _work(self) -> None:
        pending: _Request | None = None
        while True:
            first = pending if pending is not None else self._get()
            pending = None
            if first is _CLOSE:
                self._queue.put(_CLOSE)  # let the other workers see it too
                return
            batch, rows = [first], first.rows
            deadline = time.monotonic() + self.options.batch_timeout_micros / 1e6
            while rows < self.options.max_batch_size:
                try:
                    nxt = self._get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if nxt is _CLOSE or rows + nxt.rows > self.options.max_batch_size:
                    pending = nxt
                    break
                batch.append(nxt)
                rows += nxt.rows
            self._execute(batch, rows)

    def _execute(self, batch: list[_Request], rows: int) -> None:
        live = [r for r in batch if r.future.set_running_or_notify_cancel()]
        if not live:
            return
        try:
            rows = sum(r.rows for r in live)
            names = live[0].inputs
            merged = {k: np.concatenate([r.inputs[k] for r in live]) for k in names}
            outputs = run_padded(self._run, merged, rows, self.options)
            self.batches_run += 1
            if self._on_batch is not None:
                self._on_batch(rows, self.options.padded_size(rows))
        except BaseException as e:  # every waiting request gets the error
            for r in live:
                r.future.set_exception(e)
            return
        start = 0
        for r in live:
            r.future.set_result({k: v[start : start + r.rows] for k, v in outputs.items()})
            start += r.rows
