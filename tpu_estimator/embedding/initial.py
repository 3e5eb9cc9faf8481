"""Initial tables drawn in place: each device computes only the rows (or columns) it holds.

`ShardedTables.build` draws each table with its initializer over the whole logical shape
`[vocabulary_size, dimension]` (so its values do not depend on the device count) and puts
it in storage order (embedding/layout.py) inside a jitted init. Left to itself, XLA
replicates the draw and the 'mod' permutation on every device: a whole table per device
and temporaries several times as large. `storage_order` pins each step to the table's
sharding instead: JAX's threefry draws are partitionable (`jax_threefry_partitionable`,
the default since JAX 0.5: an element's random bits depend on its index alone), so XLA
splits the draw by rows (or columns), and the 'mod' permutation becomes one all-to-all.
The values are those of the unsplit draw, exactly.

Per device, the init program then holds its shard plus a few shard-sized temporaries
(threefry's counters), whatever the device count: `compiled.memory_analysis()` in
tests/embedding/test_initial.py. An initializer XLA cannot split (e.g. orthogonal's QR)
is computed whole on each device, as before, and still placed by rows. A stack of
table-wise tables (`stack_in_place`) is drawn table by table on the one device holding
each.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from tpu_estimator.embedding.layout import TableLayout


def storage_order(logical: Any, layout: TableLayout, sharding: NamedSharding) -> Any:
    """`layout.to_storage(logical)` for a traced `[vocabulary_size, ...]` table, each step
    constrained to `sharding` (the table's: rows for "row" plans, columns for "column") so
    that each device computes only its part."""
    pin = lambda x: jax.lax.with_sharding_constraint(x, sharding)  # noqa: E731
    logical = pin(logical)
    if layout.num_shards == 1:  # one device, "column" or "replicated": the logical order
        return logical
    if layout.strategy == "div":
        return pin(_pad(logical, layout.storage_rows))
    # 'mod': logical row r * n + d is device d's local row r. The table padded to n blocks of
    # `block` rows (a multiple of n: a block per device), viewed as [block, n] x rest (row
    # r * n + d at [r, d]) and transposed to [n, block]: one all-to-all; device d keeps its
    # first rows_per_shard rows.
    n, rest = layout.num_shards, logical.shape[1:]
    block = n * -(-layout.vocabulary_size // (n * n))
    grid = pin(_pad(logical, n * block).reshape(block, n, *rest))
    moved = pin(jnp.swapaxes(grid, 0, 1))
    return pin(moved[:, : layout.rows_per_shard].reshape(layout.storage_rows, *rest))


def _pad(x: Any, rows: int) -> Any:
    """`x` with zero rows appended up to `rows`."""
    if rows == x.shape[0]:
        return x
    return jnp.concatenate([x, jnp.zeros((rows - x.shape[0], *x.shape[1:]), x.dtype)])


def stack_in_place(
    stack: Any, draw: Callable[[str, Any], Any], key: Any, mesh: Mesh, axes: tuple[str, ...], dtype: Any
) -> Any:
    """A stack of whole tables (embedding/tablewise.py) in storage order, sharded by rows over
    `axes`: each device draws only the tables packed onto it (`draw(table, key)`: its whole
    initial value, the same as on one device), one `lax.switch` branch per device, so no
    device computes another's tables."""
    rows, dim = stack.rows_per_shard, stack.config.dimension

    def block(device: int) -> Callable[[Any], Any]:
        def make(k: Any) -> Any:
            out = jnp.zeros((rows, dim), dtype)
            for table, member in stack.members:
                if member.device == device:
                    out = lax.dynamic_update_slice(out, draw(table, k).astype(dtype), (member.offset, 0))
            return out

        return make

    def body(k: Any) -> Any:
        index = lax.axis_index(axes if len(axes) > 1 else axes[0])
        return lax.switch(index, [block(d) for d in range(stack.num_shards)], k)

    return jax.shard_map(body, mesh=mesh, in_specs=P(), out_specs=P(axes), check_vma=False)(key)
