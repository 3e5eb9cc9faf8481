"""TensorFlow's TensorProto <-> numpy arrays, as `tf.make_tensor_proto`/`tf.make_ndarray` do.

A request's tensor may carry its values in `tensor_content` (the raw
little-endian bytes) or in the typed field of its dtype (`float_val`,
`int_val`, `int64_val`, `half_val`, ...); a typed field with one value fills
the whole shape (TensorFlow's rule). Answers carry numbers in
`tensor_content` and strings in `string_val`.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from tpu_estimator.api.checks import message
from tpu_estimator.serving.tf_serving_proto import DATA_TYPES, TensorProto

_NUMPY = {
    "DT_FLOAT": np.float32, "DT_DOUBLE": np.float64, "DT_INT32": np.int32, "DT_UINT8": np.uint8,
    "DT_INT16": np.int16, "DT_INT8": np.int8, "DT_COMPLEX64": np.complex64, "DT_INT64": np.int64,
    "DT_BOOL": np.bool_, "DT_BFLOAT16": jnp.bfloat16, "DT_UINT16": np.uint16,
    "DT_COMPLEX128": np.complex128, "DT_HALF": np.float16, "DT_UINT32": np.uint32, "DT_UINT64": np.uint64,
}
_BY_NUMBER = {DATA_TYPES[k]: (k, np.dtype(v)) for k, v in _NUMPY.items()}
_BY_DTYPE = {np.dtype(v): DATA_TYPES[k] for k, v in _NUMPY.items()}
# The typed field that holds each dtype's values (TensorFlow's tensor.proto comments).
_FIELD = {
    "DT_FLOAT": "float_val", "DT_DOUBLE": "double_val", "DT_INT32": "int_val", "DT_UINT8": "int_val",
    "DT_INT16": "int_val", "DT_INT8": "int_val", "DT_UINT16": "int_val", "DT_INT64": "int64_val",
    "DT_BOOL": "bool_val", "DT_HALF": "half_val", "DT_BFLOAT16": "half_val", "DT_UINT32": "uint32_val",
    "DT_UINT64": "uint64_val", "DT_COMPLEX64": "scomplex_val", "DT_COMPLEX128": "dcomplex_val",
}


def to_array(proto: Any, name: str) -> np.ndarray:
    """A request's TensorProto -> numpy array; ValueError naming input `name` when malformed."""
    if proto.dtype == DATA_TYPES["DT_STRING"]:
        return _strings(proto, name)
    if proto.dtype not in _BY_NUMBER:
        raise ValueError(message(f"Input {name!r}: the tensor's dtype is not supported; send one of "
                                 f"{sorted(_NUMPY)} or DT_STRING.", f"dtype={proto.dtype}"))
    tf_name, dtype = _BY_NUMBER[proto.dtype]
    shape = _shape(proto, name)
    size = int(np.prod(shape, dtype=np.int64))
    if proto.tensor_content:
        if len(proto.tensor_content) != size * dtype.itemsize:
            raise ValueError(message(
                f"Input {name!r}: tensor_content must hold {size} {tf_name} values ({size * dtype.itemsize} "
                f"bytes) for the shape {shape}.", f"{len(proto.tensor_content)} bytes"))
        return np.frombuffer(proto.tensor_content, dtype).reshape(shape)
    values = getattr(proto, _FIELD[tf_name])
    if tf_name in ("DT_HALF", "DT_BFLOAT16"):  # 16-bit patterns in int32s
        flat = np.asarray(values, np.uint16).view(dtype)
    elif tf_name in ("DT_COMPLEX64", "DT_COMPLEX128"):  # (real, imaginary) pairs
        pairs = np.asarray(values, dtype.type(0).real.dtype)
        flat = pairs[0::2] + 1j * pairs[1::2] if len(pairs) % 2 == 0 else pairs
        flat = np.asarray(flat, dtype)
    else:
        flat = np.asarray(values, dtype)
    return _fill(flat, shape, size, name, _FIELD[tf_name])


def _strings(proto: Any, name: str) -> np.ndarray:
    shape = _shape(proto, name)
    flat = np.empty(len(proto.string_val), object)
    flat[:] = list(proto.string_val)
    return _fill(flat, shape, int(np.prod(shape, dtype=np.int64)), name, "string_val")


def _fill(flat: np.ndarray, shape: list[int], size: int, name: str, field: str) -> np.ndarray:
    if flat.size == size:
        return flat.reshape(shape)
    if flat.size == 1:  # TensorFlow: the one value fills the shape
        return np.full(shape, flat[0], flat.dtype)
    raise ValueError(message(f"Input {name!r}: {field} must hold {size} values (or one) for the shape {shape}.",
                             f"{flat.size} values"))


def _shape(proto: Any, name: str) -> list[int]:
    if proto.tensor_shape.unknown_rank:
        raise ValueError(message(f"Input {name!r}: the tensor needs a known shape.", "unknown_rank=true"))
    dims = [d.size for d in proto.tensor_shape.dim]
    if any(d < 0 for d in dims):
        raise ValueError(message(f"Input {name!r}: a tensor's dimensions must be >= 0.", f"shape={dims}"))
    return dims


def from_array(value: Any) -> Any:
    """A numpy array (an output) -> TensorProto: numbers in tensor_content, strings in string_val."""
    value = np.asarray(value)
    proto = TensorProto()
    for d in value.shape:
        proto.tensor_shape.dim.add(size=d)
    if value.dtype.kind in "SOU":
        proto.dtype = DATA_TYPES["DT_STRING"]
        proto.string_val.extend(v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in value.reshape(-1))
        return proto
    if value.dtype not in _BY_DTYPE:
        raise TypeError(f"An output of dtype {value.dtype} has no TensorFlow dtype.")
    proto.dtype = _BY_DTYPE[value.dtype]
    proto.tensor_content = np.ascontiguousarray(value, value.dtype.newbyteorder("<")).tobytes()
    return proto


def dtype_enum(name: str) -> int:
    """A dtype name of a manifest ('float32', 'string') -> TensorFlow's DataType number."""
    if name == "string":
        return DATA_TYPES["DT_STRING"]
    return _BY_DTYPE.get(np.dtype(jnp.bfloat16 if name == "bfloat16" else name), 0)
