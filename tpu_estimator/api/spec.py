"""`EstimatorSpec` and `TPUEstimatorSpec`: what a `model_fn` returns.

Both are validated at construction, per mode, as in TensorFlow; validation
reads only `.shape`, `.dtype` and `.ndim`, so a spec can be built while the
`model_fn` is traced by JAX (`jax.jit`, `jax.eval_shape`). Both are
immutable pytrees: the arrays (predictions, loss, metric and host_call
tensors, export outputs) are the leaves, everything else is static, so a
spec can be returned from a jitted function.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterable, Mapping, Protocol

import jax
import optax

from tpu_estimator.api import _spec_checks as checks
from tpu_estimator.api.checks import message
from tpu_estimator.api.contracts import ArrayTree, EvalMetrics, HostCall
from tpu_estimator.api.export_output import ExportOutput, describe
from tpu_estimator.api.mode_keys import ModeKeys
from tpu_estimator.api.scaffold import Scaffold
from tpu_estimator.api.session_run_hook import SessionRunHook

if TYPE_CHECKING:
    from jax.typing import ArrayLike

    from tpu_estimator.metrics import Metric


class _Spec:
    """Shared behaviour: `_replace`, a short repr, pytree flattening."""

    _DATA_FIELDS: ClassVar[tuple[str, ...]]  # hold arrays: pytree children
    _PAIR_FIELDS: ClassVar[tuple[str, ...]] = ()  # (fn, tensors): fn static, tensors children
    _default_export: bool

    def _replace(self, **changes: Any) -> Any:
        """A copy with `changes` applied, validated again. The mode cannot change."""
        names = [f.name for f in dataclasses.fields(self)]
        unknown = sorted(set(changes) - set(names))
        if unknown:
            raise ValueError(
                message(f"{type(self).__name__}._replace() takes only its fields.", f"{unknown}")
            )
        mode = changes.get("mode", self.mode)
        if not (isinstance(mode, str) and mode == self.mode):
            raise ValueError(
                message(
                    f"{type(self).__name__}._replace() cannot change the mode.",
                    f"mode={describe(mode)} for a spec in mode {self.mode!r}",
                    "Build a new spec for the other mode.",
                )
            )
        values = {n: getattr(self, n) for n in names}
        if self._default_export:
            values["export_outputs"] = None  # rebuilt from the (new) predictions
        values.update(changes)
        return type(self)(**values)

    def __repr__(self) -> str:
        parts = [f"mode={self.mode!r}"]
        for f in dataclasses.fields(self)[1:]:
            v = getattr(self, f.name)
            if v is None or (isinstance(v, tuple) and not v):
                continue
            if f.name in self._PAIR_FIELDS:
                fn, tensors = v
                v = f"({getattr(fn, '__name__', describe(fn))}, {_describe_all(tensors)})"
            elif isinstance(v, Mapping):
                v = _describe_all(v)
            elif isinstance(v, optax.GradientTransformation):
                v = type(v).__name__
            else:
                v = describe(v)
            parts.append(f"{f.name}={v}")
        return f"{type(self).__name__}({', '.join(parts)})"

    def _tree_flatten(self) -> tuple[tuple[Any, ...], Any]:
        children, static = [], []
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name in self._PAIR_FIELDS:
                static.append(None if v is None else v[0])
                children.append(None if v is None else v[1])
            elif f.name in self._DATA_FIELDS:
                children.append(v)
            else:
                static.append(v)
        return tuple(children), (tuple(static), self._default_export)

    @classmethod
    def _tree_unflatten(cls, aux: Any, children: tuple[Any, ...]) -> Any:
        static, default_export = aux
        static, children = iter(static), iter(children)
        obj = object.__new__(cls)  # no validation: leaves may be placeholders
        for f in dataclasses.fields(cls):
            if f.name in cls._PAIR_FIELDS:
                fn, tensors = next(static), next(children)
                v = None if fn is None else (fn, tensors)
            else:
                v = next(children) if f.name in cls._DATA_FIELDS else next(static)
            object.__setattr__(obj, f.name, v)
        object.__setattr__(obj, "_default_export", default_export)
        return obj


def _describe_all(values: Mapping[str, Any] | Iterable[Any]) -> str:
    if isinstance(values, Mapping):
        return "{" + ", ".join(f"{k!r}: {describe(x)}" for k, x in values.items()) + "}"
    return "[" + ", ".join(describe(x) for x in values) + "]"


def _set_all(obj: _Spec, values: dict[str, Any]) -> None:
    for name, value in values.items():
        object.__setattr__(obj, name, value)


@dataclasses.dataclass(frozen=True, init=False, eq=False, repr=False)
class EstimatorSpec(_Spec):
    """What a `model_fn` returns to a plain (non-TPU) estimator (seed `EstimatorSpec`).

    Required per mode: TRAIN needs `loss` and `train_op`; EVAL needs `loss`;
    PREDICT needs `predictions`. Other arguments may be given in any mode and
    are ignored where they do not apply (but are still validated).

    Args:
      mode: A `ModeKeys` value.
      predictions: An array or a dict of str to arrays; in PREDICT mode
        batch-major (rank >= 1, equal dim 0).
      loss: Floating-point array of shape [] or [1] ([1] is stored as []).
        Python numbers are refused: a loss must be computed from the model.
      train_op: An `optax.GradientTransformation`; the estimator computes the
        gradients of `loss` (averaged over replicas) and applies it.
      eval_metric_ops: Dict of name to `tpu_estimator.metrics.Metric`. The
        names 'loss' and 'global_step' are reserved.
      export_outputs: Dict of name to `ExportOutput`. A single head is also
        stored under 'serving_default'; several heads need one named
        'serving_default'. In PREDICT mode, None (or {}) means
        `{'serving_default': PredictOutput(predictions)}`.
      training_chief_hooks: `SessionRunHook`s run on the chief during training.
      training_hooks: `SessionRunHook`s run during training.
      scaffold: A `Scaffold`; None means `Scaffold()`.
      evaluation_hooks: `SessionRunHook`s run during evaluation.
      prediction_hooks: `SessionRunHook`s run during prediction.

    Raises:
      ValueError: if a required field is missing or a value is invalid.
      TypeError: if a field has the wrong type.

    Example:
      >>> import jax.numpy as jnp, optax
      >>> spec = EstimatorSpec(ModeKeys.TRAIN, loss=jnp.ones([1]), train_op=optax.sgd(0.1))
      >>> spec.loss.shape
      ()
    """

    _DATA_FIELDS: ClassVar[tuple[str, ...]] = (
        "predictions",
        "loss",
        "eval_metric_ops",
        "export_outputs",
    )

    mode: str
    predictions: ArrayTree
    loss: ArrayLike | None
    train_op: optax.GradientTransformation | None
    eval_metric_ops: dict[str, Metric] | None
    export_outputs: dict[str, ExportOutput] | None
    training_chief_hooks: tuple[SessionRunHook, ...]
    training_hooks: tuple[SessionRunHook, ...]
    scaffold: Scaffold
    evaluation_hooks: tuple[SessionRunHook, ...]
    prediction_hooks: tuple[SessionRunHook, ...]

    def __init__(
        self,
        mode: str,
        predictions: ArrayTree = None,
        loss: ArrayLike | None = None,
        train_op: optax.GradientTransformation | None = None,
        eval_metric_ops: Mapping[str, Metric] | None = None,
        export_outputs: Mapping[str, ExportOutput] | None = None,
        training_chief_hooks: Iterable[SessionRunHook] | None = None,
        training_hooks: Iterable[SessionRunHook] | None = None,
        scaffold: Scaffold | None = None,
        evaluation_hooks: Iterable[SessionRunHook] | None = None,
        prediction_hooks: Iterable[SessionRunHook] | None = None,
    ) -> None:
        mode = ModeKeys.validate(mode)
        checks.require_for_mode(mode, "EstimatorSpec", predictions, loss, train_op)
        if scaffold is None:
            scaffold = Scaffold()
        elif not isinstance(scaffold, Scaffold):
            raise TypeError(
                message(
                    "`scaffold` must be a tpu_estimator.Scaffold.", f"scaffold={describe(scaffold)}"
                )
            )
        predictions = checks.check_predictions(predictions, mode)
        export_outputs, default_export = checks.check_export_outputs(
            export_outputs, predictions, mode
        )
        _set_all(
            self,
            dict(
                mode=mode,
                predictions=predictions,
                loss=checks.check_loss(loss),
                train_op=checks.check_train_op(train_op),
                eval_metric_ops=checks.check_eval_metric_ops(eval_metric_ops),
                export_outputs=export_outputs,
                training_chief_hooks=checks.check_hooks(
                    training_chief_hooks, "training_chief_hooks"
                ),
                training_hooks=checks.check_hooks(training_hooks, "training_hooks"),
                scaffold=scaffold,
                evaluation_hooks=checks.check_hooks(evaluation_hooks, "evaluation_hooks"),
                prediction_hooks=checks.check_hooks(prediction_hooks, "prediction_hooks"),
                _default_export=default_export,
            ),
        )


@dataclasses.dataclass(frozen=True, init=False, eq=False, repr=False)
class TPUEstimatorSpec(_Spec):
    """What a `model_fn` returns to `TPUEstimator` (seed `TPUEstimatorSpec`).

    `mode`, `predictions`, `loss`, `train_op` and `export_outputs` are as in
    `EstimatorSpec`.

    Args:
      eval_metrics: `(metric_fn, tensors)`. `tensors` is a list (passed
        positionally) or a dict (passed by keyword) of batch-major arrays;
        the host concatenates them over replicas and calls `metric_fn`, which
        returns a dict of name to `tpu_estimator.metrics.Metric`.
      scaffold_fn: A zero-argument callable returning a `Scaffold`, run on the
        host. It must not capture arrays of the `model_fn`.
      host_call: `(fn, tensors)` like `eval_metrics`; tensors must have rank
        >= 1 (reshape scalars to [1]). The host calls `fn` with the tensors of
        each step (every `experimental_host_call_every_n_steps`) in train()
        and evaluate(); its return value is ignored.
      training_hooks, evaluation_hooks, prediction_hooks: `SessionRunHook`s.

    Raises:
      ValueError, TypeError: as `EstimatorSpec`, and when `eval_metrics` or
        `host_call` tensors do not fit their function's parameters.

    Example:
      >>> import jax.numpy as jnp
      >>> def metric_fn(labels, logits):
      ...     return {}
      >>> labels, logits = jnp.zeros(8, int), jnp.zeros((8, 10))
      >>> spec = TPUEstimatorSpec(ModeKeys.EVAL, loss=jnp.zeros(()),
      ...                         eval_metrics=(metric_fn, [labels, logits]))
      >>> spec.as_estimator_spec().eval_metric_ops
      {}
    """

    _DATA_FIELDS: ClassVar[tuple[str, ...]] = ("predictions", "loss", "export_outputs")
    _PAIR_FIELDS: ClassVar[tuple[str, ...]] = ("eval_metrics", "host_call")

    mode: str
    predictions: ArrayTree
    loss: ArrayLike | None
    train_op: optax.GradientTransformation | None
    eval_metrics: EvalMetrics | None
    export_outputs: dict[str, ExportOutput] | None
    scaffold_fn: Callable[[], Scaffold] | None
    host_call: HostCall | None
    training_hooks: tuple[SessionRunHook, ...]
    evaluation_hooks: tuple[SessionRunHook, ...]
    prediction_hooks: tuple[SessionRunHook, ...]

    def __init__(
        self,
        mode: str,
        predictions: ArrayTree = None,
        loss: ArrayLike | None = None,
        train_op: optax.GradientTransformation | None = None,
        eval_metrics: EvalMetrics | None = None,
        export_outputs: Mapping[str, ExportOutput] | None = None,
        scaffold_fn: Callable[[], Scaffold] | None = None,
        host_call: HostCall | None = None,
        training_hooks: Iterable[SessionRunHook] | None = None,
        evaluation_hooks: Iterable[SessionRunHook] | None = None,
        prediction_hooks: Iterable[SessionRunHook] | None = None,
    ) -> None:
        mode = ModeKeys.validate(mode)
        checks.require_for_mode(mode, "TPUEstimatorSpec", predictions, loss, train_op)
        predictions = checks.check_predictions(predictions, mode)
        export_outputs, default_export = checks.check_export_outputs(
            export_outputs, predictions, mode
        )
        _set_all(
            self,
            dict(
                mode=mode,
                predictions=predictions,
                loss=checks.check_loss(loss),
                train_op=checks.check_train_op(train_op),
                eval_metrics=checks.check_host_call(eval_metrics, "eval_metrics"),
                export_outputs=export_outputs,
                scaffold_fn=checks.check_scaffold_fn(scaffold_fn),
                host_call=checks.check_host_call(host_call, "host_call"),
                training_hooks=checks.check_hooks(training_hooks, "training_hooks"),
                evaluation_hooks=checks.check_hooks(evaluation_hooks, "evaluation_hooks"),
                prediction_hooks=checks.check_hooks(prediction_hooks, "prediction_hooks"),
                _default_export=default_export,
            ),
        )

    def as_estimator_spec(self) -> EstimatorSpec:
        """An equivalent `EstimatorSpec`: calls `metric_fn` and `scaffold_fn` now.

        `eval_metrics` becomes `eval_metric_ops` (metric_fn applied to the
        tensors: a list positionally, a dict by keyword); `scaffold_fn()`
        becomes `scaffold`; hooks carry over. `host_call` has no
        `EstimatorSpec` counterpart and is dropped: the estimator runs it
        from the `TPUEstimatorSpec` itself.

        Raises:
          TypeError: if `metric_fn` does not return a dict of Metrics, or
            `scaffold_fn` does not return a `Scaffold`.
        """
        eval_metric_ops = None
        if self.eval_metrics is not None:
            metric_fn, tensors = self.eval_metrics
            result = metric_fn(**tensors) if isinstance(tensors, dict) else metric_fn(*tensors)
            if not isinstance(result, Mapping):
                raise TypeError(
                    message(
                        "`metric_fn` (eval_metrics[0]) must return a dict of name to "
                        "tpu_estimator.metrics.Metric.",
                        f"metric_fn returned {describe(result)}",
                    )
                )
            eval_metric_ops = dict(result)
        scaffold = None
        if self.scaffold_fn is not None:
            scaffold = self.scaffold_fn()
            if not isinstance(scaffold, Scaffold):
                raise TypeError(
                    message(
                        "`scaffold_fn` must return a tpu_estimator.Scaffold.",
                        f"scaffold_fn returned {describe(scaffold)}",
                    )
                )
        return EstimatorSpec(
            mode=self.mode,
            predictions=self.predictions,
            loss=self.loss,
            train_op=self.train_op,
            eval_metric_ops=eval_metric_ops,
            export_outputs=None if self._default_export else self.export_outputs,
            training_hooks=self.training_hooks,
            scaffold=scaffold,
            evaluation_hooks=self.evaluation_hooks,
            prediction_hooks=self.prediction_hooks,
        )


class ModelFn(Protocol):
    """`model_fn(features, [labels], [mode], [params], [config]) -> spec`.

    Takes `features` (an array or a dict of arrays: this replica's share of the batch)
    and any of `labels` (the same, or None in PREDICT), `mode` (a `ModeKeys` value),
    `params` (a dict: the estimator's params with `batch_size` and `use_tpu` set) and
    `config` (the `RunConfig`), by name; returns an `EstimatorSpec` or a
    `TPUEstimatorSpec`. Written `(*args: Any, **kwargs: Any)` (what a type checker reads
    as `Callable[..., spec]`): the estimator checks the names when it is built
    (api/contracts.py says why).
    """

    def __call__(self, *args: Any, **kwargs: Any) -> EstimatorSpec | TPUEstimatorSpec: ...


for cls in (EstimatorSpec, TPUEstimatorSpec):
    jax.tree_util.register_pytree_node(cls, cls._tree_flatten, cls._tree_unflatten)
del cls
