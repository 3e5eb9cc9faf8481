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
from typing import Any, Callable, Mapping, Protocol, Sequence

import jax
import numpy as np

from tpu_estimator.api.checks import message
from tpu_estimator.api.keywords import suggest_keywords
from tpu_estimator.checkpoint.reader import load_variables, variable_source
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


class Source(Protocol):
    """Where warm start reads its values: `checkpoint/reader.VariableSource`, or `InMemory`."""

    def shapes(self) -> dict[str, tuple[int, ...]]: ...

    def read(self, names: Sequence[str]) -> dict[str, Any]: ...

    def rows(self, names: Sequence[str]) -> dict[str, Any]: ...


@dataclasses.dataclass(frozen=True)
class InMemory:
    """Variables already read (name -> array) as a warm-start `Source`."""

    variables: Mapping[str, Any]

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: tuple(np.shape(v)) for k, v in self.variables.items()}

    def read(self, names: Sequence[str]) -> dict[str, Any]:
        return {k: self.variables[k] for k in names}

    def rows(self, names: Sequence[str]) -> dict[str, Any]:
        return {}


def warm_start_source(
    path: str, readers: Readers | None = None, open_rows: Callable[[str], Callable[[Any], Any]] | None = None
) -> Source:
    """The variables saved at `path` (as `source_variables`), read only when chosen: a
    tpu_estimator checkpoint or export through `checkpoint/reader.variable_source` (with
    `open_rows`, components' variables by rows: no whole embedding table); a TF checkpoint
    whole (`tf_variables`: TF's reader has no row reads, so its tables are read whole)."""
    tf_prefix = tf_checkpoint_prefix(path)
    if tf_prefix is not None:
        return InMemory(tf_variables(tf_prefix))
    return variable_source(path, readers=readers, open_rows=open_rows)


def _selected(names: list[str], trainable: list[str], spec: Any) -> list[str]:
    if spec is None:
        return []
    if isinstance(spec, str):
        return [n for n in trainable if re.match(spec, n)]
    return [n for n in names if any(re.match(r, n) for r in spec)]


def _dtype(x: Any) -> np.dtype:
    return np.dtype(x.dtype) if hasattr(x, "dtype") else np.asarray(x).dtype


def warm_start(
    variables: dict[str, Any], settings: WarmStartSettings, prev: Mapping[str, Any] | Source,
    trainable: Sequence[str] = (),
) -> dict[str, Any]:
    """`variables` with the selected ones replaced by their values in `prev` (name -> array,
    or a `Source`, read only for the names chosen). The trainable ones (what a regex
    `vars_to_warm_start` selects among) are the parameters and the variables under the keys
    `trainable` (components' tables: `embedding/...`, given as shapes); those the source
    reads by rows (`Source.rows`: a checkpoint's embedding tables) are replaced by its row
    sources, for their components to place.

    Raises:
      ValueError: a rename that names no selected variable, a variable missing
        from `prev`, or a shape mismatch; the message lists the viable names.
    """
    source = InMemory(prev) if isinstance(prev, Mapping) else prev
    shapes = {k: v for k, v in source.shapes().items() if k != GLOBAL_STEP}
    current = flatten(variables)
    groups = {k: variables[k] for k in trainable if k in variables}
    offered = list(flatten(groups))
    names = list(flatten({"params": variables.get("params", {})})) + offered
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
    olds = {}
    for name in chosen:
        old = renames.get(name, name)
        if old not in shapes:
            raise ValueError(
                message(
                    f"Variable {name!r} is warm-started from {old!r}, which the checkpoint does not have.",
                    f"checkpoint variables {sorted(shapes)}",
                    "Narrow `vars_to_warm_start`, or map the name with `var_name_to_prev_var_name` "
                    "(for a TensorFlow checkpoint, `tpu_estimator.suggest_tf_variable_mapping` suggests it).",
                )
            )
        want, got = tuple(np.shape(current[name])), tuple(shapes[old])
        if want != got:
            viable = sorted(k for k, v in shapes.items() if tuple(v) == want)
            raise ValueError(
                message(
                    f"Variable {name!r} has shape {want} but the checkpoint's {old!r} has shape {got}.",
                    f"checkpoint variables of shape {want}: {viable}",
                    "Warm-start only variables of matching shape (`vars_to_warm_start`).",
                )
            )
        olds[name] = old
    by_rows = source.rows(sorted({olds[n] for n in chosen if n in offered}))
    whole = source.read(sorted({old for n, old in olds.items() if not (n in offered and old in by_rows)}))
    values = {}
    for name, old in olds.items():
        if name in offered and old in by_rows:
            values[name] = by_rows[old]  # read by its component, block by block
        else:
            values[name] = np.asarray(whole[old]).astype(_dtype(current[name]))
    log.info("Warm-started %d variables: %s", len(values), sorted(values))
    return jax.tree_util.tree_map_with_path(lambda p, x: values.get(variable_name(p), x), variables)


def apply_warm_start(
    state: Any, warm_start_from: Any, sharding: Any, offered: Mapping[str, Any] | None = None,
    readers: Readers | None = None, open_rows: Callable[[str], Callable[[Any], Any]] | None = None,
) -> tuple[Any, dict[str, Any]]:
    """The fresh TrainState `state` warm-started as `warm_start_from` says (unchanged if None),
    and the values of the variables that components `offered` ({component: {key: shape and
    dtype}}, trainable, named `<component>/<key>`: the embedding tables) warm-started the
    same way ({component: {key: value}}, only those warm-started: a row source where the
    checkpoint's reader reads them by rows, else an array); `readers` read the source's
    components' variables (checkpoint/variables.py), `open_rows(checkpoint_path)` opens
    its saved arrays for row reads (checkpoint/row_reads.opener). Only the chosen
    variables are read."""
    offered = {k: dict(v) for k, v in (offered or {}).items()}
    settings = settings_of(warm_start_from)
    if settings is None:
        return state, {}
    prev = warm_start_source(settings.ckpt_to_initialize_from, readers, open_rows)
    variables = {**jax.device_get(state.variables), **offered}
    variables = warm_start(variables, settings, prev, trainable=tuple(offered))
    started = {
        comp: {k: v for k, v in variables.pop(comp).items() if v is not offered[comp][k]} for comp in offered
    }
    variables = jax.device_put(variables, sharding)
    params = variables.pop("params", state.params)
    return state.replace(params=params, collections={**state.collections, **variables}), started
