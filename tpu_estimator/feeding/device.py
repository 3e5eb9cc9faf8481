"""Host numpy batches to global device arrays, sharded on "data" along their batch axis."""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from tpu_estimator.api.contracts import PyTree
from tpu_estimator.parallel.mesh import DATA, Topology

if TYPE_CHECKING:
    from jax.typing import ArrayLike, DTypeLike

# Most bytes of stacked input one program receives; a longer loop is fed in chunks. With the
# feeder one chunk ahead and at most two chunks queued (estimator/inflight.py), ~3 chunks are
# alive. Quiet machine, benchmarks/one_process.py (MLP, 0.8 MB batches, 100-step loops):
# peak RSS 1.09x a hand-written per-step process's at 8 MB, 1.15x at 16 MB, 1.27x at 32 MB;
# benchmarks/loops.py's CNN evaluate/predict (1.5 MB batches): 0.91/0.95 of the hand-written
# loop at 8 MB, 0.94/0.93 at 16 MB, 0.98/0.97 at 32 MB (+-0.03 run to run; RESULTS.md).
MAX_CHUNK_BYTES = 16 << 20
# XLA:CPU takes a host buffer aligned to this many bytes as the device array, without a copy.
ALIGNMENT = 64


def chunk_steps(size: int, per_batch: int, max_bytes: int = MAX_CHUNK_BYTES) -> int:
    """Batches per stacked chunk of a loop of `size` batches of `per_batch` bytes: at most
    `max_bytes` each, of equal length where a divisor of `size` allows it (one compiled
    scan length), else of two lengths.

    >>> chunk_steps(100, 800 << 10), chunk_steps(101, 800 << 10), chunk_steps(100, 1)
    (20, 21, 100)
    """
    fewest = min(size, max(1, -(-size * per_batch // max_bytes)))
    for pieces in range(fewest, min(size, 2 * fewest) + 1):
        if size % pieces == 0:
            return size // pieces
    return -(-size // fewest)


def batch_specs(axes: PyTree, *, leading: int = 0, replicated: bool = False) -> PyTree:
    """PartitionSpecs for a batch pytree whose leaves' batch axes are `axes`."""

    def spec(axis: int) -> P:
        if replicated:
            return P()
        return P(*([None] * (leading + axis)), DATA)

    return jax.tree.map(spec, axes)


def stack(trees: list[PyTree]) -> PyTree:
    """The trees' leaves stacked on a new leading axis (the input of a scanned loop).

    Each stacked leaf is written once, into 64-byte aligned memory (`aligned_empty`),
    which XLA:CPU then takes as the device array without a second copy: a chunk of 25
    MLP batches (20 MB) costs 20 MB, not 40, while it is made and while it waits to
    run. On other devices the buffer is copied as any array; nothing else keeps it.
    """

    def one(*leaves: ArrayLike) -> np.ndarray:
        first = np.asarray(leaves[0])
        out = aligned_empty((len(leaves), *first.shape), first.dtype)
        np.stack(leaves, out=out)
        return out

    return jax.tree.map(one, *trees)


def aligned_empty(shape: tuple[int, ...], dtype: DTypeLike) -> np.ndarray:
    """An uninitialised array whose data starts at a 64-byte boundary: XLA:CPU's
    device_put keeps such a host buffer as the device array itself, and copies numpy's
    own arrays (16-byte aligned). The memory comes from malloc's heap, so a loop's next
    chunk reuses the pages of the last one (a fresh memory map per chunk cost ~1 ms per
    MB in page faults here: 20 ms for a 20 MB chunk, against 3 ms to write it)."""
    dtype = np.dtype(dtype)
    size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if dtype.hasobject or size == 0:  # (no raw bytes under Python objects)
        return np.empty(shape, dtype)
    raw = np.empty(size + ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    return raw[start : start + size].view(dtype).reshape(shape)


class Placer:
    """Places host arrays (this host's part of the global batch) on the mesh as `specs` say.

    The shardings are built once. On one host a group of batches is placed with
    one `device_put` call (the feeder's per-step cost); on several, one call per array.
    """

    def __init__(self, specs: PyTree, topology: Topology) -> None:
        self._shardings = jax.tree.map(
            lambda spec: NamedSharding(topology.mesh, spec), specs, is_leaf=lambda x: isinstance(x, P)
        )

    def __call__(self, tree: PyTree) -> PyTree:
        return self.many([tree])[0]

    def many(self, trees: list[PyTree]) -> list[PyTree]:
        """Places several trees of this structure in one call (one `device_put` on one host:
        the per-call overhead, ~40 us of Python, is paid once per group, not per batch)."""
        if jax.process_count() == 1:
            return jax.device_put(list(trees), [self._shardings] * len(trees))
        return [
            jax.tree.map(
                lambda x, sharding: jax.make_array_from_process_local_data(sharding, x), tree, self._shardings
            )
            for tree in trees
        ]
