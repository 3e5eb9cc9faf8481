"""Export outputs: normalisation, validation, immutability, pytrees, tracers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tpu_estimator import (
    DEFAULT_SERVING_SIGNATURE_DEF_KEY,
    ClassificationOutput,
    ExportOutput,
    PredictOutput,
    RegressionOutput,
)

F32 = np.zeros((4, 3), np.float32)
I32 = np.zeros((4, 3), np.int32)


def test_default_key():
    assert DEFAULT_SERVING_SIGNATURE_DEF_KEY == "serving_default"


def test_predict_output_bare_array_and_dict():
    out = PredictOutput(F32)
    assert out.outputs.keys() == {"output"} and out.outputs["output"] is F32
    out = PredictOutput({"a": F32, "b": jnp.ones(4, jnp.int32)})
    assert sorted(out.outputs) == ["a", "b"]
    assert out.method_name == "tensorflow/serving/predict"
    assert isinstance(out, ExportOutput)


def test_predict_output_copies_its_dict():
    d = {"a": F32}
    out = PredictOutput(d)
    d["b"] = F32
    out.outputs["c"] = F32
    assert list(out.outputs) == ["a"]


@pytest.mark.parametrize(
    "outputs, error, pattern",
    [
        ({}, ValueError, "at least one output"),
        ({1: F32}, TypeError, "keys of `outputs` must be strings"),
        ({"a": [1.0, 2.0]}, TypeError, r"outputs\['a'\]` must be an array"),
        (1.0, TypeError, "`outputs` must be an array or a dict"),
        (None, TypeError, "`outputs` must be an array or a dict"),
    ],
)
def test_predict_output_invalid(outputs, error, pattern):
    with pytest.raises(error, match=pattern):
        PredictOutput(outputs)


def test_classification_output():
    both = ClassificationOutput(scores=F32, classes=I32)
    assert both.outputs == {"scores": F32, "classes": I32}
    assert both.method_name == "tensorflow/serving/classify"
    assert ClassificationOutput(scores=F32).outputs.keys() == {"scores"}
    assert ClassificationOutput(classes=I32).outputs.keys() == {"classes"}
    # classes may be any array (JAX has no strings): floats, bools, ...
    ClassificationOutput(classes=np.zeros(3, bool))
    ClassificationOutput(scores=jnp.zeros((2, 2), jnp.bfloat16))


def test_classification_output_invalid():
    with pytest.raises(ValueError, match="needs `scores`, `classes` or both"):
        ClassificationOutput()
    with pytest.raises(TypeError, match=r"`scores` must be floating point.*int32.*astype"):
        ClassificationOutput(scores=I32)
    with pytest.raises(TypeError, match="`scores` must be an array"):
        ClassificationOutput(scores=[0.5])
    with pytest.raises(TypeError, match="`classes` must be an array"):
        ClassificationOutput(classes=["cat", "dog"])


def test_regression_output():
    out = RegressionOutput(np.zeros(4, np.float32))
    assert list(out.outputs) == ["outputs"]
    assert out.method_name == "tensorflow/serving/regress"
    with pytest.raises(TypeError, match="`value` must be floating point"):
        RegressionOutput(np.zeros(4, np.int64))
    with pytest.raises(TypeError, match="`value` must be an array"):
        RegressionOutput(1.5)


@pytest.mark.parametrize(
    "make",
    [lambda: PredictOutput(F32), lambda: ClassificationOutput(F32), lambda: RegressionOutput(F32)],
)
def test_immutable(make):
    out = make()
    with pytest.raises(AttributeError, match="immutable"):
        out.outputs = {}
    with pytest.raises(AttributeError, match="immutable"):
        out.anything = 1
    with pytest.raises(AttributeError):
        del out.outputs


def test_base_is_abstract():
    with pytest.raises(TypeError):
        ExportOutput()


def test_repr_shows_shapes_not_values():
    text = repr(PredictOutput({"p": np.arange(1000.0)}))
    assert "shape=(1000,)" in text and "999" not in text


def test_built_from_tracers_and_returned_from_jit():
    def head(x):
        logits = x @ jnp.ones((3, 5))
        return {
            "serving_default": ClassificationOutput(jax.nn.softmax(logits), logits.argmax(-1)),
            "regress": RegressionOutput(logits[:, 0]),
            "predict": PredictOutput({"logits": logits}),
        }

    outs = jax.jit(head)(jnp.ones((4, 3)))
    assert outs["serving_default"].outputs["classes"].shape == (4,)
    assert outs["regress"].outputs["outputs"].shape == (4,)
    shapes = jax.eval_shape(head, jax.ShapeDtypeStruct((2, 3), jnp.float32))
    assert shapes["predict"].outputs["logits"].shape == (2, 5)


def test_validation_errors_under_tracing():
    with pytest.raises(TypeError, match=r"scores.*shape=\(4, 3\), dtype=int32"):
        jax.eval_shape(
            lambda x: ClassificationOutput(scores=x), jax.ShapeDtypeStruct((4, 3), jnp.int32)
        )


def test_pytree_roundtrip():
    out = ClassificationOutput(classes=I32)
    leaves, treedef = jax.tree.flatten(out)
    assert len(leaves) == 1
    back = jax.tree.unflatten(treedef, leaves)
    assert type(back) is ClassificationOutput and back.scores is None and back.classes is I32
    doubled = jax.tree.map(lambda a: a + 1, PredictOutput({"a": F32}))
    assert float(doubled.outputs["a"].sum()) == F32.size
