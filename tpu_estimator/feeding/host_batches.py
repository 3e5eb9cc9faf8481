"""Host batches from an `input_fn`: normalised, shape-checked, padded at the end.

An element of the input is `features` or `(features, labels)`, each an
array or a dict of arrays (anything `np.asarray` takes). Every batch must
have the shape of the first; only the final batch may be shorter, and it is
padded (evaluate/predict) or dropped with a warning (train).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Iterable, Iterator, Mapping, TypeAlias, Union

import jax
import numpy as np

from tpu_estimator.api.checks import message
from tpu_estimator.api.contracts import ArrayTree, BatchAxis

log = logging.getLogger("tpu_estimator")

# features or labels on the host, once normalised: an array or a dict of arrays (None: no labels)
HostArrays: TypeAlias = Union[np.ndarray, dict[str, np.ndarray], None]
# their batch axes: an int per array, with the same structure
Axes: TypeAlias = Union[int, dict[str, int], None]


@dataclasses.dataclass(frozen=True)
class HostBatch:
    """One step's batch on the host: `size` examples, of which the first `num_real` are real."""

    features: HostArrays
    labels: HostArrays
    num_real: int
    size: int

    @property
    def tree(self) -> tuple[HostArrays, HostArrays]:
        return (self.features, self.labels)


def as_iterable(dataset: Any) -> Iterable[ArrayTree]:
    """What `input_fn` returned, as an iterable (a tf.data.Dataset through as_numpy_iterator)."""
    if hasattr(dataset, "as_numpy_iterator"):
        return dataset.as_numpy_iterator()
    if not hasattr(dataset, "__iter__"):
        raise TypeError(
            message(
                "input_fn must return an iterable of batches: features or (features, labels), "
                "each an array or a dict of arrays.",
                f"{type(dataset).__name__}",
                "Return e.g. a generator, a list of batches, a grain DataLoader or a tf.data.Dataset.",
            )
        )
    return dataset


def split_element(element: ArrayTree) -> tuple[HostArrays, HostArrays]:
    """(features, labels) as numpy pytrees; labels None when absent."""
    if isinstance(element, tuple) and len(element) == 2:
        features, labels = element
    elif isinstance(element, (tuple, list)):
        raise ValueError(
            message(
                "An input batch must be `features` or a 2-tuple `(features, labels)`.",
                f"a {type(element).__name__} of length {len(element)}",
            )
        )
    else:
        features, labels = element, None
    return _to_numpy(features, "features"), _to_numpy(labels, "labels")


def _to_numpy(tree: ArrayTree, what: str) -> HostArrays:
    if tree is None:
        return None
    if isinstance(tree, dict):
        return {str(k): np.asarray(v) for k, v in tree.items()}
    return np.asarray(tree)


def batch_axes(batch_axis: BatchAxis, features: HostArrays, labels: HostArrays) -> tuple[Axes, Axes]:
    """Per-leaf batch axes from `batch_axis`: None (all 0), or (features, labels) with ints or dicts."""
    if batch_axis is None:
        return jax.tree.map(lambda _: 0, (features, labels))
    if not isinstance(batch_axis, (tuple, list)) or len(batch_axis) not in (1, 2):
        raise ValueError(
            message(
                "`batch_axis` must be a tuple (features_axis, labels_axis); each an int or, for "
                "dict features, a dict of ints.",
                f"batch_axis={batch_axis!r}",
            )
        )
    f_axis = batch_axis[0]
    l_axis = batch_axis[1] if len(batch_axis) == 2 else 0

    def expand(axis: int | Mapping[str, int], tree: HostArrays, what: str) -> Axes:
        if tree is None:
            return None
        if isinstance(axis, Mapping):
            if not isinstance(tree, dict) or set(axis) != set(tree):
                raise ValueError(
                    message(
                        f"A dict in `batch_axis` must have exactly the keys of the {what}.",
                        f"batch_axis keys {sorted(axis)}, {what} keys "
                        f"{sorted(tree) if isinstance(tree, dict) else type(tree).__name__}",
                    )
                )
            return {k: int(axis[k]) for k in tree}
        return jax.tree.map(lambda _: int(axis), tree)

    return expand(f_axis, features, "features"), expand(l_axis, labels, "labels")


