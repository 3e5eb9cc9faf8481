"""The user's `model_fn` wrapped in a Flax module, so layers can be created inline.

`model_fn` is called inside `nn.compact`, exactly as a TF1 model_fn created
its variables inline. Layer names follow construction order.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import flax.errors
import flax.linen as nn
import jax

from tpu_estimator.api.checks import message
from tpu_estimator.api.mode_keys import ModeKeys
from tpu_estimator.model.call import call_with
from tpu_estimator.model.precision import Precision

# Random streams offered to layers (Dropout uses "dropout").
RNG_STREAMS = ("dropout", "noise", "sample", "params")


class _ModelFnModule(nn.Module):
    fn: Callable[..., Any]

    @nn.compact
    def __call__(self, features: Any, labels: Any) -> Any:
        return self.fn(features, labels)


@dataclasses.dataclass(frozen=True)
class BoundModel:
    """`model_fn` bound to one mode, its params (with `batch_size`) and config.

    `components` are the run's extra kinds of state (model/components.py), the
    embedding tables of `embedding_config_spec` among them.
    `precision` is the dtype model_fn computes in (model/precision.py);
    `accumulation_steps` and `remat_policy` how a train step runs it
    (`TPUConfig.gradient_accumulation_steps`, `remat_policy`).
    """

    model_fn: Callable[..., Any]
    arg_names: frozenset[str]
    mode: str
    params: dict[str, Any]
    config: Any
    components: tuple[Any, ...] = ()
    precision: Precision = Precision()
    accumulation_steps: int = 1
    remat_policy: str | None = None

    def _call(self, features: Any, labels: Any) -> Any:
        if labels is not None and "labels" not in self.arg_names:
            raise ValueError(
                message(
                    "input_fn returned labels but model_fn does not take `labels`.",
                    "model_fn without a `labels` argument",
                    "Add a `labels` argument to model_fn, or return only features from input_fn.",
                )
            )
        return call_with(
            self.model_fn,
            self.arg_names,
            features=features,
            labels=labels,
            mode=self.mode,
            params=dict(self.params),
            config=self.config,
        )

    @functools.cached_property
    def module(self) -> nn.Module:
        return _ModelFnModule(fn=self._call)

    def init(self, rng: jax.Array, features: Any, labels: Any) -> tuple[Any, dict[str, Any]]:
        """(spec, variables): initialises the variables on these inputs."""
        spec, variables = self.module.init_with_output(
            _rngs(rng), features, labels
        )
        return spec, dict(variables)

    def apply(
        self,
        variables: dict[str, Any],
        features: Any,
        labels: Any,
        *,
        rng: jax.Array,
        mutable: list[str] | bool = False,
    ) -> tuple[Any, dict[str, Any]]:
        """(spec, updated mutable collections); explains name mismatches between modes.
        model_fn computes in `precision`'s dtype; the spec's arrays come back float32."""
        stored = variables
        variables, features = self.precision.inputs(variables, features)
        try:
            out = self.module.apply(
                variables, features, labels, rngs=_rngs(rng), mutable=mutable or False
            )
        except (flax.errors.ScopeParamNotFoundError, flax.errors.ScopeCollectionNotFound) as e:
            raise ValueError(
                message(
                    f"model_fn in mode {self.mode!r} uses a variable that the checkpoint or the "
                    "initialisation (possibly done in another mode) does not have.",
                    str(e).split("\n")[0],
                    "Layers created only in some modes shift the automatic names of later "
                    "layers: pass name='...' to such layers (and to the ones after them).",
                )
            ) from e
        except flax.errors.ScopeParamShapeError as e:
            raise ValueError(
                message(
                    f"model_fn in mode {self.mode!r} built a variable with another shape than "
                    "the one restored.",
                    str(e).split("\n")[0],
                    "Use the same layer sizes in every mode (or a new model_dir). Layers created "
                    "only in some modes shift the automatic names of later layers: pass "
                    "name='...' to such layers (and to the ones after them).",
                )
            ) from e
        spec, mutated = out if mutable else (out, {})
        return self.precision.outputs(spec, mutated, stored)


def bind_model(
    model_fn: Callable[..., Any],
    arg_names: frozenset[str],
    mode: str,
    params: dict[str, Any],
    config: Any,
    batch_size: int | None,
) -> BoundModel:
    """A `BoundModel` whose params carry `batch_size` (omitted when None)."""
    ModeKeys.validate(mode)
    p = dict(params)
    if batch_size is not None:
        p["batch_size"] = batch_size
    return BoundModel(model_fn, arg_names, mode, p, config)


def _rngs(rng: jax.Array) -> dict[str, jax.Array]:
    return {name: jax.random.fold_in(rng, i) for i, name in enumerate(RNG_STREAMS)}
