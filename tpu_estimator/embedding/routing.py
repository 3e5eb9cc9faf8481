"""Ids routed to the devices owning their rows: one device's side of the all-to-alls.

Inside `shard_map` over one axis of N devices, each device both holds 1/N of
every table (rows) and is one replica (its own examples). For one table (or a
group of tables of one dimension whose blocks sit one after another on each
device, embedding/fused.py: `Shards`, `plan_keys`), a device:

1. deduplicates the ids of its own examples (all features of the table) on
   their storage rows: at most M = examples x ids per example (summed over
   the features) unique ids, a static bound; sorted, so grouped by owner;
2. numbers each unique id within its owner: (owner, rank);
3. sends round k's requests, ranks in `[k*C, (k+1)*C)`, as a `[N, C]` buffer
   of local rows, one `lax.all_to_all` (fixed shapes); the owners answer with
   the rows, `[N, C, dim]`, another `all_to_all` back.

C, the capacity per (device, owner) pair, is `ceil(capacity_factor * M / N)`
(at most M), so a buffer holds about `capacity_factor * M` ids or rows at any
N: the bytes per device do not grow with the device count (while M >= N; with
fewer ids than devices C is 1 and the `[N, 1]` buffers grow with N). The number
of rounds is agreed by all devices (`pmax` of the largest per-owner count / C):
one when ids are spread over the owners ('mod' placement, hashed or uniform
ids), more when one device's unique ids crowd one owner ('div' placement of
popular low ids). Nothing is dropped or clipped: the worst case (all of a
device's M unique ids on one owner) takes `ceil(M / C)` ~ N / capacity_factor
rounds, about the all-gather scheme's bytes, in a loop.

Gradients travel back the same way: with one round (`send_gradients_once`)
the owner deduplicates the `N * C` rows it received and sums their gradients
(a lazy update touches those rows only); with more (`send_gradients_dense`)
it adds every round's into a dense gradient of its shard and a touched mask
(the update then reads and writes the whole shard; lazy rules keep the
untouched rows). The compiled step holds both backward forms (a
`lax.cond`): its HLO lists three row exchanges, of which a one-round step runs
two.

Why not `lax.ragged_all_to_all` (sizes exchanged, no padding): XLA:CPU does
not run it (UNIMPLEMENTED in jax 0.10.2 and 0.12), and its receive buffer
needs the same worst-case bound.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple, Protocol

import jax
import jax.numpy as jnp
from jax import lax

from tpu_estimator.embedding.layout import TableLayout


class Shards(Protocol):
    """Rows over `num_shards` devices, `rows_per_shard` on each: a `TableLayout`, or a group
    of tables whose blocks sit one after another on each device (embedding/fused.py)."""

    @property
    def num_shards(self) -> int: ...

    @property
    def rows_per_shard(self) -> int: ...

    @property
    def storage_rows(self) -> int: ...


class Route(NamedTuple):
    """Where one device's unique ids of one table go (arrays `[M]`, `rounds` a scalar).

    `unique` holds the distinct storage rows (owner * rows_per_shard + row),
    sorted, padded with `storage_rows`; `inverse` maps each id slot of the
    flattened features to its unique entry; `owner` is N for padding; `rank`
    numbers the ids of each owner from 0."""

    unique: Any
    inverse: Any
    owner: Any
    row: Any
    rank: Any
    rounds: Any  # the same on every device: rounds of C requests per owner


def capacity(num_ids: int, num_shards: int, factor: float) -> int:
    """C: the requests one device sends one owner per round."""
    return max(1, min(num_ids, math.ceil(factor * num_ids / num_shards)))


def storage_keys(layout: TableLayout, ids: Any) -> Any:
    """Each id's storage index (owner * rows_per_shard + local row); `storage_rows` for -1."""
    owner, row = layout.place(jnp.maximum(ids, 0))
    return jnp.where(ids >= 0, owner * layout.rows_per_shard + row, layout.storage_rows)


def plan(layout: TableLayout, ids: Any, axis: str, cap: int) -> Route:
    """The route of this device's `ids` (flat `[M]` ints, -1 padding) of one table."""
    return plan_keys(layout, storage_keys(layout, ids), axis, cap)


