"""`Metric`: an immutable pytree of additive sufficient statistics.

A metric state holds only arrays whose values add when two states are merged
(sums of weights, confusion counts, threshold histograms), plus static
configuration (k, num_classes, ...) that must match for a merge. So a state can
be returned from a compiled program, stacked by `lax.scan`, sent to the host,
and merged there in any order and grouping with the same result.
"""

from __future__ import annotations

import dataclasses
import functools
from types import ModuleType
from typing import Any, Sequence, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from tpu_estimator.metrics._inputs import Scalar, is_traced, message

M = TypeVar("M", bound="Metric")


class Metric(struct.PyTreeNode):
    """Base class of every metric state (see the module docstring).

    Subclasses declare array fields (the statistics, pytree leaves) and
    static fields (`struct.field(pytree_node=False)`), and implement
    `compute`. `merge` adds the statistics, so it is exact and associative.
    States are built by the factories (`metrics.accuracy(...)`, ...), not by
    calling the classes.

    Example:
        >>> from tpu_estimator import metrics
        >>> a = metrics.accuracy([1, 2, 3], [1, 2, 0])
        >>> b = metrics.accuracy([4], [4])
        >>> a.merge(b).compute()
        0.75
        >>> metrics.Accuracy.reduce([a, b, b]).compute()
        0.8
    """

    def merge(self: M, other: M) -> M:
        """Returns the state of the union of both states' data.

        Runs on the host (numpy, float64) unless a statistic is traced; a
        state from a compiled program merges with one built with numpy.

        Raises:
            TypeError: `other` is not a state of the same metric.
            ValueError: the states differ in configuration or in statistic shapes.
        """
        _check_mergeable(self, other)
        if any(is_traced(x) for x in jax.tree.leaves((self, other))):
            return jax.tree.map(jnp.add, self, other)
        return jax.tree.map(lambda a, b: np.asarray(_host(a) + _host(b)), self, other)

    def compute(self) -> Scalar:
        """The metric's value: a Python float on the host, a JAX scalar when traced."""
        raise NotImplementedError(
            f"{type(self).__name__} does not implement compute(); subclasses of "
            "Metric must."
        )

    @classmethod
    def reduce(cls: type[M], states: Sequence[M]) -> M:
        """Merges a non-empty sequence of `cls` states (see `merge_all`).

        `Metric.reduce` accepts states of any one metric; a subclass, e.g.
        `Accuracy.reduce`, only its own states.
        """
        states = list(states)
        wrong = [s for s in states if not isinstance(s, cls)]
        if wrong:
            raise TypeError(
                message(
                    f"{cls.__name__}.reduce expects {cls.__name__} states.",
                    f"a state of type {type(wrong[0]).__name__}",
                    "Use merge_all(states) on the states of one metric.",
                )
            )
        return merge_all(states)

    def config(self) -> dict[str, Any]:
        """The static configuration (non-statistic fields) as a dict."""
        return {name: getattr(self, name) for name in _static_fields(type(self))}

    def describe(self) -> str:
        """Short text naming the metric and its configuration, for messages."""
        args = ", ".join(f"{k}={v!r}" for k, v in self.config().items())
        return f"{type(self).__name__}({args})"


def merge_all(states: Sequence[M]) -> M:
    """Merges a non-empty sequence of states of one metric into one state.

    Example:
        >>> from tpu_estimator import metrics
        >>> parts = [metrics.accuracy([1, 2], [1, 0]), metrics.accuracy([3], [3])]
        >>> round(metrics.merge_all(parts).compute(), 4)
        0.6667

    Raises:
        ValueError: `states` is empty, or the states do not merge (see `Metric.merge`).
        TypeError: an element is not a `Metric`, or the metrics differ.
    """
    states = list(states)
    if not states:
        raise ValueError(
            message(
                "merge_all expects at least one metric state.",
                "states=[]",
                "Skip metrics that saw no batch, or build one from a batch with weights=0.",
            )
        )
    return functools.reduce(lambda a, b: a.merge(b), states)


def merge_stacked(state: M, axis: int = 0) -> M:
    """Merges a state whose statistics carry an extra stacking axis.

    `lax.scan` (or `jnp.stack` over states) returns one state with every
    statistic stacked along `axis`; summing over that axis merges them.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from tpu_estimator import metrics
        >>> def step(carry, batch):
        ...     return carry, metrics.mean(batch)
        >>> _, stacked = jax.lax.scan(step, None, jnp.arange(6.0).reshape(3, 2))
        >>> metrics.merge_stacked(stacked).compute()
        2.5
    """
    if not isinstance(state, Metric):
        raise TypeError(
            message(
                "merge_stacked expects a Metric state with stacked statistics.",
                f"state of type {type(state).__name__}",
                "For a list of states use merge_all(states).",
            )
        )
    if any(is_traced(x) for x in jax.tree.leaves(state)):
        return jax.tree.map(lambda a: jnp.sum(a, axis=axis), state)
    return jax.tree.map(lambda a: np.asarray(np.sum(_host(a), axis=axis)), state)


def host_or_traced(state: M) -> tuple[ModuleType, M]:
    """(numpy, state with float64 numpy statistics), or (jax.numpy, state) if traced."""
    if any(is_traced(x) for x in jax.tree.leaves(state)):
        return jnp, state
    return np, jax.tree.map(_host, state)


def to_scalar(xp: ModuleType, value: Any) -> Any:
    """A Python float on the host; the JAX scalar itself inside a trace."""
    return float(value) if xp is np else value


def div_no_nan(xp: ModuleType, num: Any, den: Any) -> Any:
    """num / den, and 0 where den == 0 (TF's `div_no_nan`)."""
    safe = xp.where(den == 0, 1, den)
    return xp.where(den == 0, 0, num / safe)


def _host(a: Any) -> np.ndarray:
    return np.asarray(a, np.float64)


@functools.cache
def _static_fields(cls: type) -> tuple[str, ...]:
    return tuple(
        f.name
        for f in dataclasses.fields(cls)
        if not f.metadata.get("pytree_node", True)
    )


def _check_mergeable(a: Metric, b: Any) -> None:
    if type(a) is not type(b):
        got = b.describe() if isinstance(b, Metric) else type(b).__name__
        raise TypeError(
            message(
                f"{type(a).__name__}.merge expects another {type(a).__name__} state.",
                f"self={a.describe()}, other={got}",
                "Merge the states of each metric separately, e.g. "
                "{name: metrics.merge_all(s) for name, s in states_by_name.items()}.",
            )
        )
    if a.config() != b.config():
        raise ValueError(
            message(
                f"{type(a).__name__}.merge expects states with the same configuration.",
                f"self={a.describe()}, other={b.describe()}",
                "Build every state of one metric with the same arguments.",
            )
        )
    for name in (f.name for f in dataclasses.fields(a) if f.name not in a.config()):
        sa, sb = np.shape(getattr(a, name)), np.shape(getattr(b, name))
        if sa != sb:
            raise ValueError(
                message(
                    f"{type(a).__name__}.merge expects statistics of equal shapes.",
                    f"self.{name}.shape={sa}, other.{name}.shape={sb}",
                    "A state stacked by lax.scan or jnp.stack must be merged with "
                    "merge_stacked(state) first.",
                )
            )
