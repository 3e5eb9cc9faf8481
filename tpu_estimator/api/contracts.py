"""The user's functions as the estimator calls them, and the values they exchange.

`InputFn`, `MetricFn` and `HostCallFn` here, and `ModelFn` in api/spec.py (beside the
specs it returns), are `typing.Protocol`s for what the estimator accepts. Each of these
functions is called with the arguments it *names* (model_fn: `features` and any of
`labels, mode, params, config`; input_fn: any of `params, config, mode, input_context`),
or with a list of tensors by position / a dict by keyword (metric_fn, host_call's fn), so
no one signature fits them all: their `__call__` is written `(*args: Any, **kwargs: Any)`,
which type checkers read as `Callable[..., R]` (the typing spec's rule for that form).
A checker checks what the function returns; the estimator checks the argument names when
it is built (model/call.py, api/_spec_checks.py), with errors that name them.

Example:
  >>> def input_fn(params, input_context):  # any of params, config, mode, input_context
  ...     return [({"x": [[1.0]]}, [[0.0]])]  # batches of (features, labels)
  >>> fn: InputFn = input_fn  # a checker checks what it returns
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Mapping, Protocol, Sequence, Tuple, TypeAlias, Union

if TYPE_CHECKING:
    from jax.typing import ArrayLike

    from tpu_estimator.metrics import Metric

# Any JAX pytree (custom nodes such as TrainState or optax states included): for type
# checkers the same as Any; the name says that the value is a tree of arrays of any
# structure, walked with jax.tree, not an arbitrary object.
PyTree: TypeAlias = Any

# An array, or nested dicts (string keys), lists and tuples of arrays: features, labels,
# predictions and the tensors of metric_fn and host_call.
ArrayTree: TypeAlias = Union["ArrayLike", Mapping[str, "ArrayTree"], Sequence["ArrayTree"], None]

# TPUEstimator(batch_axis=...): (features' axis, labels' axis), each an int or, for dict
# features or labels, a dict of ints per key; None: axis 0 everywhere.
BatchAxis: TypeAlias = Union[Sequence[Union[int, Mapping[str, int]]], None]

# metric_fn's and host_call's tensors: a list passed by position, or a dict by keyword.
Tensors: TypeAlias = Union[Sequence["ArrayLike"], Mapping[str, "ArrayLike"]]

# What input_fn returns: an iterable (a generator, a list, a grain DataLoader, a
# tf.data.Dataset) of batches, each `features` or `(features, labels)`.
Batches: TypeAlias = Iterable[ArrayTree]


class InputFn(Protocol):
    """`input_fn([params], [config], [mode], [input_context]) -> Batches`.

    Takes any of `params` (a dict: the estimator's params with `batch_size` set),
    `config` (the `RunConfig`), `mode` (a `ModeKeys` value) and `input_context` (an
    `InputContext`), by name; returns an iterable of batches, each `features` or
    `(features, labels)`, where features and labels are arrays or dicts of arrays.
    """

    def __call__(self, *args: Any, **kwargs: Any) -> Batches: ...


class MetricFn(Protocol):
    """`metric_fn(*tensors)` or `metric_fn(**tensors) -> {name: Metric}`.

    Called with `TPUEstimatorSpec.eval_metrics`' tensors (a list by position, a dict by
    keyword), batch-major arrays of the whole global batch; returns a dict of name to
    `tpu_estimator.metrics.Metric`.
    """

    def __call__(self, *args: Any, **kwargs: Any) -> Mapping[str, Metric]: ...


class HostCallFn(Protocol):
    """`fn(*tensors)` or `fn(**tensors)`, called on the host; what it returns is ignored.

    Called with `TPUEstimatorSpec.host_call`'s tensors (a list by position, a dict by
    keyword) of each step, as numpy arrays whose first axis is the global batch.
    """

    def __call__(self, *args: Any, **kwargs: Any) -> object: ...


# `TPUEstimatorSpec(eval_metrics=(metric_fn, tensors), host_call=(fn, tensors))`.
EvalMetrics: TypeAlias = Tuple[MetricFn, Tensors]
HostCall: TypeAlias = Tuple[HostCallFn, Tensors]
