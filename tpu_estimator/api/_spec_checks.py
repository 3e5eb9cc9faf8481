"""Field-by-field validation of `EstimatorSpec` / `TPUEstimatorSpec` (pure functions).

Each check reads only `.shape`, `.dtype` and `.ndim` of arrays, so it works on
JAX tracers, and returns the value as the spec stores it.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

import optax

from tpu_estimator.api.checks import message, positional_arity
from tpu_estimator.api.contracts import ArrayTree, Tensors
from tpu_estimator.api.export_output import (
    DEFAULT_SERVING_SIGNATURE_DEF_KEY,
    ExportOutput,
    PredictOutput,
    check_array,
    check_str_key,
    describe,
    is_array,
    is_floating,
)
from tpu_estimator.api.mode_keys import ModeKeys
from tpu_estimator.api.scaffold import Scaffold
from tpu_estimator.api.session_run_hook import SessionRunHook

if TYPE_CHECKING:
    from jax.typing import ArrayLike

    from tpu_estimator.metrics import Metric

RESERVED_METRIC_KEYS = ("loss", "global_step")


def require(value: object, name: str, mode: str, cls: str, fix: str) -> None:
    if value is None:
        raise ValueError(
            message(f"In mode {mode!r}, {cls} requires `{name}`.", f"{name}=None", fix)
        )


def check_loss(loss: Any) -> ArrayLike | None:
    if loss is None:
        return None
    if not is_array(loss):
        raise TypeError(
            message(
                "`loss` must be an array of shape [] or [1] (a Python number carries no gradient).",
                f"loss={describe(loss)} of type {type(loss).__name__}",
                "Compute it with jnp, e.g. loss = jnp.mean(per_example_losses).",
            )
        )
    if tuple(loss.shape) not in ((), (1,)):
        raise ValueError(
            message(
                "`loss` must be a scalar: shape [] or [1].",
                f"loss={describe(loss)}",
                "Reduce it, e.g. loss = per_example_losses.mean().",
            )
        )
    if not is_floating(loss):
        raise TypeError(
            message(
                "`loss` must be floating point (it is differentiated and averaged).",
                f"loss={describe(loss)}",
                "Cast it, e.g. loss.astype(jnp.float32).",
            )
        )
    return loss.reshape(()) if loss.ndim == 1 else loss


def check_predictions(predictions: Any, mode: str) -> ArrayTree:
    if predictions is None:
        return None
    what = "an array or a dict of str to arrays"
    if not isinstance(predictions, Mapping):
        check_array(predictions, "predictions", what=what)
        items = {"predictions": predictions}
    else:
        if mode == ModeKeys.PREDICT and not predictions:
            raise ValueError(
                message(
                    "In mode 'infer', `predictions` must not be empty.",
                    "predictions={}",
                    "Return e.g. predictions={'classes': logits.argmax(-1)}.",
                )
            )
        for key, value in predictions.items():
            check_str_key(key, "predictions")
            check_array(value, f"predictions[{key!r}]", what="an array (dicts are not nested)")
        items = {f"predictions[{k!r}]": v for k, v in predictions.items()}
        predictions = dict(predictions)
    if mode == ModeKeys.PREDICT:
        check_batch_major(items, "predictions", same_batch=True)
    return predictions


def check_batch_major(items: Mapping[str, Any], what: str, *, same_batch: bool) -> None:
    """Rank >= 1 for every array; with `same_batch` (predictions), equal static dim 0."""
    if same_batch:
        fix = "Return one value per example, e.g. jnp.broadcast_to(x, (batch_size,))."
    else:
        fix = "Give it a batch dimension, or reshape a scalar to [1] with x.reshape(1)."
    for name, value in items.items():
        if value.ndim == 0:
            raise ValueError(
                message(
                    f"{what} arrays must be batch-major (rank >= 1): they are concatenated "
                    "over replicas along dim 0.",
                    f"{name}={describe(value)}",
                    fix,
                )
            )
    if same_batch:
        sizes = {n: v.shape[0] for n, v in items.items() if isinstance(v.shape[0], int)}
        if len(set(sizes.values())) > 1:
            raise ValueError(
                message(
                    f"All {what} arrays must have the same batch size (dim 0).",
                    ", ".join(f"{n}.shape[0]={s}" for n, s in sizes.items()),
                    f"{what.capitalize()} are batch-major: make the batch the first dimension of "
                    "each array (the host concatenates them over replicas and yields one per example).",
                )
            )


def check_train_op(train_op: object) -> optax.GradientTransformation | None:
    if train_op is None or isinstance(train_op, optax.GradientTransformation):
        return train_op
    raise TypeError(
        message(
            "`train_op` must be an optax.GradientTransformation (the estimator applies it).",
            f"train_op={describe(train_op)}",
            "Pass e.g. train_op=optax.adam(1e-3); for optax.MultiSteps pass "
            "its .gradient_transformation().",
        )
    )


def check_hooks(hooks: Any, name: str) -> tuple[SessionRunHook, ...]:
    if hooks is None:
        return ()
    not_a_list = TypeError(
        message(
            f"`{name}` must be a list of SessionRunHook instances.",
            f"{name}={describe(hooks)}",
            f"Wrap a single hook in a list: {name}=[hook].",
        )
    )
    if isinstance(hooks, (str, bytes, Mapping)) or is_array(hooks):
        raise not_a_list
    if not isinstance(hooks, Iterable):
        raise not_a_list
    try:
        hooks = tuple(hooks)
    except TypeError as e:  # claims to be iterable but is not
        raise not_a_list from e
    for i, hook in enumerate(hooks):
        if not isinstance(hook, SessionRunHook):
            raise TypeError(
                message(
                    f"`{name}` must contain only tpu_estimator.SessionRunHook instances.",
                    f"{name}[{i}]={describe(hook)}",
                    "Subclass tpu_estimator.SessionRunHook.",
                )
            )
    return hooks


def check_eval_metric_ops(ops: object) -> dict[str, Metric] | None:
    if ops is None:
        return None
    from tpu_estimator.metrics import Metric

    if not isinstance(ops, Mapping):
        raise TypeError(
            message(
                "`eval_metric_ops` must be a dict of str to tpu_estimator.metrics.Metric.",
                f"eval_metric_ops={describe(ops)}",
            )
        )
    for key, metric in ops.items():
        check_str_key(key, "eval_metric_ops")
        if key in RESERVED_METRIC_KEYS:
            raise ValueError(
                message(
                    f"Metric names {RESERVED_METRIC_KEYS} are reserved: evaluate() reports "
                    "them itself.",
                    f"eval_metric_ops[{key!r}]",
                    "Rename the metric.",
                )
            )
        if not isinstance(metric, Metric):
            raise TypeError(
                message(
                    "The values of `eval_metric_ops` must be tpu_estimator.metrics.Metric "
                    "instances.",
                    f"eval_metric_ops[{key!r}]={describe(metric)}",
                    "Use a metric, e.g. metrics.accuracy(labels, predictions) or "
                    "metrics.mean(values).",
                )
            )
    return dict(ops)


def check_export_outputs(
    export_outputs: object, predictions: ArrayTree, mode: str
) -> tuple[dict[str, ExportOutput] | None, bool]:
    """Returns (export_outputs, whether they are the PREDICT default)."""
    if export_outputs is None or (isinstance(export_outputs, Mapping) and not export_outputs):
        if mode != ModeKeys.PREDICT:  # None or {}: TF's default applies in PREDICT only
            return None, False
        return {DEFAULT_SERVING_SIGNATURE_DEF_KEY: PredictOutput(predictions)}, True
    if not isinstance(export_outputs, Mapping):
        raise TypeError(
            message(
                "`export_outputs` must be a dict of str to ExportOutput.",
                f"export_outputs={describe(export_outputs)}",
                "Use e.g. export_outputs={'serving_default': PredictOutput(predictions)}.",
            )
        )
    outputs = dict(export_outputs)
    for key, value in outputs.items():
        check_str_key(key, "export_outputs")
        if not isinstance(value, ExportOutput):
            raise TypeError(
                message(
                    "The values of `export_outputs` must be ExportOutput instances "
                    "(PredictOutput, ClassificationOutput, RegressionOutput).",
                    f"export_outputs[{key!r}]={describe(value)}",
                )
            )
    if len(outputs) == 1:
        outputs.setdefault(DEFAULT_SERVING_SIGNATURE_DEF_KEY, next(iter(outputs.values())))
    elif DEFAULT_SERVING_SIGNATURE_DEF_KEY not in outputs:
        raise ValueError(
            message(
                f"With several export_outputs, one must be named "
                f"{DEFAULT_SERVING_SIGNATURE_DEF_KEY!r} (the signature served by default).",
                f"export_outputs keys {sorted(outputs)}",
                "Rename the main head to 'serving_default'.",
            )
        )
    return outputs, False


def check_host_call(value: object, name: str) -> tuple[Callable[..., Any], Tensors] | None:
    """`eval_metrics` / `host_call`: (fn, list|tuple|dict of batch-major arrays)."""
    if value is None:
        return None
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise TypeError(
            message(
                f"`{name}` must be a 2-tuple (fn, tensors), tensors a list or dict of arrays.",
                f"{name}={describe(value)}",
                f"Use e.g. {name}=(fn, [labels, logits]).",
            )
        )
    fn, tensors = value
    if not callable(fn):
        raise TypeError(message(f"`{name}[0]` must be callable.", f"{name}[0]={describe(fn)}"))
    if isinstance(tensors, Mapping):
        tensors = dict(tensors)
        for key in tensors:
            check_str_key(key, f"{name}[1]")
        items = {f"{name}[1][{k!r}]": v for k, v in tensors.items()}
    elif isinstance(tensors, (list, tuple)):
        tensors = tuple(tensors)
        items = {f"{name}[1][{i}]": v for i, v in enumerate(tensors)}
    else:
        raise TypeError(
            message(
                f"`{name}[1]` must be a list, tuple or dict of arrays.",
                f"{name}[1]={describe(tensors)}",
            )
        )
    for item, v in items.items():
        check_array(v, item)
    check_batch_major(items, f"`{name}`", same_batch=False)
    check_call_fits(fn, tensors, name)
    return fn, tensors


def check_call_fits(
    fn: Callable[..., Any], tensors: tuple[ArrayLike, ...] | Mapping[str, ArrayLike], name: str
) -> None:
    """The tensors list/dict must fit fn's parameters (positional / keyword)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # no signature (some builtins): cannot check
        return
    fn_name = getattr(fn, "__name__", type(fn).__name__)
    if isinstance(tensors, tuple):
        required, maximum, star = positional_arity(fn)
        if not (required <= len(tensors) and (star or len(tensors) <= maximum)):
            takes = (
                f"{required}+"
                if star
                else (str(required) if required == maximum else f"{required} to {maximum}")
            )
            raise ValueError(
                message(
                    f"`{name}`: the tensors list is passed positionally to {fn_name}, which "
                    f"takes {takes} positional arguments.",
                    f"{len(tensors)} tensors for {fn_name}{sig}",
                    "Make the list match the function's parameters.",
                )
            )
        return
    params = sig.parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        accepted = None
    else:
        accepted = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    unknown = sorted(set(tensors) - accepted) if accepted is not None else []
    missing = sorted(
        p.name
        for p in params
        if p.default is p.empty
        and (
            p.kind is p.POSITIONAL_ONLY  # cannot be passed by keyword
            or (p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in tensors)
        )
    )
    if unknown or missing:
        raise ValueError(
            message(
                f"`{name}`: the tensors dict is passed as keyword arguments to {fn_name}; its "
                "keys must be the function's parameter names.",
                f"keys {sorted(tensors)} for {fn_name}{sig}"
                + (f"; unknown {unknown}" if unknown else "")
                + (f"; missing {missing}" if missing else ""),
                "Rename the keys or the parameters.",
            )
        )


