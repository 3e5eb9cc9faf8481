"""One input element as bytes between hosts: a typed JSON header, then raw array buffers.

No pickle: a receiver builds arrays only of the dtypes and shapes the header
names (numbers, booleans, fixed-width bytes/str, and ml_dtypes' such as
bfloat16), over the received bytes without a copy. An element is `(features,
labels)` as `split_element` makes it: each part None, one array, or a dict of
name -> array.

    payload = u32 header length | header JSON | buffer 0 | buffer 1 | ...
    header  = {"tree": [features, labels], "leaves": [{"dtype": .., "shape": [..]}, ..]}
    part    = null | "array" | {"dict": [name, ..]}   (leaves in that order)
"""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np

from tpu_estimator.api.checks import message

_LENGTH = struct.Struct("!I")
_KINDS = "biufcSUV"  # raw-buffer dtypes (V: ml_dtypes' bfloat16, float8 ...)


def _dtype_name(arr: np.ndarray, where: str) -> str:
    dt = arr.dtype
    if dt.kind not in _KINDS or dt.hasobject or dt.fields is not None:
        raise TypeError(
            message(
                "BROADCAST/SLICED input sends arrays of numbers, booleans or fixed-width "
                "bytes/strings between hosts (as raw buffers, never pickled).",
                f"{where} of dtype {dt}",
                "Convert it, e.g. np.asarray(values, dtype=bytes) for strings, or use "
                "PER_HOST_V1/PER_HOST_V2 input.",
            )
        )
    return dt.str if np.dtype(dt.str) == dt else dt.name  # bfloat16's str is '<V2'


def _part(tree: Any, name: str, leaves: list[tuple[str, np.ndarray]]) -> Any:
    if tree is None:
        return None
    if isinstance(tree, dict):
        for k, v in tree.items():
            leaves.append((f"{name}[{k!r}]", np.asarray(v, order="C")))
        return {"dict": list(tree)}
    leaves.append((name, np.asarray(tree, order="C")))
    return "array"


def encode(element: tuple[Any, Any]) -> bytearray:
    """`element` (features, labels) as one payload: a copy taken now (an input_fn may
    refill its arrays in place while the frame waits to be sent)."""
    leaves: list[tuple[str, np.ndarray]] = []
    tree = [_part(element[0], "features", leaves), _part(element[1], "labels", leaves)]
    specs = [{"dtype": _dtype_name(a, where), "shape": list(a.shape)} for where, a in leaves]
    header = json.dumps({"tree": tree, "leaves": specs}).encode()
    start = _LENGTH.size + len(header)
    payload = bytearray(start + sum(a.nbytes for _, a in leaves))
    _LENGTH.pack_into(payload, 0, len(header))
    payload[_LENGTH.size : start] = header
    for _, a in leaves:
        np.frombuffer(payload, np.uint8, a.nbytes, start)[:] = a.reshape(-1).view(np.uint8)
        start += a.nbytes
    return payload


def decode(payload: bytearray) -> tuple[Any, Any]:
    """The element `encode` made; its arrays share `payload`'s memory."""
    (size,) = _LENGTH.unpack_from(payload)
    header = json.loads(bytes(payload[_LENGTH.size : _LENGTH.size + size]))
    offset = _LENGTH.size + size
    arrays = []
    for spec in header["leaves"]:
        dtype = np.dtype(spec["dtype"])
        if dtype.kind not in _KINDS or dtype.hasobject:
            raise ValueError(f"Broadcast input: a header names dtype {dtype}, which is never sent.")
        count = int(np.prod(spec["shape"], dtype=np.int64))
        arr = np.frombuffer(payload, dtype, count, offset).reshape(spec["shape"])
        offset += arr.nbytes
        arrays.append(arr)
    if offset != len(payload):
        raise ValueError(f"Broadcast input: a frame of {len(payload)} bytes whose header describes {offset}.")
    it = iter(arrays)

    def build(part: Any) -> Any:
        if part is None:
            return None
        if part == "array":
            return next(it)
        return {k: next(it) for k in part["dict"]}

    features, labels = (build(p) for p in header["tree"])
    return features, labels
