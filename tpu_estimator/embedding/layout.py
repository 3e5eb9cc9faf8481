"""Where each table row lives: `partition_strategy` over N shards, and the storage order.

A table of V rows is stored as one array of `N * rows_per_shard` rows
(`rows_per_shard = ceil(V / N)`, the tail padded and never looked up), sharded
by rows over the N devices, so device d holds storage rows
`[d * rows_per_shard, (d+1) * rows_per_shard)`:

- 'div': logical row r is on device `r // rows_per_shard`, local row
  `r % rows_per_shard` (storage order = logical order);
- 'mod': logical row r is on device `r % N`, local row `r // N`.

`to_logical`/`to_storage` convert whole tables (checkpoints, warm start,
`get_variable_value`, serving see logical tables).

A table-wise table (embedding/tablewise.py) is one of the whole tables of a stack: its
`MemberLayout` places all its rows on one device, at an offset of the stack's block.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class TableLayout:
    """The row placement of one table of `vocabulary_size` rows over `num_shards` devices."""

    vocabulary_size: int
    num_shards: int
    strategy: str = "div"

    @property
    def rows_per_shard(self) -> int:
        return -(-self.vocabulary_size // self.num_shards)

    @property
    def storage_rows(self) -> int:
        return self.rows_per_shard * self.num_shards

    def place(self, ids: Any) -> tuple[Any, Any]:
        """(shard, local row) of each id (jnp or np ints; ids must be in range)."""
        if self.strategy == "mod":
            return ids % self.num_shards, ids // self.num_shards
        return ids // self.rows_per_shard, ids % self.rows_per_shard

    def to_storage(self, logical: Any) -> Any:
        """[V, ...] logical rows -> [storage_rows, ...] in storage order (jnp or np)."""
        xp = jnp if isinstance(logical, jnp.ndarray) and not isinstance(logical, np.ndarray) else np
        pad = self.storage_rows - self.vocabulary_size
        padded = xp.concatenate([logical, xp.zeros((pad, *logical.shape[1:]), logical.dtype)]) if pad else logical
        if self.strategy == "div":
            return padded
        rest = padded.shape[1:]
        grid = padded.reshape(self.rows_per_shard, self.num_shards, *rest)
        return xp.swapaxes(grid, 0, 1).reshape(self.storage_rows, *rest)

    def to_logical(self, storage: Any) -> np.ndarray:
        """[storage_rows, ...] -> the [V, ...] logical table (a numpy array on the host)."""
        storage = np.asarray(storage)
        if self.strategy == "mod":
            rest = storage.shape[1:]
            grid = storage.reshape(self.num_shards, self.rows_per_shard, *rest)
            storage = np.swapaxes(grid, 0, 1).reshape(self.storage_rows, *rest)
        return storage[: self.vocabulary_size]


@dataclasses.dataclass(frozen=True)
class MemberLayout:
    """A whole table of `vocabulary_size` rows on `device`, from local row `offset` of a stack
    of `rows_per_shard` rows per device over `num_shards` devices (embedding/tablewise.py):
    its logical row r is the stack's storage row `device * rows_per_shard + offset + r`."""

    vocabulary_size: int
    num_shards: int
    device: int
    offset: int
    rows_per_shard: int

    strategy = "div"  # the stack's storage order (device by device)

    @property
    def start(self) -> int:
        """The stack's storage row of logical row 0."""
        return self.device * self.rows_per_shard + self.offset

    @property
    def storage_rows(self) -> int:
        return self.rows_per_shard * self.num_shards

    def place(self, ids: Any) -> tuple[Any, Any]:
        """(shard, local row) of each id: all on `device`."""
        return ids * 0 + self.device, ids + self.offset

    def to_logical(self, storage: Any) -> np.ndarray:
        """The stack's `[storage_rows, ...]` -> this table's `[V, ...]` (a numpy array)."""
        return np.asarray(storage[self.start : self.start + self.vocabulary_size])


STRATEGIES = ("div", "mod")  # the strategy codes of a saved layout
TABLE_PLAN = 3  # plan.PLAN_CODES.index("table"): a stacked table's code is 7 ints


def code_of(layout: MemberLayout, strategy: int) -> np.ndarray:
    """A stacked table's saved code: `[vocabulary_size, N, strategy, TABLE_PLAN, device,
    offset, rows_per_shard]`."""
    return np.asarray([layout.vocabulary_size, layout.num_shards, strategy, TABLE_PLAN, layout.device,
                       layout.offset, layout.rows_per_shard], np.int32)


def saved_layouts(layout: Mapping[str, Any]) -> dict[str, TableLayout | MemberLayout]:
    """The row placement of each table of a saved `EmbeddingState.layout`: table -> int32
    `[vocabulary_size, num_shards, strategy, plan]`, and stack -> {table: `code_of`} for the
    tables stacked in the state's array `stack` (`storage_keys`)."""
    out: dict[str, TableLayout | MemberLayout] = {}
    for name, code in flat_codes(layout).items():
        values = [int(v) for v in np.asarray(code).reshape(-1)]
        if len(values) > 4 and values[3] == TABLE_PLAN:
            vocabulary, shards, _, _, device, offset, rows = values[:7]
            out[name] = MemberLayout(vocabulary, shards, device, offset, rows)
        else:
            out[name] = TableLayout(values[0], values[1], STRATEGIES[values[2]])
    return out


def flat_codes(layout: Mapping[str, Any]) -> dict[str, Any]:
    """table -> its code, the stacks' tables taken out of their stack."""
    out = {}
    for name, code in layout.items():
        out.update(code if isinstance(code, Mapping) else {name: code})
    return out


def storage_keys(layout: Mapping[str, Any]) -> dict[str, str]:
    """table -> the key of the state's array holding it: its own name, or its stack's."""
    return {
        t: name for name, code in layout.items() for t in (code if isinstance(code, Mapping) else [name])
    }
