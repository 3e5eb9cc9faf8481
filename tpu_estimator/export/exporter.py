"""`export_saved_model` and friends: `jax.export` artifacts written atomically.

The estimator's export methods delegate here. Each requested meta graph
(tag set) gets one serialized function per signature; the weights are stored
once, in safetensors. The result is `<export_dir_base>/<unix timestamp>`,
committed atomically: on local disk the directory is written under a hidden
temporary name and renamed when complete (what an interrupted one left is removed
by the next export in that base, export/temp_dirs.py); on an object store (`gs://`), which
cannot rename a directory, the files are written in place and `manifest.json`
last, the commit marker that every reader requires (export/manifest.py).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import posixpath
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping

import jax
import numpy as np
from etils import epath

from tpu_estimator.api.checks import message
from tpu_estimator.api.mode_keys import ModeKeys
from tpu_estimator.api.serving_input import ServingInputReceiver
from tpu_estimator.checkpoint import warm_start as ws
from tpu_estimator.export import manifest as mf
from tpu_estimator.export import temp_dirs
from tpu_estimator.checkpoint import flat_io as var_io
from tpu_estimator.checkpoint.variables import saved_state
from tpu_estimator.model import components
from tpu_estimator.paths import as_path, as_uri, is_local, join
from tpu_estimator.storage import bounded
from tpu_estimator.version import __version__
from tpu_estimator.export.signatures import GraphFunctions, MetaGraphPlan, plan_meta_graphs

if TYPE_CHECKING:
    from tpu_estimator.estimator.core import Core

log = logging.getLogger("tpu_estimator")

_RENAME_ATTEMPTS = 10


def export_all(
    core: "Core",
    export_dir_base: Any,
    input_receiver_fn_map: Mapping[str, Callable[[], ServingInputReceiver]],
    *,
    assets_extra: Mapping[str, str] | None = None,
    as_text: bool = False,
    checkpoint_path: str | None = None,
) -> bytes:
    """Implements `experimental_export_all_saved_models` (and `export_saved_model`)."""
    base = _check_base(export_dir_base)
    modes = _check_map(input_receiver_fn_map)
    assets = _check_assets(assets_extra)
    flags = core.export
    if not flags.to_cpu and not flags.to_tpu:
        raise ValueError("One of export_to_cpu and export_to_tpu must be true.")
    receivers = {mode: _call_receiver_fn(mode, input_receiver_fn_map[mode]) for mode in modes}
    variables, step = _variables(core, checkpoint_path, receivers)
    flat, treedef = var_io.flatten(variables)
    names = list(flat)
    plans = plan_meta_graphs(modes, to_cpu=flags.to_cpu, to_tpu=flags.to_tpu)
    if not plans:
        raise ValueError(
            message(
                "Nothing to export: PREDICT with export_to_cpu=False exports only to TPU, "
                "and only PREDICT exports to TPU.",
                f"modes={modes}, export_to_cpu={flags.to_cpu}, export_to_tpu={flags.to_tpu}",
                "Set export_to_cpu=True to export TRAIN/EVAL graphs.",
            )
        )

    local = is_local(base)
    # local: a hidden temporary directory, renamed at the end; object store: the final one
    if local:
        temp_dirs.remove_abandoned(base)  # what interrupted exports left
    tmp = temp_dirs.new_temp(base) if local else _on_store(base, "choosing the export's directory",
                                                            lambda: _unused_timestamp(base))
    _on_store(tmp, "creating the export's directory", lambda: epath.Path(tmp).mkdir(parents=True))
    try:
        var_dtypes = _on_store(tmp, "writing the export's variables",
                               lambda: var_io.save(flat, tmp, mf.VARIABLES_FILE))
        var_avals = {n: jax.ShapeDtypeStruct(a.shape, a.dtype) for n, a in flat.items()}
        graphs, converted = [], []
        for plan in plans:
            fns = GraphFunctions(core, plan, receivers[plan.mode], treedef, names)
            graph, programs = _export_graph(fns, var_avals, tmp, as_text=as_text)
            graphs.append(graph)
            converted.append((fns, graph, programs))
        saved_model = _saved_model(tmp, flat, converted)
        for dest, src in assets.items():
            path = epath.Path(tmp, mf.ASSETS_EXTRA_DIR, dest)

            def copy(path: epath.Path = path, src: str = src) -> None:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(epath.Path(src).read_bytes())

            _on_store(tmp, f"copying asset {dest}", copy)
        manifest = {
            "format": mf.FORMAT,
            "format_version": mf.FORMAT_VERSION,
            "versions": _versions(),
            "global_step": step,
            "export_saved_model_api_version": flags.api_version,
            "variables": {
                "file": mf.VARIABLES_FILE,
                "dtypes": var_dtypes,
                "tensors": {n: mf.spec_json(a.shape, a.dtype) for n, a in flat.items()},
            },
            "meta_graphs": graphs,
            "assets_extra": sorted(assets),
            "saved_model": saved_model,
        }
        # (object store: the commit marker, written last)
        _on_store(tmp, "writing the export's manifest", lambda: mf.write_manifest(tmp, manifest))
        final = _rename_to_timestamp(tmp, base) if local else tmp
    except BaseException:
        _remove(tmp)
        raise
    log.info("Exported %s (tags %s).", final, [g["tags"] for g in graphs])
    return os.fsencode(final)


def _export_graph(fns: GraphFunctions, var_avals: Any, out_dir: str, *, as_text: bool
                  ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Writes one meta graph's functions; returns its manifest entry and `{signature: Exported}`."""
    plan: MetaGraphPlan = fns.plan
    receiver = fns.receiver
    (batch,) = jax.export.symbolic_shape("batch")
    in_avals = {
        name: jax.ShapeDtypeStruct(tuple(batch if d is None else d for d in spec.shape), spec.dtype)
        for name, spec in receiver.receiver_tensors.items()
    }
    methods, batching = fns.describe(var_avals, in_avals)
    signatures, programs = {}, {}
    for sig, method in sorted(methods.items()):
        try:
            exported = jax.export.export(jax.jit(fns.signature_fn(sig)), platforms=plan.platforms)(
                var_avals, in_avals
            )
        except Exception as e:
            if "symbolic" not in str(e) and "polymorphi" not in str(e):
                raise
            raise ValueError(
                message(
                    "model_fn could not be exported with a symbolic batch dimension.",
                    f"mode={plan.mode!r}, signature={sig!r}: {str(e).splitlines()[0]}",
                    "Avoid Python ints derived from the batch size in model_fn, or give the "
                    "receiver TensorSpecs a fixed batch size (default_batch_size=...).",
                )
            ) from e
        programs[sig] = exported
        rel = mf.function_path(plan.tags, sig)
        serialized = exported.serialize()
        text = exported.mlir_module() if as_text else None

        def write(rel: str = rel, serialized: bytes = serialized, text: str | None = text) -> None:
            path = epath.Path(out_dir) / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(serialized)
            if text is not None:
                (epath.Path(out_dir) / mf.function_path(plan.tags, sig, ".mlir")).write_text(text)

        _on_store(out_dir, f"writing the exported function {rel}", write)
        signatures[sig] = {
            "method_name": method,
            "file": rel,
            "inputs": {n: mf.spec_json(s.shape, s.dtype) for n, s in receiver.receiver_tensors.items()},
            "outputs": _output_specs(exported),
            **mf.example_parsing_json(receiver),
        }
    return {
        "tags": list(plan.tags),
        "platforms": list(plan.platforms),
        "mode": plan.mode,
        "batching": batching[0] if batching else None,
        "signatures": signatures,
    }, programs