def plan_keys(layout: Shards, keyed: Any, axis: str, cap: int) -> Route:
    """The route of this device's ids given as storage indices `keyed` (flat `[M]`,
    `layout.storage_rows` for padding): of one table (`storage_keys`) or of several
    tables' blocks one after another on each device (embedding/fused.py).

    Deduplicated on the storage index, so the unique ids come sorted by owner and each
    one's rank is its position minus its owner's first."""
    n, size, pad = layout.num_shards, keyed.shape[0], layout.storage_rows
    unique, inverse = jnp.unique(keyed, size=size, fill_value=pad, return_inverse=True)
    owner = (unique // layout.rows_per_shard).astype(jnp.int32)  # N for padding
    counts = jnp.zeros(n + 1, jnp.int32).at[owner].add(1)
    starts = jnp.cumsum(counts) - counts
    rank = jnp.arange(size, dtype=jnp.int32) - starts[owner]
    rounds = lax.pmax(jnp.max(-(-counts[:n] // cap)), axis)
    row = (unique % layout.rows_per_shard).astype(jnp.int32)
    return Route(unique, inverse.reshape(-1), owner, row, rank, rounds)


def _in_round(route: Route, k: Any, n: int, cap: int) -> tuple[Any, Any, Any]:
    """(in round k?, owner, position in that owner's buffer) of each unique id; the owner is N
    (out of range: dropped by a scatter) when not in round k."""
    slot = route.rank - k * cap
    inside = (route.owner < n) & (slot >= 0) & (slot < cap)
    return inside, jnp.where(inside, route.owner, n), jnp.where(inside, slot, 0)


def _send(values: Any, dest: Any, slot: Any, n: int, cap: int, fill: Any) -> Any:
    """`[N, C, ...]` buffers of `values` placed at (dest, slot), sent to their owners: what
    every device sent this one, `[N, C, ...]` indexed by sender."""
    buffer = jnp.full((n, cap, *values.shape[1:]), fill, values.dtype)
    return buffer.at[dest, slot].set(values, mode="drop")


def _exchange(buffers: Any, axis: str) -> Any:
    return lax.all_to_all(buffers, axis, split_axis=0, concat_axis=0)


def fetch_rows(route: Route, layout: Shards, read: Callable[[Any], Any], axis: str, cap: int) -> Any:
    """`[M, dim]` rows of this device's unique ids (zeros for padding), from their owners;
    `read(asked)` gives this device's rows `[N, C, dim]` of local rows `asked` `[N, C]`
    (0 for the out-of-range `rows_per_shard`): `local_rows(block)` for one table."""
    n, pad = layout.num_shards, layout.rows_per_shard
    like = jax.eval_shape(read, jax.ShapeDtypeStruct((n, cap), jnp.int32))

    def one_round(carry: tuple[Any, Any]) -> tuple[Any, Any]:
        k, rows = carry
        inside, dest, slot = _in_round(route, k, n, cap)
        asked = _exchange(_send(route.row, dest, slot, n, cap, pad), axis)  # [N, C] rows others want
        answers = read(asked)  # [N, C, dim]
        got = _exchange(answers, axis)[jnp.where(inside, dest, 0), slot]
        return k + 1, jnp.where(inside[:, None], got, rows)

    rows = jnp.zeros((route.unique.shape[0], like.shape[-1]), like.dtype)
    _, rows = lax.while_loop(lambda c: c[0] < route.rounds, one_round, (jnp.int32(0), rows))
    return rows


def local_rows(block: Any) -> Callable[[Any], Any]:
    """`fetch_rows`' `read` of one table's block `[rows_per_shard, dim]`."""
    return lambda asked: block.at[asked].get(mode="fill", fill_value=0)


def send_gradients_once(route: Route, layout: Shards, grads: Any, axis: str, cap: int) -> tuple[Any, Any]:
    """One round (valid when `route.rounds <= 1`): (unique local rows `[N*C]` padded with
    `rows_per_shard`, their summed gradients `[N*C, dim]`) that the devices sent this owner."""
    n, pad = layout.num_shards, layout.rows_per_shard
    _, dest, slot = _in_round(route, 0, n, cap)
    rows = _exchange(_send(route.row, dest, slot, n, cap, pad), axis).reshape(-1)
    sent = _exchange(_send(grads, dest, slot, n, cap, 0.0), axis).reshape(rows.shape[0], -1)
    unique, inverse = jnp.unique(rows, size=rows.shape[0], fill_value=pad, return_inverse=True)
    return unique, jax.ops.segment_sum(sent, inverse.reshape(-1), num_segments=rows.shape[0])


def send_gradients_dense(route: Route, layout: Shards, grads: Any, axis: str, cap: int) -> tuple[Any, Any]:
    """Every round: (the summed gradient of each row of this owner's shard
    `[rows_per_shard, dim]`, which rows some device looked up `[rows_per_shard]`)."""
    n, rows_per_shard = layout.num_shards, layout.rows_per_shard

    def one_round(carry: tuple[Any, Any, Any]) -> tuple[Any, Any, Any]:
        k, dense, touched = carry
        _, dest, slot = _in_round(route, k, n, cap)
        rows = _exchange(_send(route.row, dest, slot, n, cap, rows_per_shard), axis).reshape(-1)
        sent = _exchange(_send(grads, dest, slot, n, cap, 0.0), axis).reshape(rows.shape[0], -1)
        dense = dense.at[rows].add(sent, mode="drop")
        return k + 1, dense, touched.at[rows].set(True, mode="drop")

    dense = jnp.zeros((rows_per_shard, grads.shape[1]), grads.dtype)
    touched = jnp.zeros(rows_per_shard, bool)
    _, dense, touched = lax.while_loop(lambda c: c[0] < route.rounds, one_round, (jnp.int32(0), dense, touched))
    return dense, touched
