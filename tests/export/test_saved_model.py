"""With TensorFlow installed, export_saved_model also writes a TF SavedModel (export/saved_model.py).

TensorFlow is in the `test` extra: these tests run in CI (never skipped).
"""

import importlib.util
import json
import logging
import os
import re
import shutil
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf

import export_test_model as tm
import tpu_estimator as te
from tpu_estimator.api.example_parsing import ExampleSpec
from tpu_estimator.checkpoint import flat_io as var_io
from tpu_estimator.export import saved_model as tf_sm
from tpu_estimator.export import tf_call_module

# The SavedModel's programs are serialized at a StableHLO version this TensorFlow reads
# (export/tf_call_module.py: JAX 0.12.0.1's own 1.18.0 is too new for TF 2.21, which reads
# 1.13.7). Only a TensorFlow that runs none of the candidate targets gets no SavedModel (and a
# warning, tested below on every version); the tests that load one are then expected to fail,
# strictly: no installed pair of versions does that today.
INCOMPATIBLE = tf_sm.incompatibility()
needs_compatible_tf = pytest.mark.xfail(
    INCOMPATIBLE is not None, strict=True,
    reason=f"TensorFlow {tf.__version__} runs JAX's StableHLO at no target: {INCOMPATIBLE}",
)


def _manifest(path):
    with open(os.path.join(os.fsdecode(path), "manifest.json")) as f:
        return json.load(f)


def _tf_load(path, tags=("serve",)):
    return tf.saved_model.load(os.fsdecode(path), tags=list(tags))


def _call(signature, **inputs):
    return {k: v.numpy() for k, v in signature(**{n: tf.constant(a) for n, a in inputs.items()}).items()}


def _as_in_saved_model(name, outputs):
    """Our signature's outputs as the SavedModel gives them: a classify's `classes` as strings."""
    if name != "classify" or "classes" not in outputs:
        return outputs
    return {**outputs, "classes": np.vectorize(lambda c: str(c).encode(), otypes=[object])(outputs["classes"])}