def _saved_model(out_dir: str, flat: dict[str, Any],
                 converted: list[tuple[GraphFunctions, dict[str, Any], dict[str, Any]]]) -> dict[str, Any] | None:
    """With TensorFlow installed, a TF SavedModel of the same signatures (export/saved_model.py)."""
    if importlib.util.find_spec("tensorflow") is None:
        log.info("No TensorFlow SavedModel (saved_model.pb) written: TensorFlow is not installed. "
                 "The export serves with load_exported and `tpu-estimator serve`; for TF Serving, "
                 "saved_model_cli or tf.saved_model.load, pip install 'tpu_estimator[tf]' and export again.")
        return None
    import tensorflow as tf

    from tpu_estimator.export import saved_model as tf_sm
    from tpu_estimator.export.tf_call_module import TargetTooOld

    reason = tf_sm.incompatibility()
    if reason is not None:
        log.warning(
            "No TensorFlow SavedModel (saved_model.pb) written: TensorFlow %s cannot run the StableHLO "
            "that JAX %s serializes, at any target tried (%s). Use a TensorFlow release newer than this JAX, "
            "or the JAX release that TensorFlow supports; the jax.export artifacts are written as usual.",
            tf.__version__, jax.__version__, reason,
        )
        return None
    graphs = [
        tf_sm.MetaGraph(
            graph["tags"],
            graph["platforms"],
            {n: (tuple(s.shape), s.dtype) for n, s in fns.receiver.receiver_tensors.items()},
            {sig: (entry["method_name"], programs[sig]) for sig, entry in graph["signatures"].items()},
            mf.example_parsing_json(fns.receiver).get("example_parsing"),  # (None: arrays in, as before)
        )
        for fns, graph, programs in converted
    ]
    target = tf_sm.stablehlo_target()
    try:
        return tf_sm.write(out_dir, flat, graphs, target=target)
    except TargetTooOld as e:
        log.warning(
            "No TensorFlow SavedModel (saved_model.pb) written: TensorFlow %s reads StableHLO up to %s, and "
            "this model needs newer ops. %s Use a TensorFlow release built with a newer StableHLO; the "
            "jax.export artifacts are written as usual.", tf.__version__, target, e,
        )
        return None


