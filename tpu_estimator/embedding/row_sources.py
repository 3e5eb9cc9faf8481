"""What warm start places a table from, read by rows: no host holds a whole table.

Warm starting `embedding/<table>` from a tpu_estimator checkpoint reads, for each block
of rows (or columns) this host's devices hold, only those rows of the saved table
(`SavedTable`: the checkpoint's reader of the stored array and the storage order it was
saved in), through the restore's `read_sharded` (embedding/restore.py), whatever the
saved device count, strategy or plan. A source that holds the table whole anyway (an
export's safetensors, a TensorFlow checkpoint's variable, a dense variable renamed onto a
table) is read through `ArrayRows` the same way: the whole array plus one block. A
table-wise table (embedding/tablewise.py) is read into its stack over the stack's fresh
values (`place_stack`), saved plain or stacked alike.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
from jax.sharding import Sharding

from tpu_estimator.embedding.layout import MemberLayout, TableLayout
from tpu_estimator.embedding.restore import RowReader, read_sharded, read_stacked


@dataclasses.dataclass(frozen=True)
class SavedTable:
    """A saved table (or slot) to read by rows: `stored` reads the saved array (storage
    order of `layout`); `shape` is the logical table's, as warm start checks it."""

    stored: RowReader
    layout: TableLayout

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.layout.vocabulary_size, *self.stored.shape[1:])

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.stored.dtype)


class ArrayRows:
    """A whole host array as a `RowReader` (rows of the array, in its own order)."""

    def __init__(self, array: Any) -> None:
        self.array = np.asarray(array)
        self.shape, self.dtype = tuple(self.array.shape), self.array.dtype

    def empty(self, rows: int, columns: tuple[slice, ...] = ()) -> np.ndarray:
        return np.zeros((rows, *self.array[0:0][(slice(None), *columns)].shape[1:]), self.dtype)

    def read(self, rows: np.ndarray, out: np.ndarray, columns: tuple[slice, ...] = ()) -> np.ndarray:
        rows = np.asarray(rows, np.int64)
        valid = rows >= 0
        out[valid] = self.array[(rows[valid], *columns)]
        return out


def _rows_of(value: Any) -> tuple[RowReader, TableLayout | MemberLayout]:
    """A warm-start value's reader and the storage order it reads in."""
    if isinstance(value, SavedTable):
        return value.stored, value.layout
    rows = ArrayRows(value)
    return rows, TableLayout(rows.shape[0], 1, "div")


def place_rows(value: Any, target: TableLayout, sharding: Sharding) -> jax.Array:
    """A warm-start value (a `SavedTable`, or a whole logical array) in `target`'s storage
    order, sharded by `sharding`: each distinct block of this host's devices read once."""
    return read_sharded(*_rows_of(value), target, sharding)


def place_stack(chosen: list[tuple[Any, MemberLayout]], fresh: jax.Array, sharding: Sharding) -> jax.Array:
    """The stack `fresh` (embedding/tablewise.py) with the tables `chosen` (each a warm-start
    value as `place_rows` takes, and its place in the stack) read over their rows, the other
    tables' rows kept: each distinct block of this host's devices read once."""
    return read_stacked([(*_rows_of(value), member) for value, member in chosen], sharding, fresh)
