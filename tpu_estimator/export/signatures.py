"""The functions an export serializes: one per signature, `fn(variables, inputs) -> outputs`.

`variables` is the flat dict of the exported weights, `inputs` the dict of
receiver tensors. The `model_fn` is bound WITHOUT `params['batch_size']` and
with `params['use_tpu']` telling which platform is being exported.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable

import jax
import jax.numpy as jnp

from tpu_estimator.api.checks import message
from tpu_estimator.api.mode_keys import ModeKeys
from tpu_estimator.api.serving_input import ServingInputReceiver
from tpu_estimator.export import manifest as mf
from tpu_estimator.export.inference import recording_batching
from tpu_estimator.export.receivers import labels_fn
from tpu_estimator.model import components
from tpu_estimator.model.spec_view import SpecView

if TYPE_CHECKING:
    from tpu_estimator.estimator.core import Core

Outputs = dict[str, tuple[str, dict[str, Any]]]  # signature -> (method name, named outputs)


@dataclasses.dataclass(frozen=True)
class MetaGraphPlan:
    """One tag set to export: the mode, its tags and platforms, and `params['use_tpu']`."""

    mode: str
    tags: tuple[str, ...]
    platforms: tuple[str, ...]
    use_tpu: bool


def plan_meta_graphs(modes: list[str], *, to_cpu: bool, to_tpu: bool) -> list[MetaGraphPlan]:
    """TRAIN -> {train}, EVAL -> {eval} (CPU only); PREDICT -> {serve} and/or {serve, tpu}."""
    plans = []
    for mode in (ModeKeys.TRAIN, ModeKeys.EVAL, ModeKeys.PREDICT):
        if mode not in modes:
            continue
        if mode == ModeKeys.TRAIN:
            plans.append(MetaGraphPlan(mode, (mf.TRAINING,), mf.CPU_PLATFORMS, False))
        elif mode == ModeKeys.EVAL:
            plans.append(MetaGraphPlan(mode, (mf.EVAL,), mf.CPU_PLATFORMS, False))
        else:
            if to_cpu:
                plans.append(MetaGraphPlan(mode, (mf.SERVING,), mf.CPU_PLATFORMS, False))
            if to_tpu:
                plans.append(MetaGraphPlan(mode, (mf.SERVING, mf.TPU), mf.ACCELERATOR_PLATFORMS, True))
    return plans


def signature_outputs(sv: SpecView) -> Outputs:
    """The signatures of one traced spec: export_outputs (PREDICT), 'eval' or 'train'."""
    if sv.mode == ModeKeys.PREDICT:
        if not sv.export_outputs:
            raise ValueError(
                message(
                    "export_saved_model needs export_outputs (or predictions) from model_fn in PREDICT mode.",
                    "a spec without predictions or export_outputs",
                    "Return TPUEstimatorSpec(mode, predictions={...}) or pass export_outputs.",
                )
            )
        return {k: (v.method_name, v.outputs) for k, v in sv.export_outputs.items()}
    outputs: dict[str, Any] = {}
    if sv.loss is not None:
        outputs["loss"] = jnp.reshape(sv.loss, ())
    if sv.mode == ModeKeys.EVAL:
        for name, value in _metric_values(sv).items():
            outputs[f"metrics/{name}/value"] = value
    preds = sv.predictions
    if isinstance(preds, dict):
        outputs.update({f"predictions/{k}": v for k, v in preds.items()})
    elif preds is not None:
        outputs["predictions"] = preds
    if not outputs:
        raise ValueError(
            message(
                f"model_fn in mode {sv.mode!r} must return a loss to export.", "loss=None"
            )
        )
    if sv.mode == ModeKeys.EVAL:
        return {mf.EVAL: (mf.EVAL_METHOD_NAME, outputs)}
    return {mf.TRAINING: (mf.TRAIN_METHOD_NAME, outputs)}


def _metric_values(sv: SpecView) -> dict[str, Any]:
    if sv.metric_fn is not None:
        tensors = sv.metric_tensors
        raw = sv.metric_fn(**tensors) if isinstance(tensors, dict) else sv.metric_fn(*tensors)
    else:
        raw = sv.metric_ops or {}
    values = {}
    for name, metric in dict(raw).items():
        if hasattr(metric, "compute"):
            metric = metric.compute()
        elif isinstance(metric, tuple):  # a TF-style (value, update_op) pair
            metric = metric[0]
        values[name] = jnp.asarray(metric)
    return values


class GraphFunctions:
    """Builds the per-signature functions of one meta graph and traces them once."""

    def __init__(
        self,
        core: "Core",
        plan: MetaGraphPlan,
        receiver: ServingInputReceiver,
        treedef: Any,
        names: list[str],
    ) -> None:
        self.plan = plan
        self.model = core.bind(plan.mode, use_tpu=plan.use_tpu, one_device=True)
        self.view = core.view(plan.mode, use_tpu=plan.use_tpu)
        self.receiver = receiver
        self._labels = labels_fn(receiver)
        self._treedef = treedef
        self._names = names

    def all_outputs(self, flat_vars: dict[str, Any], inputs: dict[str, Any]) -> Outputs:
        variables = jax.tree.unflatten(self._treedef, [flat_vars[n] for n in self._names])
        features = self.receiver.make_features(dict(inputs))
        labels = self._labels(inputs)
        # the components' exported state (whole embedding tables, looked up on one device)
        variables, features = components.forward_inputs(self.model.components, variables, features)
        mutable: Any = False
        if self.plan.mode == ModeKeys.TRAIN:
            mutable = [c for c in variables if c != "params"] or False
        spec, _ = self.model.apply(variables, features, labels, rng=jax.random.PRNGKey(0), mutable=mutable)
        sv = self.view(spec)
        return signature_outputs(sv)

    def describe(self, var_avals: Any, in_avals: Any) -> tuple[dict[str, str], list[dict[str, Any]]]:
        """({signature: method name}, batching settings recorded by inference_on_tpu)."""
        methods: dict[str, str] = {}

        def arrays_only(flat_vars: Any, inputs: Any) -> Any:
            out = self.all_outputs(flat_vars, inputs)
            methods.update({k: m for k, (m, _) in out.items()})
            return {k: o for k, (_, o) in out.items()}

        with recording_batching() as calls:
            jax.eval_shape(arrays_only, var_avals, in_avals)
        return methods, calls

    def signature_fn(self, signature: str) -> Callable[[Any, Any], dict[str, Any]]:
        def fn(flat_vars: Any, inputs: Any) -> dict[str, Any]:
            return self.all_outputs(flat_vars, inputs)[signature][1]

        fn.__name__ = f"{self.plan.mode}_{signature}".replace("/", "_")
        return fn
