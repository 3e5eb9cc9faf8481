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


STRATEGIES = ("div", "mod")  # the strategy codes of a saved layout


def saved_layouts(layout: Mapping[str, Any]) -> dict[str, TableLayout]:
    """The row placement of each table of a saved `EmbeddingState.layout`
    (table -> int32 `[vocabulary_size, num_shards, strategy]`)."""
    out = {}
    for name, code in layout.items():
        vocabulary, shards, strategy = (int(v) for v in np.asarray(code).reshape(-1)[:3])
        out[name] = TableLayout(vocabulary, shards, STRATEGIES[strategy])
    return out
