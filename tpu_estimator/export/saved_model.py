"""A TensorFlow SavedModel beside the `jax.export` artifacts (only when TensorFlow is importable).

`export_saved_model` imports this module only when `tensorflow` can be
imported (the `tf` extra). Each signature's `jax.export.Exported` (the one the
export serialized) becomes an `XlaCallModule` op, as jax2tf's native
serialization makes it, holding the StableHLO of the platforms that meta graph
was exported for, the batch dimension polymorphic, serialized at the StableHLO
version this TensorFlow reads (export/tf_call_module.py; the manifest's
`saved_model.stablehlo_target`). One SavedModel is written into the export
directory:

```
<export_dir_base>/<timestamp>/
  saved_model.pb                          one MetaGraphDef per tag set, its SignatureDefs
  variables/variables.index               the weights as TF variables (a TF checkpoint)
  variables/variables.data-00000-of-00001
```

The TF variables are named like ours (`params/Dense_0/kernel`) and shared by
every meta graph; they are initialised from placeholders, so the weights are
stored once in `variables/`, never as graph constants. A meta graph per tag
set (`serve`, `serve,tpu`, `train`, `eval`) is written with the TF1
`SavedModelBuilder`, the one writer that puts several tag sets over one set of
variables (TF Serving on CPU loads `serve`, on TPU `serve,tpu`).

A parsing export's meta graph (`build_parsing_serving_input_receiver_fn`; the
manifest's `example_parsing` entry) takes what TensorFlow Estimator's took: one
1-D string tensor of serialized `tf.Example`s, parsed inside the graph
(export/tf_example_parsing.py) before the converted function. As in
`tf.saved_model.classification_signature_def`, the classify and regress
signatures name it `inputs` (what TF Serving's `:classify`/`:regress` feed);
the others name it as the receiver does (`examples`).

A classify signature's `classes` is made a string tensor here (and only here:
`load_exported` and our server keep the model's ids), because TF Serving's
`:classify` rejects any other dtype. What TF Serving checks (its
servables/tensorflow/classifier.cc, `PreProcessClassification` and
`PostProcessClassificationResult`): method name `tensorflow/serving/classify`;
exactly one input, keyed `inputs`, fed the serialized Examples (so only a
parsing export can be called through `:classify`); one or two outputs, at least
one of `classes` and `scores`; `classes` DT_STRING and `scores` DT_FLOAT, each
of rank 2, `[batch, num_classes]`, batch equal to the number of Examples, and
the two agreeing on num_classes (each row's labels paired with its scores). So
beyond the dtype, which `string_classes` fixes, `:classify` wants float32
`scores` and both outputs `[batch, num_classes]`, as TF Estimator's heads gave
them (`classes` every class's label per row, e.g. `jnp.broadcast_to(jnp.arange(n),
(batch, n))`); a `[batch]` argmax there is an error at request time, and
`:predict` takes any shape.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np
import tensorflow as tf
from etils import epath

from tpu_estimator.api.example_parsing import ExampleSpec
from tpu_estimator.export import tf_call_module, tf_example_parsing
from tpu_estimator.storage import bounded

SAVED_MODEL_FILE = "saved_model.pb"
TF_VARIABLES_PREFIX = "variables/variables"

_TF_NAME = re.compile(r"[^A-Za-z0-9_.\-/]")


class MetaGraph:
    """One tag set to convert: its platforms, receiver specs and `{signature: (method, exported)}`.

    `exported` is the `jax.export.Exported` of `fn(flat_variables, inputs) -> {name: array}`
    the export serialized; `inputs` maps input names to `(shape with None for the batch, dtype)`.
    `example_parsing` is the manifest's entry of a parsing receiver's signatures
    (`{"input": "examples", "features": {...}}`), else None.
    """

    def __init__(
        self,
        tags: Sequence[str],
        platforms: Sequence[str],
        inputs: Mapping[str, tuple[tuple[int | None, ...], Any]],
        signatures: Mapping[str, tuple[str, Any]],
        example_parsing: Mapping[str, Any] | None = None,
    ) -> None:
        self.tags = list(tags)
        self.platforms = tuple(platforms)
        self.inputs = dict(inputs)
        self.signatures = dict(signatures)
        self.example_parsing = None if example_parsing is None else dict(example_parsing)


def incompatibility() -> str | None:
    """Why this TensorFlow cannot run what this JAX serializes at any StableHLO target (None: it can).

    Seen before the target was chosen: JAX 0.12.0.1 with TF 2.21 at jax.export's
    own target, "unregistered operation 'vhlo.custom_call_v2'". Probed once per
    process (tf_call_module.probe).
    """
    return tf_call_module.probe().reason


def stablehlo_target() -> str:
    """The StableHLO version the SavedModel's programs are serialized at (TF 2.21: '1.13.7')."""
    target = tf_call_module.probe().target
    if target is None:
        raise ValueError(f"TensorFlow cannot run this JAX's programs: {incompatibility()}")
    return target


