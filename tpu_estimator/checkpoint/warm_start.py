"""Warm start: initialise a new model's variables from another model's checkpoint or export.

Applied once, right after initialisation, only when `model_dir` has no
checkpoint yet (`Runtime._after_init`; before `Scaffold.init_fn`). Variable
names are those of `get_variable_names()`: params without prefix
(`Dense_0/kernel`), other collections with theirs (`batch_stats/...`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from typing import Any, Mapping, Sequence

import jax
import numpy as np

from tpu_estimator.api.checks import message
from tpu_estimator.api.keywords import suggest_keywords
from tpu_estimator.checkpoint.reader import load_variables
from tpu_estimator.checkpoint.tf_checkpoint import tf_checkpoint_prefix, tf_variables
from tpu_estimator.checkpoint.variables import GLOBAL_STEP, Readers, flatten, variable_name
from tpu_estimator.paths import as_uri

log = logging.getLogger("tpu_estimator")


@suggest_keywords
@dataclasses.dataclass(frozen=True)
class WarmStartSettings:
    """What to warm-start from, and which variables (as `tf.estimator.WarmStartSettings`).

    Args:
      ckpt_to_initialize_from: A model_dir (its latest checkpoint), one
        checkpoint `<model_dir>/<step>`, an export directory
        (`export_saved_model`'s `<base>/<timestamp>`), or a TensorFlow
        checkpoint: a prefix `<dir>/model.ckpt-<step>` or a TF model_dir (read
        with TensorFlow, the `tf` extra; map its names with
        `suggest_tf_variable_mapping`).
      vars_to_warm_start: A regex (str): the trainable variables (params) whose
        names match; a list of regexes: any variable (params and other
        collections, e.g. `batch_stats/.*`) matching one; None: none.
        Matching is `re.match` (from the start of the name), as in TF.
      var_name_to_prev_var_name: {new name: name in the checkpoint} for
        variables that were renamed.

    Example:
      >>> ws = WarmStartSettings('/tmp/pretrained', vars_to_warm_start=['Dense_0/.*'])
      >>> ws.vars_to_warm_start
      ['Dense_0/.*']
      >>> est = TPUEstimator(model_fn, config=cfg, warm_start_from=ws,  # doctest: +SKIP
      ...                    train_batch_size=64)
    """

    ckpt_to_initialize_from: str
    vars_to_warm_start: str | Sequence[str] | None = ".*"
    var_name_to_prev_var_name: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.ckpt_to_initialize_from, (str, os.PathLike)):
            raise TypeError(
                message(
                    "`ckpt_to_initialize_from` must be a path.",
                    f"ckpt_to_initialize_from={self.ckpt_to_initialize_from!r}",
                )
            )
        as_uri(self.ckpt_to_initialize_from, arg="ckpt_to_initialize_from")  # a scheme we can read
        v = self.vars_to_warm_start
        if v is not None and not isinstance(v, str) and not all(isinstance(x, str) for x in v):
            raise TypeError(
                message("`vars_to_warm_start` must be a regex, a list of regexes, or None.", f"vars_to_warm_start={v!r}")
            )


def settings_of(warm_start_from: Any) -> WarmStartSettings | None:
    """`warm_start_from` (None, a path, or WarmStartSettings) as settings."""
    if warm_start_from is None or isinstance(warm_start_from, WarmStartSettings):
        return warm_start_from
    if isinstance(warm_start_from, (str, os.PathLike)):
        return WarmStartSettings(as_uri(warm_start_from, arg="warm_start_from"))
    raise TypeError(
        message(
            "`warm_start_from` must be a checkpoint or export path, or a WarmStartSettings.",
            f"warm_start_from={type(warm_start_from).__name__}",
        )
    )


def source_variables(path: str, readers: Readers | None = None) -> dict[str, np.ndarray]:
    """The variables saved at `path` (model_dir, `<model_dir>/<step>`, an export, or a TF
    checkpoint), by name.

    Read by `checkpoint/reader.py` (as `tpu_estimator.load_variable`, with the components'
    `readers`), without `global_step`;
    a TF checkpoint by `checkpoint/tf_checkpoint.py` (TF's names, without optimizer slots).
    """
    tf_prefix = tf_checkpoint_prefix(path)
    if tf_prefix is not None:
        return tf_variables(tf_prefix)
    variables = load_variables(path, readers=readers)
    variables.pop(GLOBAL_STEP, None)
    return variables


def _selected(names: list[str], trainable: list[str], spec: Any) -> list[str]:
    if spec is None:
        return []
    if isinstance(spec, str):
        return [n for n in trainable if re.match(spec, n)]
    return [n for n in names if any(re.match(r, n) for r in spec)]


def warm_start(
    variables: dict[str, Any], settings: WarmStartSettings, prev: dict[str, Any], trainable: Sequence[str] = ()
) -> dict[str, Any]:
    """`variables` with the selected ones replaced by their values in `prev` (name -> array).
    The trainable ones (what a regex `vars_to_warm_start` selects among) are the parameters
    and the variables under the keys `trainable` (components' whole tables: `embedding/...`).

    Raises:
      ValueError: a rename that names no selected variable, a variable missing
        from `prev`, or a shape mismatch; the message lists the viable names.
    """
    current = flatten(variables)
    groups = {k: variables[k] for k in trainable if k in variables}
    names = list(flatten({"params": variables.get("params", {})})) + list(flatten(groups))
    chosen = _selected(list(current), names, settings.vars_to_warm_start)
    renames = dict(settings.var_name_to_prev_var_name or {})
    unused = sorted(set(renames) - set(chosen))
    if unused:
        raise ValueError(
            message(
                "Every key of `var_name_to_prev_var_name` must name a variable being warm-started.",
                f"unused renames {unused}",
                f"Use names among {chosen} (a list of regexes, e.g. vars_to_warm_start=['.*'], "
                "also selects collections such as batch_stats).",
            )
        )
    values = {}
    for name in chosen:
        old = renames.get(name, name)
        if old not in prev:
            raise ValueError(
                message(
                    f"Variable {name!r} is warm-started from {old!r}, which the checkpoint does not have.",
                    f"checkpoint variables {sorted(prev)}",
                    "Narrow `vars_to_warm_start`, or map the name with `var_name_to_prev_var_name` "
                    "(for a TensorFlow checkpoint, `tpu_estimator.suggest_tf_variable_mapping` suggests it).",
                )
            )
        want, got = np.shape(current[name]), np.shape(prev[old])
        if want != got:
            viable = sorted(k for k, v in prev.items() if np.shape(v) == want)
            raise ValueError(
                message(
                    f"Variable {name!r} has shape {want} but the checkpoint's {old!r} has shape {got}.",
                    f"checkpoint variables of shape {want}: {viable}",
                    "Warm-start only variables of matching shape (`vars_to_warm_start`).",
                )
            )
        values[name] = np.asarray(prev[old]).astype(np.asarray(current[name]).dtype)
    log.info("Warm-started %d variables: %s", len(values), sorted(values))
    return jax.tree_util.tree_map_with_path(lambda p, x: values.get(variable_name(p), x), variables)


def apply_warm_start(
    state: Any, warm_start_from: Any, sharding: Any, offered: Mapping[str, Any] | None = None,
    readers: Readers | None = None,
) -> tuple[Any, dict[str, Any]]:
    """The fresh TrainState `state` warm-started as `warm_start_from` says (unchanged if None),
    and the whole variables that components `offered` ({component: {key: array}}, trainable,
    named `<component>/<key>`: the embedding tables) warm-started the same way; `readers`
    read the source's components' variables (checkpoint/variables.py)."""
    offered = dict(offered or {})
    settings = settings_of(warm_start_from)
    if settings is None:
        return state, offered
    prev = source_variables(settings.ckpt_to_initialize_from, readers)
    variables = {**jax.device_get(state.variables), **offered}
    variables = warm_start(variables, settings, prev, trainable=tuple(offered))
    started = {name: variables.pop(name) for name in offered}
    variables = jax.device_put(variables, sharding)
    params = variables.pop("params", state.params)
    return state.replace(params=params, collections={**state.collections, **variables}), started
