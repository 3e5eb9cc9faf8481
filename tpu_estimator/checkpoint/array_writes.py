"""Who writes a replicated array in a save: in a job of one process, its first replica alone.

Orbax's jax.Array handler, as Orbax registers it, saves "replica-parallel": an array held
whole by several devices is cut into one slice per device (an eager `lax.slice` each), and
every slice is written by the process holding it. Across processes that shares the writing
of replicated arrays between hosts. In one process, that process writes every slice anyway:
the cutting only adds work (1,600+ device ops per save of the 208-array transformer state on
8 devices, and 8x as many chunks written; benchmarks/RESULTS.md, "train()'s fixed cost").

`writer(orbax_own)` is Orbax's own handler except for saves in a job of one process, which go
through an `ArrayHandler(use_replica_parallel=False)`: each array written once, from its
first replica's shards. Reads, and saves of several processes, are Orbax's own handler's.
The checkpoint's format does not change (same type string, same files; an array's chunks
are whole shards cut to `chunk_bytes`, rather than slices of them), so checkpoints restore
whichever handler wrote them.

That handler keeps an array-metadata store, as Orbax's own does: the store records each
array's write shape (into the tree metadata) and the implementation of typed PRNG keys
(restored as keys; without a store they come back as raw key data). The store is the one
Orbax's public saving options hold (`experimental.v1.options.ArrayOptions.Saving()`); where
an Orbax version has none, saves stay replica-parallel (`single_writer_available()` says
which).
"""

from __future__ import annotations

from typing import Any

__all__ = ["single_writer_available", "writer"]


def _metadata_store() -> Any:
    """Orbax's default array-metadata store from its public options, or None."""
    try:
        from orbax.checkpoint.experimental.v1 import options
    except ImportError:
        return None
    return getattr(options.ArrayOptions.Saving(), "array_metadata_store", None)


def single_writer_available() -> bool:
    """Whether saves of one process write each replicated array once (this Orbax has the
    public store the single-writer handler needs)."""
    return _metadata_store() is not None


def writer(orbax_own: Any) -> Any:
    """Orbax's jax.Array handler `orbax_own`, its saves in a one-process job single-writer."""
    import jax
    import orbax.checkpoint as ocp

    store = _metadata_store()
    if store is None:
        return orbax_own
    single = ocp.type_handlers.ArrayHandler(use_replica_parallel=False, array_metadata_store=store)

    class SingleWriter(ocp.type_handlers.TypeHandler):
        """Orbax's jax.Array handler; in one process, each array saved from one replica."""

        def typestr(self) -> str:
            return orbax_own.typestr()

        def has_dispatcher(self) -> bool:
            return orbax_own.has_dispatcher()

        async def metadata(self, infos: Any) -> Any:
            return await orbax_own.metadata(infos)

        async def serialize(self, values: Any, infos: Any, args: Any = None) -> Any:
            # Decided per save: the job's processes are known once JAX is initialised.
            handler = single if jax.process_count() == 1 else orbax_own
            return await handler.serialize(values, infos, args)

        async def deserialize(self, infos: Any, args: Any = None) -> Any:
            return await orbax_own.deserialize(infos, args)

        def finalize(self, directory: Any) -> None:
            orbax_own.finalize(directory)

        def __getattr__(self, name: str) -> Any:
            # Whatever else Orbax asks of its jax.Array handler (e.g. its array-metadata
            # store, read from disk after a save) is answered by its own handler.
            return getattr(orbax_own, name)

    return SingleWriter()