def write(out_dir: str, flat: Mapping[str, np.ndarray], graphs: Sequence[MetaGraph], *, target: str
          ) -> dict[str, Any]:
    """Writes `saved_model.pb` and `variables/` into `out_dir`; returns the manifest's entry.

    The programs are serialized at StableHLO `target`; one that needs newer ops
    raises `tf_call_module.TargetTooOld` before anything is written. The
    SavedModel is built in a local temporary directory (the builder wants a new
    one) and copied into `out_dir` (local or an object store).
    """
    with tempfile.TemporaryDirectory(prefix="tpu_estimator_saved_model-") as tmp:
        local = os.path.join(tmp, "saved_model")
        described = _build(local, flat, graphs, target)

        def copy() -> None:
            for root, _, files in os.walk(local):
                for name in files:
                    src = os.path.join(root, name)
                    rel = os.path.relpath(src, local).replace(os.sep, "/")
                    dest = epath.Path(out_dir) / rel
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    with open(src, "rb") as fin, dest.open("wb") as fout:
                        shutil.copyfileobj(fin, fout)

        bounded(copy, uri=out_dir, what="copying the TF SavedModel (export_saved_model)")
    return {
        "file": SAVED_MODEL_FILE,
        "variables": TF_VARIABLES_PREFIX,
        "tensorflow": tf.__version__,
        "xla_call_module_version": jax.config.jax_export_calling_convention_version,
        "stablehlo_target": target,
        "meta_graphs": described,
    }


def _build(directory: str, flat: Mapping[str, np.ndarray], graphs: Sequence[MetaGraph], target: str
           ) -> list[dict[str, Any]]:
    graph = tf.Graph()
    described = []
    with graph.as_default():
        feeds, variables = {}, {}
        for name, value in flat.items():
            ph = tf.compat.v1.placeholder(tf.as_dtype(value.dtype), value.shape)
            feeds[ph] = value
            variables[name] = tf.compat.v1.Variable(ph, name=tf_variable_name(name), use_resource=True,
                                                    trainable=False)
        sig_maps = []
        for meta in graphs:
            with tf.name_scope("_".join(meta.tags) or "graph"):
                sig_maps.append(_signature_defs(meta, variables, target))
            described.append({"tags": meta.tags, "signatures": sorted(sig_maps[-1])})
        session_config = tf.compat.v1.ConfigProto(device_count={"GPU": 0})  # (JAX owns the accelerators)
        with tf.compat.v1.Session(graph=graph, config=session_config) as sess:
            sess.run(tf.compat.v1.global_variables_initializer(), feed_dict=feeds)
            builder = tf.compat.v1.saved_model.Builder(directory)
            for i, (meta, sig_map) in enumerate(zip(graphs, sig_maps)):
                if i == 0:
                    builder.add_meta_graph_and_variables(sess, meta.tags, signature_def_map=sig_map)
                else:
                    builder.add_meta_graph(meta.tags, signature_def_map=sig_map)
            builder.save()
    return described


