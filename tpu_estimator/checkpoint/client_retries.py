"""Orbax's TensorStore requests retried within `storage_timeout_s`, not for ~15 min.

Orbax builds the TensorStore context of a save or a restore inside its handlers, with
TensorStore's default retries (`gcs_request_retries`: 32, backoff up to 32 s), and
offers no option to pass another. The context reaches the array handler as each
`ParamInfo.ts_context`, and handlers are Orbax's public extension point: `install()`
registers for `jax.Array` a handler that hands Orbax's own one each `ParamInfo` with a
child of Orbax's context (sharing its resources: the OCDBT cache, the I/O limits)
that sets `gcs_request_retries` from the deadline (`storage.client_retries`).

Why it matters: Orbax's asyncio code waits for the TensorStore commit on a worker of
asyncio's default executor, which Python joins at exit. With the default retries a
process whose store stayed away could not exit for up to ~15 min after our
CheckpointStorageError; with these it exits once the retries run out, about one
deadline after the store stopped answering (docs/cluster.md, "A store that stays away").
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
from typing import Any, Iterator

from tpu_estimator import storage
from tpu_estimator.checkpoint import array_writes

__all__ = ["install", "bounded_context"]

_lock = threading.Lock()
_installed = False


def install() -> None:
    """Registers the bounded handler for jax.Array in Orbax's type-handler registry, once.

    Orbax's own handler is wrapped as `array_writes.writer` makes it (saves of one process
    write each replicated array once). Leaves a handler someone else registered for
    jax.Array in place (theirs decides).
    """
    global _installed
    import jax
    import orbax.checkpoint as ocp

    with _lock:
        if _installed:
            return
        inner = ocp.type_handlers.get_type_handler(jax.Array)
        if type(inner) is ocp.type_handlers.ArrayHandler:  # Orbax's own, as registered by Orbax
            with _quiet_override():
                ocp.type_handlers.register_type_handler(jax.Array, _bounded_handler(array_writes.writer(inner)),
                                                        override=True)
        _installed = True


def bounded_context(parent: Any) -> Any:
    """A child of TensorStore context `parent` whose GCS requests are retried within the
    deadline (for TensorStore work Orbax does not do through its handlers: the merge of a
    staged save's per-process trees, checkpoint/process_parts.py)."""
    import tensorstore as ts

    spec = ts.Context.Spec({"gcs_request_retries": storage.client_retries(storage.timeout_s())})
    return ts.Context(spec, parent=parent)


@contextlib.contextmanager
def _quiet_override() -> Iterator[None]:
    """Drops Orbax's absl warning that a handler overrides jax.Array's while ours is
    registered: the override is this module's purpose, not news for the user's log."""

    def drop(record: logging.LogRecord) -> bool:
        return "overriding" not in record.getMessage()

    absl_log = logging.getLogger("absl")
    absl_log.addFilter(drop)
    try:
        yield
    finally:
        absl_log.removeFilter(drop)


def _bounded_handler(inner: Any) -> Any:
    import orbax.checkpoint as ocp

    class BoundedRetries(ocp.type_handlers.TypeHandler):
        """Orbax's jax.Array handler, its TensorStore requests retried within the deadline."""

        def __init__(self) -> None:
            # (Orbax's context, deadline) -> the child context: one per save or restore,
            # shared by its arrays as Orbax shares its own; a few kept.
            self._children: collections.OrderedDict[tuple[int, float], tuple[Any, Any]] = (
                collections.OrderedDict())
            self._children_lock = threading.Lock()

        def _context(self, parent: Any) -> Any:
            timeout = storage.timeout_s()
            key = (id(parent), timeout)
            with self._children_lock:
                held = self._children.get(key)
                if held is None or held[0] is not parent:
                    held = (parent, bounded_context(parent))
                    self._children[key] = held
                    while len(self._children) > 8:
                        self._children.popitem(last=False)
                return held[1]

        def _infos(self, infos: Any) -> list[Any]:
            return [i if i.ts_context is None else i.replace(ts_context=self._context(i.ts_context))
                    for i in infos]

        def typestr(self) -> str:
            return inner.typestr()

        def has_dispatcher(self) -> bool:
            return inner.has_dispatcher()

        async def metadata(self, infos: Any) -> Any:
            return await inner.metadata(self._infos(infos))

        async def serialize(self, values: Any, infos: Any, args: Any = None) -> Any:
            return await inner.serialize(values, self._infos(infos), args)

        async def deserialize(self, infos: Any, args: Any = None) -> Any:
            return await inner.deserialize(self._infos(infos), args)

        def finalize(self, directory: Any) -> None:
            inner.finalize(directory)

        def __getattr__(self, name: str) -> Any:
            # Whatever else Orbax asks of its jax.Array handler (e.g. whether it keeps an
            # array-metadata store) is answered by its own handler.
            return getattr(inner, name)

    return BoundedRetries()