class HostBatches:
    """Iterates validated `HostBatch`es of `batch_size` examples from an input iterable."""

    def __init__(
        self,
        iterable: Iterable[ArrayTree],
        *,
        batch_size: int | None,
        batch_axis: BatchAxis,
        pad_final: bool,
        pulls: int = 1,
        features_fn: Callable[[HostArrays], HostArrays] | None = None,
    ) -> None:
        self._it = iter(iterable)
        self._features_fn = features_fn
        self._batch_size = batch_size
        self._batch_axis = batch_axis
        self._pad_final = pad_final
        self._pulls = pulls
        self._first: tuple[HostArrays, HostArrays] | None = None
        self.axes: tuple[Axes, Axes] | None = None
        self._peeked: tuple[HostArrays, HostArrays] | None = None
        self._done = False

    def _next_raw(self) -> tuple[HostArrays, HostArrays] | None:
        if self._peeked is not None:
            out, self._peeked = self._peeked, None
            return out
        parts = []
        for _ in range(self._pulls):
            try:
                features, labels = split_element(next(self._it))
            except StopIteration:
                break
            parts.append((features if self._features_fn is None else self._features_fn(features), labels))
        if not parts:
            return None
        if len(parts) == 1:
            return parts[0]
        axes = self.axes or batch_axes(self._batch_axis, *parts[0])
        return jax.tree.map(lambda a, *xs: np.concatenate(xs, axis=a), axes, *parts)

    def __iter__(self) -> Iterator[HostBatch]:
        return self

    def __next__(self) -> HostBatch:
        if self._done:
            raise StopIteration
        tree = self._next_raw()
        if tree is None:
            self._done = True
            raise StopIteration
        if self._first is None:
            self._first = tree
            self.axes = batch_axes(self._batch_axis, *tree)
        n = self._check(tree)
        if self._batch_size is None:  # the input decides (use_tpu=False without a batch size)
            self._batch_size = n
        if n == self._batch_size:
            return HostBatch(tree[0], tree[1], n, n)
        # A short batch must be the last one.
        self._peeked = self._next_raw()
        if self._peeked is not None:
            raise ValueError(
                message(
                    "Only the final batch of the input may be smaller than the batch size.",
                    f"a batch of {n} examples followed by more input (batch size {self._batch_size})",
                    "Make input_fn yield batches of params['batch_size'] examples.",
                )
            )
        self._done = True
        if not self._pad_final:
            log.warning(
                "Dropped the final training batch of %d examples (batch size %d).", n, self._batch_size
            )
            raise StopIteration
        padded = jax.tree.map(
            lambda a, x: _pad(x, a, self._batch_size), self.axes, tree
        )
        return HostBatch(padded[0], padded[1], n, self._batch_size)

    def _check(self, tree: tuple[HostArrays, HostArrays]) -> int:
        """Number of examples in `tree`; raises on a structure or shape change."""
        first = self._first
        if jax.tree.structure(tree) != jax.tree.structure(first):
            raise ValueError(
                message(
                    "Every input batch must have the same structure (features/labels keys).",
                    f"{jax.tree.structure(tree)} after {jax.tree.structure(first)}",
                )
            )
        sizes = set()
        paths = jax.tree_util.tree_flatten_with_path(tree)[0]
        for (path, x), a, f in zip(paths, jax.tree.leaves(self.axes), jax.tree.leaves(first)):
            name = _name(path)
            if x.ndim <= a:
                raise ValueError(
                    message(
                        f"Input `{name}` must have a batch dimension (axis {a}).",
                        f"shape {x.shape}",
                        "Batch the input (e.g. arrays of shape [batch, ...]); reshape scalars to [batch].",
                    )
                )
            rest, first_rest = _without(x.shape, a), _without(f.shape, a)
            if rest != first_rest or x.dtype != f.dtype:
                raise ValueError(
                    message(
                        f"Input `{name}` changed shape or dtype between batches (each new shape "
                        "would compile a new program).",
                        f"{x.dtype}{list(x.shape)} after {f.dtype}{list(f.shape)}",
                        "Make every batch the same shape (pad or bucket in input_fn).",
                    )
                )
            sizes.add(x.shape[a])
        if len(sizes) != 1:
            raise ValueError(
                message(
                    "All features and labels of a batch must have the same batch size.",
                    f"batch sizes {sorted(sizes)}",
                )
            )
        n = sizes.pop()
        if self._batch_size is not None and n > self._batch_size:
            raise ValueError(
                message(
                    "input_fn yielded a batch larger than params['batch_size'].",
                    f"{n} examples, params['batch_size']={self._batch_size // self._pulls}",
                    "Batch with params['batch_size'].",
                )
            )
        return n


def _without(shape: tuple[int, ...], axis: int) -> tuple[int, ...]:
    return shape[:axis] + shape[axis + 1 :]


def _pad(x: np.ndarray, axis: int, size: int) -> np.ndarray:
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, size - x.shape[axis])
    return np.pad(x, widths)


def _name(path: jax.tree_util.KeyPath) -> str:
    keys = [str(getattr(p, "key", getattr(p, "idx", p))) for p in path]
    head = {"0": "features", "1": "labels"}.get(keys[0], keys[0]) if keys else "input"
    return "/".join([head, *keys[1:]])