def _output_specs(exported: Any) -> dict[str, Any]:
    index = jax.tree.unflatten(exported.out_tree, list(range(len(exported.out_avals))))
    return {name: mf.spec_json(exported.out_avals[i].shape, exported.out_avals[i].dtype) for name, i in index.items()}


def _variables(
    core: "Core", checkpoint_path: str | None, receivers: Mapping[str, ServingInputReceiver]
) -> tuple[dict[str, Any], int | None]:
    """The variables to export ({'params': ..., other collections}) and their global step."""
    ref = core.find_checkpoint(checkpoint_path)
    if ref is None:
        variables = _warm_start_variables(core, receivers)
        if variables is None:
            raise ValueError(f"Couldn't find trained model at {core.model_dir}.")
        return variables, None
    raw, _ = saved_state(ref.checkpointer.restore_raw(ref.step, leave_out=("opt_state",)))
    variables = {"params": raw["params"], **dict(raw.get("collections") or {})}
    variables = components.inference_variables(core.components, raw.get("extras"), variables)
    variables.update(components.export_state(core.components, raw.get("extras")))
    return variables, int(ref.step)


def _warm_start_variables(
    core: "Core", receivers: Mapping[str, ServingInputReceiver]
) -> dict[str, Any] | None:
    """Without a checkpoint, the original exported the `warm_start_from` variables.

    The model is initialised on one zero example of the receiver (PREDICT if
    exported, else the first mode), then warm-started.
    """
    settings = ws.settings_of(core.warm_start_from)
    if settings is None:
        return None
    mode = ModeKeys.PREDICT if ModeKeys.PREDICT in receivers else next(iter(receivers))
    receiver = receivers[mode]
    zeros = {
        name: np.zeros(tuple(1 if d is None else d for d in spec.shape), spec.dtype)
        for name, spec in receiver.receiver_tensors.items()
    }
    labels = None
    if mode != ModeKeys.PREDICT:
        labels = {n: zeros.pop(n) for n in getattr(receiver, "labels", {}) if n in zeros} or None
        if labels is not None and set(labels) == {"labels"}:
            labels = labels["labels"]
    model = core.bind(mode, use_tpu=False)
    _, fresh = model.init(jax.random.PRNGKey(core.config.seed), receiver.make_features(zeros), labels)
    prev = ws.source_variables(settings.ckpt_to_initialize_from, core.variable_readers)
    return ws.warm_start(jax.device_get(fresh), settings, prev)


def _rename_to_timestamp(tmp: str, base: str) -> str:
    """Renames local `tmp` to `base/<unix seconds>`; on a clash waits a second and retries."""
    for _ in range(_RENAME_ATTEMPTS):
        final = join(base, str(int(time.time())))
        if not epath.Path(final).exists():
            try:
                os.rename(tmp, final)  # (local paths) fails if another export took the name meanwhile
                return final
            except OSError:
                pass
        time.sleep(1.0)
    raise RuntimeError(f"Failed to obtain a unique export directory name under {base} after "
                       f"{_RENAME_ATTEMPTS} attempts.")


