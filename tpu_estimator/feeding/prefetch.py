"""A background thread that runs a producer ahead of its consumer.

Input reading, stacking and host-to-device transfer overlap with compute. An
exception in the producer is raised from the consumer's `next()` as itself.
Closing (or abandoning) the iterator stops the thread.
"""

from __future__ import annotations

import queue
import threading
from typing import Generic, Iterator, TypeVar

T = TypeVar("T")
_END = object()


class Prefetch(Generic[T]):
    """Iterates `source` on a daemon thread, at most `depth` items ahead."""

    def __init__(self, source: Iterator[T], depth: int = 2) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(source,), daemon=True)
        self._thread.start()

    def _put(self, item: object) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, source: Iterator[T]) -> None:
        try:
            for item in source:
                if not self._put(item):
                    return
            self._put(_END)
        except BaseException as e:  # surfaces in the consumer
            self._put(_Raised(e))

    def __iter__(self) -> "Prefetch[T]":
        return self

    def __next__(self) -> T:
        item = self._queue.get()
        if item is _END:
            self._queue.put(_END)
            raise StopIteration
        if isinstance(item, _Raised):
            self._queue.put(item)
            raise item.error
        return item

    def close(self) -> None:
        """Stops the producer thread and waits for it."""
        self._stop.set()
        self._thread.join(timeout=10)

    def __enter__(self) -> "Prefetch[T]":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Raised:
    def __init__(self, error: BaseException) -> None:
        self.error = error