def _signature_defs(meta: MetaGraph, variables: Mapping[str, Any], target: str) -> dict[str, Any]:
    """{signature: SignatureDef}: placeholders in, the exported function's `XlaCallModule` outputs out."""
    if meta.example_parsing is None:
        placeholders = {
            name: tf.compat.v1.placeholder(tf.as_dtype(np.dtype(dtype)), shape, name=tf_variable_name(name))
            for name, (shape, dtype) in meta.inputs.items()
        }
        fn_inputs, sig_inputs = placeholders, lambda method: placeholders
    else:
        fn_inputs, sig_inputs = _parsed_inputs(meta)
    values = {name: tf.convert_to_tensor(v) for name, v in variables.items()}
    out = {}
    for sig, (method, exported) in sorted(meta.signatures.items()):
        with tf.name_scope(tf_variable_name(sig)):
            try:
                outputs = tf_call_module.call(exported, (values, fn_inputs), target=target)
            except tf_call_module.TargetTooOld as e:
                raise tf_call_module.TargetTooOld(f"Signature {sig!r} of tag set {meta.tags}: {e}") from e
            if method == tf.saved_model.CLASSIFY_METHOD_NAME and "classes" in outputs:
                outputs = {**outputs, "classes": string_classes(outputs["classes"])}
        out[sig] = tf.compat.v1.saved_model.signature_def_utils.build_signature_def(
            inputs={n: _tensor_info(t) for n, t in sig_inputs(method).items()},
            outputs={n: _tensor_info(t) for n, t in outputs.items()},
            method_name=method,
        )
    return out


_EXAMPLE_INPUT_KEYS = {  # what TF Serving's Classify and Regress APIs feed the Examples as
    tf.saved_model.CLASSIFY_METHOD_NAME: tf.saved_model.CLASSIFY_INPUTS,
    tf.saved_model.REGRESS_METHOD_NAME: tf.saved_model.REGRESS_INPUTS,
}


def _parsed_inputs(meta: MetaGraph) -> tuple[dict[str, Any], Callable[[str], dict[str, Any]]]:
    """A parsing meta graph's one string placeholder, parsed into the function's inputs.

    Returns the parsed `{feature: tensor}` and `method -> {signature input key: placeholder}`.
    """
    key = meta.example_parsing["input"]
    batch = next(iter(meta.inputs.values()))[0][0]  # (all inputs share the batch dimension)
    examples = tf.compat.v1.placeholder(tf.string, [batch], name=tf_variable_name(key))
    parsed = tf_example_parsing.parse(examples, ExampleSpec.from_json(meta.example_parsing["features"]))
    return parsed, lambda method: {_EXAMPLE_INPUT_KEYS.get(method, key): examples}


def string_classes(classes: Any) -> Any:
    """A classify signature's `classes` as the DT_STRING tensor TF Serving's `:classify` requires.

    Integers become their decimal strings (`3` -> `"3"`, as `str`); bools the
    class ids `"0"`/`"1"`; floats `%.17g` (float64) or `%.9g` (narrower, via
    float32): the shortest of fixed or exponent form with enough digits that
    the string reads back as the same number (`3.0` -> `"3"`, `0.5` -> `"0.5"`;
    the default `%g` would print the id `123456789.0` as `"1.23457e+08"`).
    Strings (never made by JAX) are kept. The shape is kept too.
    """
    if classes.dtype == tf.string:
        return classes
    if classes.dtype == tf.bool:
        classes = tf.cast(classes, tf.int32)
    if classes.dtype.is_floating:
        if classes.dtype != tf.float64:
            classes = tf.cast(classes, tf.float32)
        return tf.strings.as_string(classes, shortest=True, precision=17 if classes.dtype == tf.float64 else 9)
    return tf.strings.as_string(classes)


def _tensor_info(tensor: Any) -> Any:
    return tf.compat.v1.TensorInfo(
        name=tensor.name, dtype=tensor.dtype.as_datatype_enum, tensor_shape=tensor.shape.as_proto()
    )


def tf_variable_name(name: str) -> str:
    """Our flat name as a valid TF op name: 'params/Dense_0/kernel' is kept; other characters -> '_'."""
    name = _TF_NAME.sub("_", name).strip("/") or "_"
    return name if re.match(r"[A-Za-z0-9.]", name) else "v" + name
