"""Saved tables read straight into this topology's shards: no host holds a whole table.

A table saved on N devices with one partition strategy and restored onto N'
devices with another (embedding/layout.py) changes which rows each device
holds. `read_sharded` builds the restored array block by block: for the
storage rows `[start, stop)` of a block this host's devices hold (each distinct block
read once, then put on each device holding it), `source_rows` names the saved
storage row of each (through the logical row), and the checkpoint reader
(checkpoint/row_reads.py `SavedRows`) reads only those, one saved chunk at a
time. A host's peak memory is its own shards plus one block being filled plus a
decoded chunk or two, whatever the table's size.
"""

from __future__ import annotations

from typing import Any, Protocol

import jax
import numpy as np
from jax.sharding import Sharding

from tpu_estimator.embedding.layout import MemberLayout, TableLayout


class RowReader(Protocol):
    """What `read_sharded` reads: a saved array's rows (checkpoint/row_reads.py `SavedRows`)."""

    shape: tuple[int, ...]
    dtype: np.dtype

    def empty(self, rows: int, columns: tuple[slice, ...] = ()) -> np.ndarray:
        """A zeroed host buffer of `rows` rows (of the part `columns` of each)."""
        ...

    def read(self, rows: np.ndarray, out: np.ndarray, columns: tuple[slice, ...] = ()) -> np.ndarray:
        """`out[i] = saved[rows[i]][columns]` for each `rows[i] >= 0`."""
        ...


def logical_rows(layout: TableLayout | MemberLayout, start: int, stop: int) -> np.ndarray:
    """The logical row held at each storage row `[start, stop)` of `layout` (>= vocabulary_size:
    a padding row, or another table's of a stack)."""
    storage = np.arange(start, stop, dtype=np.int64)
    if isinstance(layout, MemberLayout):  # a stacked table: its rows from `start` on
        logical = storage - layout.start
        return np.where((logical >= 0) & (logical < layout.vocabulary_size), logical, layout.vocabulary_size)
    if layout.strategy == "mod":
        shard, local = np.divmod(storage, layout.rows_per_shard)
        return local * layout.num_shards + shard
    return storage


def source_rows(
    saved: TableLayout | MemberLayout, target: TableLayout | MemberLayout, start: int, stop: int
) -> np.ndarray:
    """For the storage rows `[start, stop)` of `target`, the storage row of `saved` holding
    the same logical row (-1 for padding rows: they stay zero)."""
    logical = logical_rows(target, start, stop)
    out = np.full(logical.shape, -1, np.int64)
    valid = logical < min(saved.vocabulary_size, target.vocabulary_size)
    shard, local = saved.place(logical[valid])
    out[valid] = shard * saved.rows_per_shard + local
    return out


def _blocks(sharding: Sharding, shape: tuple[int, ...]) -> list[tuple[Any, list[Any]]]:
    """(index, devices holding it) of each distinct block of `shape` this process's devices hold."""
    holders: dict[tuple[tuple[int, int, int], ...], tuple[Any, list[Any]]] = {}
    for device, index in sharding.addressable_devices_indices_map(shape).items():
        key = tuple(s.indices(n) for s, n in zip(index, shape))  # (slices are unhashable before 3.12)
        holders.setdefault(key, (index, []))[1].append(device)
    return list(holders.values())


def _placed(shape: tuple[int, ...], sharding: Sharding, blocks: list[tuple[list[Any], Any]]) -> list[Any]:
    """Each block put on each device holding it, one block on the host at a time (`blocks`
    yields (devices, host block) lazily)."""
    shards = []
    for devices, block in blocks:
        shards += jax.block_until_ready([jax.device_put(block, device) for device in devices])
        del block  # placed: the next block replaces it
    return jax.make_array_from_single_device_arrays(shape, sharding, shards)


def read_sharded(reader: RowReader, saved: TableLayout, target: TableLayout, sharding: Sharding) -> jax.Array:
    """The saved table (or slot) `reader` in `target`'s storage order, sharded by `sharding`:
    each distinct block this process's devices hold is read once, into one host buffer, and
    put on every device holding it (a replicated table: read once per host, not per device)."""
    shape = (target.storage_rows, *reader.shape[1:])

    def blocks() -> Any:
        for index, devices in _blocks(sharding, shape):
            start, stop, _ = index[0].indices(shape[0])
            columns = tuple(index[1:])  # a column-sharded table: this block's columns alone
            block = reader.empty(stop - start, columns)
            reader.read(source_rows(saved, target, start, stop), block, columns)
            yield devices, block
            del block  # placed: the next block replaces it (one at a time on the host)

    return _placed(shape, sharding, blocks())


def read_stacked(
    sources: list[tuple[RowReader, TableLayout | MemberLayout, MemberLayout]], sharding: Sharding,
    fresh: jax.Array | None = None,
) -> jax.Array:
    """A stack (embedding/tablewise.py) from its tables as saved, sharded by rows (`sharding`):
    `sources` gives each table's reader, saved layout and place in the stack; each distinct
    block of this process's devices is read once (the rows of its own tables alone) and put
    on every device holding it. With `fresh` (the stack as it is, e.g. just initialised:
    warm start of some of its tables), each block starts from its values there, so the rows
    of tables not in `sources` are kept; else zero."""
    reader, _, first = sources[0]
    shape = (first.storage_rows, *reader.shape[1:])
    start_from = {} if fresh is None else {s.device: s.data for s in fresh.addressable_shards}

    def blocks() -> Any:
        for index, devices in _blocks(sharding, shape):
            start, stop, _ = index[0].indices(shape[0])
            block = reader.empty(stop - start)  # (aligned: a CPU device may hold it without a copy)
            if fresh is not None:
                np.copyto(block, np.asarray(start_from[devices[0]]), casting="unsafe")
            for table_reader, saved, target in sources:
                if target.start < stop and target.start + target.vocabulary_size > start:
                    table_reader.read(source_rows(saved, target, start, stop), block)
            yield devices, block
            del block

    return _placed(shape, sharding, blocks())