def _unused_timestamp(base: str) -> str:
    """`base/<unix seconds>` that holds no object yet (object stores; waits a second on a clash).

    An object store cannot reserve a name atomically: two exporters writing to one
    `export_dir_base` in the same second could share a directory (one writer per base,
    as for a model_dir)."""
    for _ in range(_RENAME_ATTEMPTS):
        final = join(base, str(int(time.time())))
        if not epath.Path(final).exists():
            return final
        time.sleep(1.0)
    raise RuntimeError(f"Failed to obtain a unique export directory name under {base} after "
                       f"{_RENAME_ATTEMPTS} attempts.")


def _remove(directory: str) -> None:
    """Removes a partial export (best effort: a leftover one without a manifest is ignored;
    on a store that stays away it is left after at most `storage_timeout_s`)."""

    def remove() -> None:
        path = epath.Path(directory)
        if path.exists():
            path.rmtree()

    try:
        _on_store(directory, "removing the partial export", remove)
    except Exception:  # noqa: BLE001 - best effort
        log.warning("Could not remove the partial export %s.", directory)


def _on_store(path: str, what: str, fn: Callable[[], Any]) -> Any:
    """`fn()` (I/O under `path`); on an object store that stays away for `storage_timeout_s`
    a CheckpointStorageError naming `path` (tpu_estimator/storage.py). Local: `fn()` as is."""
    return bounded(fn, uri=path, what=f"{what} (export_saved_model)")


def _versions() -> dict[str, Any]:
    import jaxlib

    return {
        "tpu_estimator": __version__,
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "numpy": np.__version__,
        "serialization": "jax.export",
    }


def _check_base(export_dir_base: Any) -> str:
    """The export base as a URI, created now (before any work) if missing."""
    base = as_uri(export_dir_base, arg="export_dir_base")
    try:
        _on_store(base, "creating export_dir_base", lambda: epath.Path(base).mkdir(parents=True, exist_ok=True))
    except OSError as e:
        raise ValueError(
            message(
                "`export_dir_base` must be a directory the export can be written in.",
                f"export_dir_base={base!r} ({type(e).__name__}: {e})",
                "Pass a directory (it is created if missing), not a file or a path under one.",
            )
        ) from e
    return base


def _check_map(fn_map: Any) -> list[str]:
    if not isinstance(fn_map, Mapping) or not fn_map:
        raise ValueError(
            message(
                "`input_receiver_fn_map` must be a non-empty dict of ModeKeys to receiver functions.",
                f"input_receiver_fn_map={fn_map!r}",
            )
        )
    for mode, fn in fn_map.items():
        ModeKeys.validate(mode)
        if fn is None:
            raise ValueError("An input_receiver_fn must be defined.")
        if not callable(fn):
            raise TypeError(
                message("An input_receiver_fn must be a callable taking no arguments.", f"{mode}: {fn!r}")
            )
    return list(fn_map)


def _call_receiver_fn(mode: str, fn: Callable[[], Any]) -> ServingInputReceiver:
    receiver = fn()
    if not isinstance(receiver, ServingInputReceiver):
        raise TypeError(
            message(
                "The input receiver function must return a ServingInputReceiver "
                "(or a SupervisedInputReceiver for TRAIN/EVAL).",
                f"{mode}: {type(receiver).__name__}",
                "Use tpu_estimator.build_raw_serving_input_receiver_fn({...}).",
            )
        )
    return receiver


def _check_assets(assets_extra: Any) -> dict[str, str]:
    if assets_extra is None:
        return {}
    if not isinstance(assets_extra, Mapping):
        raise TypeError(message("`assets_extra` must be a dict of destination to source path.",
                                f"assets_extra={type(assets_extra).__name__}"))
    out = {}
    for dest, src in assets_extra.items():
        dest = posixpath.normpath(os.fsdecode(dest))  # (a name inside the export, not a user location)
        if posixpath.isabs(dest) or dest.startswith(".."):
            raise ValueError(message("`assets_extra` destinations must be relative paths inside "
                                     "assets.extra.", f"destination {dest!r}"))
        source = as_path(src, arg=f"assets_extra[{dest!r}]")
        if not source.is_file():
            raise ValueError(message("`assets_extra` sources must be existing files.",
                                     f"assets_extra[{dest!r}]={src!r}"))
        out[dest] = str(source)
    return out
