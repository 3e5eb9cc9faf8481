"""Chosen rows of a saved array, read straight from the checkpoint with TensorStore.

A restore that places a large array (an embedding table) differently from how
it was saved reads, for each of its devices, only the rows that device holds:
`SavedRows.read(rows, out)` fills `out` one saved chunk at a time, so the host
holds the rows asked for plus a decoded chunk; a device holding some columns of every
row (a column-sharded table) reads only those columns (Orbax writes a chunk per saved
device shard; `Checkpointer` asks for at most `CHUNK_BYTES`: `chunked_save_args`).
The TensorStore spec is Orbax's own (`ocp.type_handlers.get_json_tspec_read`),
so local paths and object stores (gs://) alike are read as Orbax reads them.
"""

from __future__ import annotations

import json
from typing import Any, Callable

import numpy as np
from etils import epath

from tpu_estimator import storage

CHUNK_BYTES = 2 << 20  # the largest chunk of a saved array that `chunked_save_args` asks for
CACHE_BYTES = 4 << 20  # TensorStore's cache of the OCDBT B-tree while rows are read


class SavedRows:
    """One saved array (a leaf of `state_metadata`), opened for row reads."""

    def __init__(
        self, leaf: Any, *, use_ocdbt: bool, use_zarr3: bool, ts_context: Any,
        empty: Callable[..., np.ndarray] = np.empty, release: Callable[[], Any] | None = None,
    ) -> None:
        import orbax.checkpoint as ocp
        import tensorstore as ts

        info = ocp.type_handlers.ParamInfo(
            name=leaf.name, parent_dir=epath.Path(leaf.directory), is_ocdbt_checkpoint=use_ocdbt,
            use_zarr3=use_zarr3, ts_context=ts_context,
        )
        spec = ocp.type_handlers.get_json_tspec_read(info, use_ocdbt=use_ocdbt)
        self._store = ts.open(spec, context=ts_context, open=True, read=True).result()
        self.shape = tuple(self._store.shape)
        self.dtype = np.dtype(self._store.dtype.numpy_dtype)
        chunk = self._store.chunk_layout.read_chunk.shape
        self.chunk_rows = int(chunk[0]) if chunk and chunk[0] else max(self.shape[0], 1)
        self._empty, self._release = empty, release

    def empty(self, rows: int, columns: tuple[slice, ...] = ()) -> np.ndarray:
        """A zeroed host buffer of `rows` rows of this array (from the opener's `empty`), of
        the part `columns` (slices of the trailing dimensions) of each row."""
        out = self._empty((rows, *_part_shape(self.shape[1:], columns)), self.dtype)
        out.fill(0)
        return out

    def read(self, rows: np.ndarray, out: np.ndarray, columns: tuple[slice, ...] = ()) -> np.ndarray:
        """`out[i] = saved[rows[i]][columns]` for each `rows[i] >= 0` (others are left as they
        are; `columns`: slices of the trailing dimensions, () for whole rows): only those
        rows and columns are read, one saved chunk's rows per read, the opener's `release()`
        after each. Returns `out`."""
        rows = np.asarray(rows, np.int64)
        wanted = np.flatnonzero(rows >= 0)
        order = wanted[np.argsort(rows[wanted], kind="stable")]
        if order.size == 0:
            return out
        chunks = rows[order] // self.chunk_rows
        starts = np.flatnonzero(np.diff(chunks, prepend=chunks[0] - 1))
        for lo, hi in zip(starts, [*starts[1:], order.size]):
            at, source = order[lo:hi], rows[order[lo:hi]]
            if source[-1] - source[0] == source.size - 1:  # a run: one slice
                out[at] = self._store[(slice(int(source[0]), int(source[-1]) + 1), *columns)].read().result()
            else:
                out[at] = self._store[(source, *columns)].read().result()
            if self._release is not None:
                self._release()
        return out


def opener(
    checkpoint_path: str, *, empty: Callable[..., np.ndarray] = np.empty, release: Callable[[], Any] | None = None
) -> Callable[[Any], SavedRows]:
    """`open(leaf)` -> SavedRows for the leaves (ArrayMetadata) of the state saved in
    checkpoint `checkpoint_path`, sharing one TensorStore context. `empty(shape, dtype)`
    makes the host buffers rows are read into (the caller's: e.g. 64-byte aligned, which
    XLA:CPU keeps as the device array); `release()` runs after each chunk read (e.g.
    `malloc_trim`: TensorStore's threads free the decoded chunks into their own glibc
    arenas, which keep them)."""
    import orbax.checkpoint as ocp

    state = epath.Path(checkpoint_path) / "state"
    use_ocdbt = bool(ocp.type_handlers.is_ocdbt_checkpoint(state))
    use_zarr3 = bool(_pytree_metadata(state).get("use_zarr3", False))
    context = read_context()
    return lambda leaf: SavedRows(
        leaf, use_ocdbt=use_ocdbt, use_zarr3=use_zarr3, ts_context=context, empty=empty, release=release
    )


def read_context() -> Any:
    """The TensorStore context of reads straight from a checkpoint: a small OCDBT cache
    (Orbax's get_ts_context allows 100 MB: the B-tree's nodes are worth keeping, the
    chunks are read once each), and retries within `storage_timeout_s` (not TensorStore's
    default ~15 min)."""
    import tensorstore as ts

    return ts.Context({
        "cache_pool#ocdbt": {"total_bytes_limit": CACHE_BYTES},
        "gcs_request_retries": storage.client_retries(storage.timeout_s()),
    })


def chunked_save_args(state: Any, *, chunk_bytes: int = CHUNK_BYTES) -> Any:
    """Orbax `SaveArgs` for `state` (a pytree of arrays) that keep each array's saved
    chunks at most `chunk_bytes` (default ones for smaller arrays: a chunk per device shard),
    so a row read never decodes more than that, whatever device count saved it."""
    import jax
    import orbax.checkpoint as ocp

    def args(x: Any) -> Any:
        dtype = getattr(x, "dtype", np.float32)
        if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):  # typed keys (no numpy dtype): small
            return ocp.SaveArgs()
        size = int(np.prod(np.shape(x), dtype=np.int64)) * np.dtype(dtype).itemsize
        return ocp.SaveArgs(chunk_byte_size=chunk_bytes) if size > chunk_bytes else ocp.SaveArgs()

    return jax.tree.map(args, state)


def _part_shape(shape: tuple[int, ...], part: tuple[slice, ...]) -> tuple[int, ...]:
    """The shape of `x[part]` for an `x` of `shape` (`part`: slices of its leading dimensions)."""
    sizes = [len(range(*s.indices(n))) for s, n in zip(part, shape)]
    return (*sizes, *shape[len(sizes) :])


def _pytree_metadata(state: epath.Path) -> dict[str, Any]:
    """Orbax's `_METADATA` of a saved pytree (its format: zarr v2 or v3, OCDBT); {} without one."""
    try:  # one read, no existence check first (a request of its own on an object store)
        return dict(json.loads((state / "_METADATA").read_text()))
    except FileNotFoundError:
        return {}