def check_scaffold_fn(scaffold_fn: Any) -> Callable[[], Scaffold] | None:
    if scaffold_fn is None:
        return None
    ok = callable(scaffold_fn)
    if ok:
        try:
            ok = positional_arity(scaffold_fn)[0] == 0
        except (TypeError, ValueError):
            pass
    if not ok:
        raise TypeError(
            message(
                "`scaffold_fn` must be a callable taking no arguments that returns a Scaffold.",
                f"scaffold_fn={describe(scaffold_fn)}",
                "Use e.g. scaffold_fn=lambda: Scaffold(init_fn=load_pretrained).",
            )
        )
    return scaffold_fn


def require_for_mode(mode: str, cls: str, predictions: object, loss: object, train_op: object) -> None:
    if mode == ModeKeys.TRAIN:
        fix = f"Return {cls}(mode, loss=loss, train_op=optax.adam(1e-3))."
        require(loss, "loss", mode, cls, fix)
        require(train_op, "train_op", mode, cls, fix)
    elif mode == ModeKeys.EVAL:
        require(loss, "loss", mode, cls, f"Return {cls}(mode, loss=loss, ...).")
    else:
        require(
            predictions,
            "predictions",
            mode,
            cls,
            f"Return {cls}(mode, predictions={{'name': array}}).",
        )
