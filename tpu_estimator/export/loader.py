"""`load_exported`: an export directory as callable signatures, with only JAX (no model code).

The functions are deserialized with `jax.export.deserialize` and the weights
read from safetensors: nothing is unpickled and the `model_fn` that produced
them is not needed.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from typing import Any, Mapping, Sequence

import jax
import numpy as np
from etils import epath

from tpu_estimator.api.checks import message
from tpu_estimator.api.example_parsing import ExampleSpec
from tpu_estimator.export import manifest as mf
from tpu_estimator.checkpoint import flat_io as var_io
from tpu_estimator.paths import as_uri


class Signature:
    """One exported signature: `sig(x=array, ...)` or `sig({'x': array})` -> dict of numpy arrays.

    A signature exported with `build_parsing_serving_input_receiver_fn` also
    takes `sig(examples=[serialized tf.Example, ...])`, parsed on the host."""

    def __init__(self, name: str, entry: dict[str, Any], exported: Any, variables: dict[str, Any]) -> None:
        self.name = name
        self.method_name: str = entry["method_name"]
        self.inputs: dict[str, dict[str, Any]] = entry["inputs"]
        self.outputs: dict[str, dict[str, Any]] = entry["outputs"]
        self.exported = exported
        self._variables = variables
        self._call = jax.jit(exported.call)
        parsing = entry.get("example_parsing")  # a parsing receiver's: tf.Examples in
        self.example_spec = None if parsing is None else ExampleSpec.from_json(parsing["features"])
        self.examples_input: str | None = None if parsing is None else parsing["input"]

    def __repr__(self) -> str:
        return f"Signature({self.name!r}, method_name={self.method_name!r}, inputs={list(self.request_inputs)})"

    @property
    def request_inputs(self) -> dict[str, dict[str, Any]]:
        """What a caller sends: `{'examples': bytes (batch,)}` for a parsing signature, else `inputs`.

        `inputs` are always the exported function's (parsed) arrays."""
        if self.examples_input is None:
            return self.inputs
        return {self.examples_input: {"dtype": "string", "shape": [None]}}

    def parse_examples(self, serialized: Any) -> dict[str, np.ndarray]:
        """A batch of serialized tf.Examples -> the function's inputs (parsing signatures only)."""
        if self.example_spec is None:
            raise ValueError(message(f"Signature {self.name!r} takes arrays, not serialized tf.Examples.",
                                     f"examples for inputs {sorted(self.inputs)}"))
        if isinstance(serialized, (bytes, str)) or not isinstance(serialized, (list, tuple, np.ndarray)):
            raise ValueError(message("`examples` must be a batch (a list) of serialized tf.Examples.",
                                     f"examples of type {type(serialized).__name__}", "Wrap one: [data]."))
        return self.check_inputs(self.example_spec.parse(list(serialized)))

    def check_inputs(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """The inputs as arrays of the exported dtypes and shapes; ValueError naming the culprit."""
        missing = sorted(set(self.inputs) - set(inputs))
        unknown = sorted(set(inputs) - set(self.inputs))
        if missing or unknown:
            raise ValueError(
                message(
                    f"Signature {self.name!r} takes the inputs {sorted(self.inputs)}.",
                    f"missing={missing}, unknown={unknown}",
                )
            )
        out = {}
        for name, spec in self.inputs.items():
            out[name] = _as_input(inputs[name], name, spec)
        batch = {a.shape[0] for n, a in out.items() if self.inputs[n]["shape"][:1] == [None]}
        if len(batch) > 1:
            raise ValueError(
                message("All batched inputs must have the same batch size (dimension 0).",
                        ", ".join(f"{n}: {a.shape}" for n, a in out.items()))
            )
        return out

    def __call__(self, inputs: Mapping[str, Any] | None = None, /, **kwargs: Any) -> dict[str, np.ndarray]:
        given = {**(inputs or {}), **kwargs}
        if self.examples_input is not None and set(given) == {self.examples_input} != set(self.inputs):
            arrays = self.parse_examples(given[self.examples_input])  # sig(examples=[b'...'])
        else:
            arrays = self.check_inputs(given)
        result = self._call(self._variables, arrays)
        return {k: np.asarray(v) for k, v in jax.device_get(result).items()}


class ExportedModel:
    """A loaded export: `.signatures`, `.manifest`, `.meta_graph`, `.tags`, `.platforms`."""

    def __init__(self, path: str, manifest: dict[str, Any], graph: dict[str, Any]) -> None:
        self.path = path
        self.manifest = manifest
        self.meta_graph = graph
        self.tags = tuple(graph["tags"])
        self.platforms = tuple(graph["platforms"])
        self.global_step = manifest.get("global_step")
        var = manifest["variables"]
        flat = var_io.load(path, var["file"], var.get("dtypes"))
        variables = jax.device_put(flat)
        self.signatures: dict[str, Signature] = {}
        for name, entry in graph["signatures"].items():
            exported = deserialize((epath.Path(path) / entry["file"]).read_bytes())
            self.signatures[name] = Signature(name, entry, exported, variables)

    @property
    def version(self) -> str:
        """The export's directory name (its unix timestamp)."""
        return epath.Path(self.path).name

    @property
    def batching(self) -> dict[str, Any] | None:
        """Batching settings recorded by `inference_on_tpu`: this tag set's, else any other's."""
        if self.meta_graph.get("batching"):
            return self.meta_graph["batching"]
        return next((g["batching"] for g in self.manifest["meta_graphs"] if g.get("batching")), None)

    def __repr__(self) -> str:
        return f"ExportedModel({self.path!r}, tags={self.tags}, signatures={sorted(self.signatures)})"


_deserialized: "weakref.WeakValueDictionary[str, jax.export.Exported]" = weakref.WeakValueDictionary()
_deserialized_lock = threading.Lock()


def deserialize(data: bytes) -> jax.export.Exported:
    """`jax.export.deserialize`, one `Exported` per distinct serialized function in the process.

    JAX's tracing caches key on the `Exported` object (call_exported's abstract
    evaluation keeps up to 4,096 entries), so each reload of a version with a
    fresh `Exported` left the old one and its symbolic shapes alive there:
    ~0.35 MB more per hot reload (benchmarks/reload_trace.py). An export whose
    function is unchanged (new weights) now finds the `Exported` already cached.
    """
    key = hashlib.sha256(data).hexdigest()
    with _deserialized_lock:
        exported = _deserialized.get(key)
        if exported is None:
            exported = jax.export.deserialize(bytearray(data))
            _deserialized[key] = exported
    return exported


def load_exported(path: Any, tags: Sequence[str] | str = ("serve",)) -> ExportedModel:
    """Loads an export written by `export_saved_model` (needs only tpu_estimator and JAX).

    Args:
      path: The export directory (`<export_dir_base>/<timestamp>`; str or bytes,
        as `export_saved_model` returns it): local, or `gs://...`.
      tags: The tag set to load: `('serve',)` for the CPU program,
        `('serve', 'tpu')` for the accelerator one, `('train',)`/`('eval',)`.

    Returns:
      An `ExportedModel`; `model.signatures['serving_default'](x=array)` returns
      the dict of output arrays.

    Raises:
      ValueError: `path` is not an export, or the tag set was not exported
        (the message lists those that were).

    Example:
      >>> model = load_exported(est.export_saved_model('/tmp/export', receiver_fn))
      >>> model.signatures['serving_default'](x=np.ones((2, 4), np.float32))['logits'].shape
      (2, 3)
    """
    path = as_uri(path, arg="path")
    manifest = mf.read_manifest(path)
    graph = mf.find_meta_graph(manifest, tags)
    return ExportedModel(path, manifest, graph)


def _as_input(value: Any, name: str, spec: dict[str, Any]) -> np.ndarray:
    dtype = np.dtype(jax.numpy.dtype(spec["dtype"]))
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError) as e:  # ragged lists
        raise ValueError(message(f"Input {name!r} must be a rectangular array.", str(e).splitlines()[0])) from e
    if arr.dtype == object or arr.dtype.kind in "USV":
        raise ValueError(
            message(f"Input {name!r} must be numeric with dtype {dtype.name} (no ragged or string values).",
                    f"an array of dtype {arr.dtype}")
        )
    accepted = {"f": "fiu", "c": "cfiu", "i": "iu", "u": "iu", "b": "b"}.get(dtype.kind, dtype.kind)
    if arr.dtype.kind not in accepted:
        raise ValueError(
            message(f"Input {name!r} has dtype {dtype.name}.", f"values of dtype {arr.dtype}",
                    f"Send {dtype.name} values.")
        )
    shape = spec["shape"]
    if arr.ndim != len(shape) or any(d is not None and d != s for d, s in zip(shape, arr.shape)):
        want = tuple("?" if d is None else d for d in shape)
        raise ValueError(
            message(f"Input {name!r} must have shape {want} ('?' is any size).", f"shape {arr.shape}")
        )
    return arr.astype(dtype, copy=False)
