"""TensorSpec, ServingInputReceiver and build_raw_serving_input_receiver_fn."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tpu_estimator import ServingInputReceiver, TensorSpec, build_raw_serving_input_receiver_fn

IMAGE = TensorSpec((None, 28, 28), "uint8")


# --- TensorSpec ---


def test_tensor_spec_normalises():
    spec = TensorSpec([None, np.int64(3)], jnp.float32, name="x")
    assert spec.shape == (None, 3) and type(spec.shape[1]) is int
    assert spec.dtype == np.dtype("float32") and spec.name == "x" and spec.ndim == 2
    assert TensorSpec((), jnp.bfloat16).dtype == jnp.bfloat16
    assert TensorSpec((2,), bool).dtype == np.bool_
    assert hash(TensorSpec((1,), "int32")) == hash(TensorSpec((1,), np.int32))


def test_tensor_spec_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        IMAGE.shape = (1,)


@pytest.mark.parametrize(
    "shape, error, pattern",
    [
        ((3, None), ValueError, "only dim 0 \\(the batch\\) may be None"),
        ((-1, 3), ValueError, "dims must be ints >= 0"),
        ((2.0,), ValueError, "dims must be ints >= 0"),
        ((True,), ValueError, "dims must be ints >= 0"),
        ("28x28", TypeError, "`shape` must be a tuple"),
        (None, TypeError, "`shape` must be a tuple"),
        (5, TypeError, "`shape` must be a tuple"),
    ],
)
def test_tensor_spec_bad_shape(shape, error, pattern):
    with pytest.raises(error, match=pattern):
        TensorSpec(shape, "float32")


@pytest.mark.parametrize("dtype", ["string", object, str, "U5", "not-a-dtype", None])
def test_tensor_spec_bad_dtype(dtype):
    if dtype is None:  # np.dtype(None) is float64: accepted, as numpy does
        assert TensorSpec((1,), dtype).dtype == np.float64
        return
    with pytest.raises(TypeError, match="dtype"):
        TensorSpec((1,), dtype)


def test_tensor_spec_bad_name():
    with pytest.raises(TypeError, match="`name` must be a str"):
        TensorSpec((1,), "int32", name=3)


def test_with_batch_size():
    assert IMAGE.with_batch_size(8).shape == (8, 28, 28)
    assert IMAGE.with_batch_size(8).with_batch_size(None).shape == (None, 28, 28)
    with pytest.raises(ValueError, match="no batch dimension"):
        TensorSpec((), "int32").with_batch_size(2)
    with pytest.raises(ValueError, match="batch_size"):
        IMAGE.with_batch_size(0)


# --- ServingInputReceiver ---


def test_receiver_bare_spec_is_named_input():
    r = ServingInputReceiver(IMAGE, IMAGE)
    assert r.receiver_tensors == {"input": IMAGE}
    assert r.receiver_tensors_alternatives == {}
    x = jnp.zeros((2, 28, 28), jnp.uint8)
    assert r.make_features({"input": x}) is x


def test_receiver_dict_features_must_be_receiver_tensors():
    specs = {"image": IMAGE, "id": TensorSpec((None,), "int32")}
    r = ServingInputReceiver({"image": IMAGE}, specs)
    got = r.make_features({"image": 1, "id": 2})
    assert got == {"image": 1}
    with pytest.raises(
        ValueError, match="feature 'label' needs a receiver tensor of the same name"
    ):
        ServingInputReceiver({"label": IMAGE}, specs)
    with pytest.raises(ValueError, match="same name, shape and dtype.*pass a callable"):
        ServingInputReceiver({"image": TensorSpec((None, 28, 28), "float32")}, specs)


def test_receiver_bare_feature_needs_single_matching_receiver():
    with pytest.raises(ValueError, match="must be the only receiver tensor"):
        ServingInputReceiver(IMAGE, {"a": IMAGE, "b": IMAGE})
    with pytest.raises(ValueError, match="must be the only receiver tensor"):
        ServingInputReceiver(IMAGE, TensorSpec((None, 4), "uint8"))


def test_receiver_callable_features_traced():
    r = ServingInputReceiver(lambda d: {"image": d["image"] / 255.0}, {"image": IMAGE})
    shapes = jax.eval_shape(
        r.make_features, {"image": jax.ShapeDtypeStruct((3, 28, 28), jnp.uint8)}
    )
    assert shapes["image"].shape == (3, 28, 28) and shapes["image"].dtype == jnp.float32


def test_receiver_callable_must_take_one_argument():
    with pytest.raises(TypeError, match="must take one argument"):
        ServingInputReceiver(lambda: {}, IMAGE)
    with pytest.raises(TypeError, match="must take one argument"):
        ServingInputReceiver(lambda a, b: {}, IMAGE)
    ServingInputReceiver(lambda *args: {}, IMAGE)
    ServingInputReceiver(dict, IMAGE)  # a builtin without a clear signature is trusted


@pytest.mark.parametrize(
    "features, receivers, error, pattern",
    [
        (3, IMAGE, TypeError, "`features` must be a TensorSpec"),
        (IMAGE, {}, TypeError, "`receiver_tensors` must be a TensorSpec or a non-empty dict"),
        (IMAGE, [IMAGE], TypeError, "`receiver_tensors` must be"),
        (IMAGE, {"x": np.zeros(3)}, TypeError, r"receiver_tensors\['x'\]"),
        (IMAGE, {1: IMAGE}, TypeError, "keys of `receiver_tensors` must be strings"),
        ({"x": (None, 3)}, {"x": IMAGE}, TypeError, r"features\['x'\]"),
    ],
)
def test_receiver_invalid(features, receivers, error, pattern):
    with pytest.raises(error, match=pattern):
        ServingInputReceiver(features, receivers)


def test_receiver_alternatives():
    raw = TensorSpec((None, 784), "uint8")
    r = ServingInputReceiver(lambda d: d, {"image": IMAGE}, {"flat": raw, "named": {"x": raw}})
    assert r.receiver_tensors_alternatives == {"flat": {"input": raw}, "named": {"x": raw}}
    with pytest.raises(TypeError, match="receiver_tensors_alternatives"):
        ServingInputReceiver(lambda d: d, IMAGE, [raw])
    with pytest.raises(TypeError, match=r"receiver_tensors_alternatives\['a'\]"):
        ServingInputReceiver(lambda d: d, IMAGE, {"a": 3})
    # spec features must be makeable from every alternative too
    with pytest.raises(ValueError, match=r"receiver_tensors_alternatives\['flat'\]"):
        ServingInputReceiver({"image": IMAGE}, {"image": IMAGE}, {"flat": {"x": raw}})


def test_make_features_missing_input():
    r = ServingInputReceiver({"image": IMAGE}, {"image": IMAGE})
    with pytest.raises(ValueError, match="missing=\\['image'\\]"):
        r.make_features({"other": 1})
    with pytest.raises(ValueError, match="exactly one received array"):
        ServingInputReceiver(IMAGE, IMAGE).make_features({})


# --- build_raw_serving_input_receiver_fn ---


def test_build_raw_from_arrays_and_specs():
    fn = build_raw_serving_input_receiver_fn(
        {
            "x": np.zeros((8, 4), np.float32),
            "ids": TensorSpec((None, 3), "int32"),
            "y": jnp.ones((2,)),
        }
    )
    r = fn()
    assert isinstance(r, ServingInputReceiver)
    assert r.receiver_tensors["x"] == TensorSpec((None, 4), "float32", "x")
    assert r.receiver_tensors["ids"].shape == (None, 3)
    assert r.receiver_tensors["y"].shape == (None,)
    assert r.features == r.receiver_tensors
    assert fn() is not r  # a fresh receiver each call


def test_build_raw_default_batch_size():
    r = build_raw_serving_input_receiver_fn({"x": TensorSpec((None, 4), "float32")}, 16)()
    assert r.receiver_tensors["x"].shape == (16, 4)


@pytest.mark.parametrize(
    "specs, batch, error, pattern",
    [
        ({}, None, TypeError, "non-empty dict"),
        ([np.zeros(3)], None, TypeError, "`feature_specs` must be"),
        ({"x": [1.0, 2.0]}, None, TypeError, "TensorSpecs or example arrays"),
        ({"x": np.float32(1)}, None, ValueError, "rank >= 1"),
        ({"x": TensorSpec((), "int32")}, None, ValueError, "rank >= 1"),
        ({1: np.zeros(3)}, None, TypeError, "keys of `feature_specs`"),
        ({"x": np.zeros(3)}, 0, ValueError, "default_batch_size"),
        ({"x": np.zeros(3)}, "8", TypeError, "default_batch_size"),
        ({"s": np.array(["a", "b"])}, None, TypeError, "no string"),
    ],
)
def test_build_raw_invalid(specs, batch, error, pattern):
    with pytest.raises(error, match=pattern):
        build_raw_serving_input_receiver_fn(specs, batch)