@needs_compatible_tf
def test_each_signature_gives_the_outputs_of_predict(trained_est, export_path):
    expected = tm.expected_predictions(trained_est)
    loaded = _tf_load(export_path)
    assert sorted(loaded.signatures) == ["classify", "regress", "serving_default"]
    ours = te.load_exported(export_path).signatures
    for name in ("serving_default", "classify", "regress"):
        for batch in (tm.X, tm.X[:3]):  # the batch dimension is polymorphic
            got = _call(loaded.signatures[name], x=batch)
            want = _as_in_saved_model(name, ours[name](x=batch))
            assert sorted(got) == sorted(want)
            for key in want:
                if want[key].dtype == object:
                    np.testing.assert_array_equal(got[key], want[key])
                else:
                    np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6)
    out = _call(loaded.signatures["serving_default"], x=tm.X)
    np.testing.assert_allclose(out["logits"], expected["logits"], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(out["classes"], expected["classes"])
    probs = _call(loaded.signatures["classify"], x=tm.X)["scores"]
    np.testing.assert_allclose(probs, tf.nn.softmax(expected["logits"]).numpy(), rtol=1e-5, atol=1e-6)


@needs_compatible_tf
def test_classify_classes_are_strings_in_the_saved_model_only(trained_est, export_path):
    """TF Serving's :classify takes only DT_STRING `classes`: the ids as decimal strings there."""
    expected = tm.expected_predictions(trained_est)["classes"]
    assert expected.dtype == np.int32 and len(set(expected.tolist())) > 1
    classes = _tf_load(export_path).signatures["classify"](x=tf.constant(tm.X))["classes"]
    assert classes.dtype == tf.string
    assert classes.numpy().tolist() == [str(c).encode() for c in expected]
    ours = te.load_exported(export_path).signatures["classify"](x=tm.X)["classes"]  # (our own: the ids)
    assert ours.dtype == np.int32
    np.testing.assert_array_equal(ours, expected)
    serving_default = _tf_load(export_path).signatures["serving_default"](x=tf.constant(tm.X))["classes"]
    assert serving_default.dtype == tf.int32  # (other methods keep every output as it is)


@pytest.mark.parametrize("dtype, values, strings", [
    (tf.int32, [[0, 7], [-3, 2147483647]], ["0", "7", "-3", "2147483647"]),
    (tf.int64, [[2**40, -1]], ["1099511627776", "-1"]),
    (tf.uint8, [[255, 0]], ["255", "0"]),
    (tf.bool, [[True, False]], ["1", "0"]),
    (tf.float32, [[3.0, 0.5], [16777216.0, 0.1]], ["3", "0.5", "16777216", "0.100000001"]),
    (tf.float64, [[123456789.0, 0.1]], ["123456789", "0.10000000000000001"]),
    (tf.bfloat16, [[2.0, 0.5]], ["2", "0.5"]),
    (tf.string, [[b"cat", b"dog"]], ["cat", "dog"]),
])
def test_string_classes_spells_each_dtype(dtype, values, strings):
    """Integers as `str`; floats with the digits to read back as the same number (not %g's 6)."""
    got = tf_sm.string_classes(tf.constant(values, dtype))
    assert got.dtype == tf.string and got.shape == tf.constant(values, dtype).shape
    assert [s.decode() for s in got.numpy().reshape(-1)] == strings
    if dtype.is_floating:
        read = np.asarray([float(s) for s in strings]).astype(dtype.as_numpy_dtype)
        np.testing.assert_array_equal(read, tf.constant(values, dtype).numpy().reshape(-1))


@needs_compatible_tf
def test_saved_model_cli_lists_tag_sets_signatures_inputs_and_outputs(export_path):
    cli = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
    proc = subprocess.run([cli, "show", "--all", "--dir", os.fsdecode(export_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = proc.stdout
    assert "MetaGraphDef with tag-set: 'serve' contains the following SignatureDefs" in text
    assert "MetaGraphDef with tag-set: 'serve, tpu' contains the following SignatureDefs" in text
    serve = text.split("MetaGraphDef with tag-set: 'serve, tpu'")[0]  # (the CPU graph comes first)
    for sig, method, outputs in [
        ("serving_default", "tensorflow/serving/predict", ["logits", "classes"]),
        ("classify", "tensorflow/serving/classify", ["scores", "classes"]),
        ("regress", "tensorflow/serving/regress", ["outputs"]),
    ]:
        block = serve.split(f"signature_def['{sig}']:")[1].split("signature_def[")[0]
        assert f"Method name is: {method}" in block
        assert "inputs['x'] tensor_info:\n        dtype: DT_FLOAT\n        shape: (-1, 4)" in block
        for name in outputs:
            assert f"outputs['{name}'] tensor_info:" in block
        if "classes" in outputs:  # (TF Serving's :classify takes only string classes)
            classes = block.split("outputs['classes'] tensor_info:\n")[1]
            dtype = "DT_STRING" if sig == "classify" else "DT_INT32"
            assert classes.startswith(f"        dtype: {dtype}\n"), classes[:100]


@needs_compatible_tf
def test_variables_are_tf_variables_in_variables_dir(export_path):
    path = os.fsdecode(export_path)
    files = sorted(os.listdir(os.path.join(path, "variables")))
    assert files == ["variables.data-00000-of-00001", "variables.index", "variables.safetensors"]
    m = _manifest(path)
    ours = var_io.load(path, m["variables"]["file"], m["variables"]["dtypes"])
    prefix = os.path.join(path, "variables", "variables")
    in_checkpoint = dict(tf.train.list_variables(prefix))
    assert set(ours) <= set(in_checkpoint) and "params/Dense_0/kernel" in in_checkpoint
    for name, value in ours.items():
        assert tuple(in_checkpoint[name]) == value.shape
        np.testing.assert_array_equal(tf.train.load_variable(prefix, name), value)
    loaded = _tf_load(path)
    assert {v.name.split(":")[0] for v in loaded.variables} >= set(ours)
    # the weights live in variables/, not as constants in the graph
    graph = open(os.path.join(path, "saved_model.pb"), "rb").read()
    assert ours["params/Dense_0/kernel"].tobytes() not in graph


@needs_compatible_tf
def test_manifest_records_the_saved_model(export_path):
    sm = _manifest(export_path)["saved_model"]
    assert sm["file"] == "saved_model.pb" and sm["tensorflow"] == tf.__version__
    assert sm["xla_call_module_version"] >= 9
    tags = {tuple(g["tags"]): g["signatures"] for g in sm["meta_graphs"]}
    assert tags == {("serve",): ["classify", "regress", "serving_default"],
                    ("serve", "tpu"): ["classify", "regress", "serving_default"]}


@needs_compatible_tf
def test_manifest_names_the_stablehlo_target_every_program_is_written_at(export_path):
    """Every XlaCallModule of saved_model.pb holds a module produced at the manifest's target."""
    from tensorflow.python.tools import saved_model_utils  # (saved_model_cli's reader)

    target = _manifest(export_path)["saved_model"]["stablehlo_target"]
    assert target == tf_sm.stablehlo_target()
    reads = tf_call_module.tensorflow_stablehlo_version()
    assert reads is None or tf_call_module.candidates(reads)[0] == target  # (TF 2.21: 1.13.7 on every JAX)
    for tags in ("serve", "serve,tpu"):
        graph = saved_model_utils.get_meta_graph_def(os.fsdecode(export_path), tags).graph_def
        modules = [n.attr["module"].s for n in graph.node if n.op == "XlaCallModule"]
        assert len(modules) == 6, tags  # (one per signature and tag set: the meta graphs share one graph)
        assert all(re.findall(rb"StableHLO_v[0-9.]+", m) == [f"StableHLO_v{target}".encode()] for m in modules)


@needs_compatible_tf
def test_train_and_eval_graphs_share_the_variables(trained_est, tmp_path):
    path = trained_est.experimental_export_all_saved_models(
        str(tmp_path),
        {te.ModeKeys.EVAL: tm.supervised_receiver_fn, te.ModeKeys.PREDICT: tm.receiver_fn},
    )
    ev = _tf_load(path, ("eval",)).signatures["eval"]
    got = _call(ev, x=tm.X[:16], labels=tm.Y[:16])
    want = te.load_exported(path, tags=("eval",)).signatures["eval"](x=tm.X[:16], labels=tm.Y[:16])
    assert sorted(got) == sorted(want)
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-5)
    np.testing.assert_allclose(got["metrics/acc/value"], want["metrics/acc/value"], rtol=1e-6)
    assert sorted(tf.saved_model.load(os.fsdecode(path), tags=["serve"]).signatures) == [
        "classify", "regress", "serving_default"]


def test_without_tensorflow_only_the_jax_export_is_written_and_logged(trained_est, tmp_path,
                                                                       monkeypatch, caplog):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "tensorflow" else real(name, *a))
    with caplog.at_level(logging.INFO, logger="tpu_estimator"):
        path = os.fsdecode(trained_est.export_saved_model(str(tmp_path), tm.receiver_fn))
    assert "No TensorFlow SavedModel (saved_model.pb) written: TensorFlow is not installed" in caplog.text
    assert "pip install 'tpu_estimator[tf]'" in caplog.text
    assert not os.path.exists(os.path.join(path, "saved_model.pb"))
    assert os.listdir(os.path.join(path, "variables")) == ["variables.safetensors"]
    assert _manifest(path)["saved_model"] is None
    out = te.load_exported(path).signatures["serving_default"](x=tm.X[:2])
    assert out["logits"].shape == (2, 3)


@needs_compatible_tf
def test_exports_written_before_the_saved_model_still_load(export_path, tmp_path):
    old = tmp_path / "1700000000"
    shutil.copytree(os.fsdecode(export_path), old)
    for name in ("saved_model.pb", "variables/variables.index", "variables/variables.data-00000-of-00001"):
        os.remove(old / name)
    m = _manifest(old)
    del m["saved_model"]
    (old / "manifest.json").write_text(json.dumps(m))
    want = te.load_exported(export_path).signatures["serving_default"](x=tm.X[:4])
    got = te.load_exported(str(old)).signatures["serving_default"](x=tm.X[:4])
    np.testing.assert_array_equal(got["logits"], want["logits"])
    assert te.list_variables(str(old)) == te.list_variables(os.fsdecode(export_path))


def test_a_tensorflow_that_cannot_read_this_jax_gets_no_saved_model_and_a_warning(
    trained_est, tmp_path, monkeypatch, caplog
):
    monkeypatch.setattr(tf_sm, "incompatibility", lambda: "InvalidArgumentError: unregistered operation")
    with caplog.at_level(logging.INFO, logger="tpu_estimator"):
        path = os.fsdecode(trained_est.export_saved_model(str(tmp_path), tm.receiver_fn))
    assert "No TensorFlow SavedModel (saved_model.pb) written: TensorFlow" in caplog.text
    assert "cannot run the StableHLO" in caplog.text and "unregistered operation" in caplog.text
    assert not os.path.exists(os.path.join(path, "saved_model.pb"))
    assert _manifest(path)["saved_model"] is None
    out = te.load_exported(path).signatures["serving_default"](x=tm.X[:2])
    assert out["logits"].shape == (2, 3)


# --- parsing exports: serialized tf.Examples in, parsed inside the SavedModel -----------

SPEC = {
    "x": te.FixedLenFeature([4], np.float32),
    "w": te.FixedLenFeature([], np.float32, default_value=1.5),
    "m": te.FixedLenFeature([2], np.bool_, default_value=[True, False]),
    "ids": te.VarLenFeature(np.int64, max_length=3, default_value=-1),
}


def parsing_model_fn(features, labels, mode, params):
    """tm.model_fn's layers (it restores tm's checkpoint), plus outputs showing the parsed features."""
    hidden = nn.relu(nn.Dense(16)(features["x"]))  # (Dense_0 first, as in tm.model_fn)
    logits = nn.Dense(3)(hidden)
    probs = jax.nn.softmax(logits)
    preds = {"logits": logits, "w": features["w"], "m": features["m"], "ids": features["ids"]}
    return te.TPUEstimatorSpec(mode, predictions=preds, export_outputs={
        "serving_default": te.PredictOutput(preds),
        # as TF Serving's :classify wants them: [batch, num_classes] each, every class's id per row
        "classify": te.ClassificationOutput(scores=probs, classes=jnp.broadcast_to(jnp.arange(3), probs.shape)),
        "regress": te.RegressionOutput(probs[:, 1] * features["w"]),
    })


def tf_example(i, *, ids=None, w=True, m=True, x=True):
    """A tf.train.Example built by TensorFlow: ids shorter than max_length, w/m/x left out on request."""
    ex = tf.train.Example()
    if x:
        ex.features.feature["x"].float_list.value.extend(tm.X[i].tolist())
    if w:
        ex.features.feature["w"].float_list.value.append(0.25 * i)
    if m:
        ex.features.feature["m"].int64_list.value.extend([i % 2, 1])
    ex.features.feature["ids"].int64_list.value.extend(list(range(i % 4)) if ids is None else ids)
    ex.features.feature["label"].int64_list.value.append(1)  # not in the spec: ignored
    return ex.SerializeToString()


# full, shorter than max_length, no ids at all, w and m missing (their defaults)
EXAMPLES = [tf_example(i) for i in range(8)] + [tf_example(8, ids=[]), tf_example(9, w=False, m=False, ids=[5])]


@pytest.fixture(scope="module")
def parsing_est(trained_est):
    return tm.estimator(trained_est.model_dir, fn=parsing_model_fn)


@pytest.fixture(scope="module")
def parsing_export(parsing_est, tmp_path_factory):
    base = tmp_path_factory.mktemp("parsing_saved_model")
    return os.fsdecode(parsing_est.export_saved_model(str(base), te.build_parsing_serving_input_receiver_fn(SPEC)))


def _predict_parsed(est, serialized):
    """predict() on the arrays our host parser makes of the same Examples."""
    parsed = ExampleSpec(SPEC).parse(serialized)
    preds = list(est.predict(lambda params: iter([parsed]), yield_single_examples=False))
    return {k: np.concatenate([p[k] for p in preds]) for k in preds[0]}


@needs_compatible_tf
def test_parsing_export_takes_serialized_examples_and_equals_predict(parsing_est, parsing_export):
    loaded = _tf_load(parsing_export)
    inputs = {name: loaded.signatures[name].structured_input_signature[1] for name in loaded.signatures}
    assert {name: sorted(i) for name, i in inputs.items()} == {
        "serving_default": ["examples"], "classify": ["inputs"], "regress": ["inputs"]}
    assert all(spec.dtype == tf.string and spec.shape.as_list() == [None]
               for i in inputs.values() for spec in i.values())
    expected = _predict_parsed(parsing_est, EXAMPLES)
    np.testing.assert_array_equal(expected["ids"][7:10], [[0, 1, 2], [-1, -1, -1], [5, -1, -1]])
    assert expected["w"][9] == 1.5 and expected["m"][9].tolist() == [True, False]
    ours = te.load_exported(parsing_export).signatures
    for name, key in (("serving_default", "examples"), ("classify", "inputs"), ("regress", "inputs")):
        for batch in (EXAMPLES, EXAMPLES[7:]):  # any batch size
            got = _call(loaded.signatures[name], **{key: np.array(batch, object)})
            want = _as_in_saved_model(name, ours[name](examples=batch))
            assert sorted(got) == sorted(want)
            for k in want:
                assert got[k].dtype == want[k].dtype, k
                if want[k].dtype == object:
                    np.testing.assert_array_equal(got[k], want[k])
                else:
                    np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)
    got = _call(loaded.signatures["serving_default"], examples=np.array(EXAMPLES, object))
    np.testing.assert_allclose(got["logits"], expected["logits"], rtol=1e-5, atol=1e-5)
    for k in ("w", "m", "ids"):
        np.testing.assert_array_equal(got[k], expected[k])


@needs_compatible_tf
def test_parsing_classify_signature_passes_tf_servings_classify_checks(parsing_export):
    """What TF Serving's classifier.cc checks before answering :classify, on this SignatureDef and its run."""
    from tensorflow.python.tools import saved_model_utils  # (saved_model_cli's reader)

    for tags in ("serve", "serve,tpu"):
        sig = saved_model_utils.get_meta_graph_def(parsing_export, tags).signature_def["classify"]
        assert sig.method_name == "tensorflow/serving/classify"
        assert list(sig.inputs) == ["inputs"] and sig.inputs["inputs"].dtype == tf.string.as_datatype_enum
        assert sorted(sig.outputs) == ["classes", "scores"]
        assert sig.outputs["classes"].dtype == tf.string.as_datatype_enum
        assert sig.outputs["scores"].dtype == tf.float32.as_datatype_enum
        for name in ("classes", "scores"):
            assert [d.size for d in sig.outputs[name].tensor_shape.dim] == [-1, 3], name
    out = _tf_load(parsing_export).signatures["classify"](inputs=tf.constant(EXAMPLES))
    assert out["classes"].shape == out["scores"].shape == (len(EXAMPLES), 3)
    assert out["classes"].numpy().tolist() == [[b"0", b"1", b"2"]] * len(EXAMPLES)


@needs_compatible_tf
@pytest.mark.parametrize("example, match", [
    (tf_example(0, ids=[1, 2, 3, 4]), r"VarLenFeature `ids` holds at most max_length=3 values"),  # never truncated
    (tf_example(0, ids=[2**40]), r"Values of `ids` \(dtype int32\) lie in \[-2147483648, 2147483647\]"),
    (tf_example(0, x=False), r"Feature: x \(data type: float\) is required"),
], ids=["longer than max_length", "out of int32", "missing required"])
def test_parsing_saved_model_rejects_what_the_host_parser_rejects(parsing_export, example, match):
    with pytest.raises(ValueError):
        te.load_exported(parsing_export).signatures["serving_default"](examples=[EXAMPLES[0], example])
    sig = _tf_load(parsing_export).signatures["classify"]
    with pytest.raises(tf.errors.InvalidArgumentError, match=match):
        _call(sig, inputs=np.array([EXAMPLES[0], example], object))


@needs_compatible_tf
def test_saved_model_cli_shows_a_string_input_for_a_parsing_export(parsing_export):
    cli = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
    proc = subprocess.run([cli, "show", "--all", "--dir", parsing_export], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for tags in ("serve", "serve, tpu"):
        graph = proc.stdout.split(f"MetaGraphDef with tag-set: '{tags}' contains the following SignatureDefs")[1]
        graph = graph.split("MetaGraphDef with tag-set:")[0]
        for sig, key in (("serving_default", "examples"), ("classify", "inputs"), ("regress", "inputs")):
            block = graph.split(f"signature_def['{sig}']:")[1].split("signature_def[")[0]
            inputs = block.split("The given SavedModel SignatureDef contains the following output(s):")[0]
            assert inputs.count("tensor_info:") == 1, inputs
            assert f"inputs['{key}'] tensor_info:\n        dtype: DT_STRING\n        shape: (-1)" in inputs


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # 70000.0 as float16: inf
@pytest.mark.parametrize("x64", [False, True])
def test_graph_parsing_equals_the_host_parser(x64):
    """tf_example_parsing.parse against ExampleSpec.parse, dtype by dtype (no jax2tf: runs on every TF)."""
    from tpu_estimator.export import tf_example_parsing

    big = 2**40 if x64 else 2**30  # int64 is int32 unless x64
    with jax.enable_x64(x64):
        spec = ExampleSpec({
            "f16": te.FixedLenFeature([2], np.float16, default_value=[0.1, 2.0]),
            "bf16": te.VarLenFeature(jnp.bfloat16, max_length=3, default_value=0.5),
            "f64": te.FixedLenFeature([], np.float64, default_value=0.1),  # float32 unless x64: exact only then
            "u8": te.VarLenFeature(np.uint8, max_length=2, default_value=255),
            "i64": te.FixedLenFeature([2, 1], np.int64, default_value=[[-big], [3]]),
            "b": te.VarLenFeature(np.bool_, max_length=2, default_value=True),
            # defaults above int64's range (uint32 without x64): int64 would wrap them, in the graph only
            "u64": te.FixedLenFeature([], np.uint64, default_value=2**63 + 1 if x64 else 2**32 - 1),
            "u64v": te.VarLenFeature(np.uint64, max_length=2, default_value=2**64 - 1 if x64 else 2**32 - 1),
        })
    rows = [
        {"f16": [1 / 3, 70000.0], "bf16": [1 / 3], "f64": [1 / 3], "u8": [0, 200], "i64": [big, -1], "b": [0],
         "u64": [7], "u64v": [3]},
        {"bf16": [], "u8": [], "b": [1, 0]},  # defaults, padding
        {},
    ]
    serialized = []
    for row in rows:
        ex = tf.train.Example()
        for name, values in row.items():
            kind = "float_list" if name in ("f16", "bf16", "f64") else "int64_list"
            getattr(ex.features.feature[name], kind).value.extend(values)
        serialized.append(ex.SerializeToString())
    want = spec.parse(serialized)
    got = tf.function(lambda s: tf_example_parsing.parse(s, spec), autograph=False)(tf.constant(serialized))
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name].dtype.as_numpy_dtype == want[name].dtype, name
        assert got[name].numpy().tobytes() == want[name].tobytes(), (name, got[name].numpy(), want[name])
    bad = tf.train.Example()
    bad.features.feature["u8"].int64_list.value.extend([256])
    with pytest.raises(ValueError, match=r"lie in \[0, 255\]"):
        spec.parse([bad.SerializeToString()])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"Values of `u8` \(dtype uint8\) lie in \[0, 255\]"):
        tf_example_parsing.parse(tf.constant([bad.SerializeToString()]), spec)
    two = tf.train.Example()  # f64 takes one value (parsed as a RaggedFeature under x64: its default is inexact)
    two.features.feature["f64"].float_list.value.extend([1.0, 2.0])
    with pytest.raises(ValueError, match=r"shape \[\]: 1 values per example"):
        spec.parse([two.SerializeToString()])
    ours = r"The feature `f64` has shape \[\]: 1 values per example"  # (TF's own message without x64)
    with pytest.raises(tf.errors.InvalidArgumentError, match=ours if x64 else "Number of float values != expected"):
        tf_example_parsing.parse(tf.constant([two.SerializeToString()]), spec)
