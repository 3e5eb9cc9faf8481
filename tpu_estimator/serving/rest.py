"""TensorFlow Serving's REST formats: request bodies to arrays, outputs to JSON.

Row format `{"instances": [...]}` (one entry per example: a value when the
signature has one input, else a dict of input name to value) answers
`{"predictions": [...]}`; columnar `{"inputs": ...}` answers `{"outputs": ...}`.
`:classify` and `:regress` take `{"examples": [{name: value}], "context": {...}}`
and answer `{"results": ...}`.

Signatures exported with `build_parsing_serving_input_receiver_fn` take
serialized tf.Examples: `:predict` instances `{"b64": "<base64>"}` (TF
Serving's form for binary strings; plain JSON strings are taken as UTF-8
bytes), and `:classify`/`:regress` JSON examples, parsed with the exported
feature spec. String outputs (none of JAX's) would be written as TF Serving
does: `{"b64": ...}` when the output's name ends with `_bytes`, else text.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import numpy as np

from tpu_estimator.export.loader import Signature

_TF_DTYPES = {
    "float32": "DT_FLOAT", "float64": "DT_DOUBLE", "float16": "DT_HALF", "bfloat16": "DT_BFLOAT16",
    "int8": "DT_INT8", "int16": "DT_INT16", "int32": "DT_INT32", "int64": "DT_INT64",
    "uint8": "DT_UINT8", "uint16": "DT_UINT16", "uint32": "DT_UINT32", "uint64": "DT_UINT64",
    "bool": "DT_BOOL", "complex64": "DT_COMPLEX64", "string": "DT_STRING",
}


class BadRequest(ValueError):
    """A client error: answered with status 400 (or `status`) and `{"error": message}`."""

    def __init__(self, text: str, status: int = 400) -> None:
        super().__init__(text)
        self.status = status


def _rows(sig: Signature, entries: Any, what: str, inputs: dict[str, Any] | None = None) -> dict[str, Any]:
    """A list of per-example entries -> {input name: list of values} (of `inputs`, default sig's)."""
    if not isinstance(entries, list) or not entries:
        raise BadRequest(f"'{what}' must be a non-empty JSON list.")
    inputs = sig.inputs if inputs is None else inputs
    names = list(inputs)
    batched = [n for n in names if inputs[n]["shape"][:1] == [None]]
    if len(batched) != len(names):
        raise BadRequest(f"The row format ('{what}') needs every input to have a batch dimension; "
                         f"use the columnar format ('inputs') for signature {sig.name!r}.")
    columns: dict[str, list[Any]] = {n: [] for n in names}
    for i, entry in enumerate(entries):
        if isinstance(entry, dict) and not (len(names) == 1 and set(entry) == {"b64"}):
            if set(entry) != set(names):
                raise BadRequest(
                    f"{what}[{i}] has the inputs {sorted(entry)}; signature {sig.name!r} takes {sorted(names)}."
                )
            for n in names:
                columns[n].append(entry[n])
        elif len(names) == 1:
            columns[names[0]].append(entry)
        else:
            raise BadRequest(
                f"{what}[{i}] must be a JSON object with the inputs {sorted(names)} "
                f"(signature {sig.name!r} has several inputs)."
            )
    return columns


def parse_predict(sig: Signature, body: Any) -> tuple[dict[str, np.ndarray], bool]:
    """(checked input arrays, row format?) for a `:predict` body."""
    has_rows, has_cols = "instances" in body, "inputs" in body
    if has_rows == has_cols:
        raise BadRequest("The request must contain exactly one of 'instances' (row format) "
                         "or 'inputs' (columnar format).")
    if sig.examples_input is not None:
        return _parse_serialized(sig, body), has_rows
    if has_rows:
        return check(sig, _rows(sig, body["instances"], "instances")), True
    value = body["inputs"]
    if isinstance(value, dict) and set(value) != {"b64"}:
        columns = value  # {name: value}; check() names missing and unknown inputs
    elif len(sig.inputs) == 1:
        columns = {next(iter(sig.inputs)): value}
    else:
        raise BadRequest(f"'inputs' must be a JSON object with the inputs {sorted(sig.inputs)}.")
    return check(sig, columns), False


def _parse_serialized(sig: Signature, body: Any) -> dict[str, np.ndarray]:
    """`:predict` on a parsing signature: serialized tf.Examples (b64) -> the parsed input arrays."""
    name = sig.examples_input
    if "instances" in body:
        values = _rows(sig, body["instances"], "instances", sig.request_inputs)[name]
    else:
        value = body["inputs"]
        if isinstance(value, dict) and set(value) != {"b64"}:
            if set(value) != {name}:
                raise BadRequest(f"'inputs' has the inputs {sorted(value)}; signature {sig.name!r} "
                                 f"takes [{name!r}] (serialized tf.Examples).")
            value = value[name]
        if not isinstance(value, list) or not value:
            raise BadRequest(f"Input {name!r} must be a non-empty JSON list of serialized tf.Examples.")
        values = value
    serialized = [_binary(v, f"{name}[{i}]") for i, v in enumerate(values)]
    try:
        return sig.parse_examples(serialized)
    except ValueError as e:
        raise BadRequest(str(e)) from e


def _binary(value: Any, where: str) -> bytes:
    """TF Serving's string value: {"b64": base64} -> its bytes; a JSON string -> UTF-8 bytes."""
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, dict) and set(value) == {"b64"} and isinstance(value["b64"], str):
        try:
            return base64.b64decode(value["b64"], validate=True)
        except (binascii.Error, ValueError) as e:
            raise BadRequest(f"{where}: a 'b64' value must be valid base64. Received: {e}.") from e
    raise BadRequest(f'{where} must be a serialized tf.Example as {{"b64": "<base64>"}}. '
                     f"Received: {json_text(value)}.")


def json_text(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def parse_examples(sig: Signature, body: Any) -> dict[str, np.ndarray]:
    """Checked input arrays of a `:classify`/`:regress` body (context merged into each example).

    A feature both in `context` and in an example is an error (as TF Serving)."""
    context = body.get("context", {})
    examples = body.get("examples")
    if not isinstance(context, dict):
        raise BadRequest("'context' must be a JSON object.")
    if not isinstance(examples, list) or not examples:
        raise BadRequest("The request must contain 'examples': a non-empty JSON list of objects.")
    if not all(isinstance(e, dict) for e in examples):
        raise BadRequest("Each of 'examples' must be a JSON object of input name to value.")
    for i, e in enumerate(examples):
        both = sorted(set(context) & set(e))
        if both:
            raise BadRequest(f"Features in 'context' must not appear in the examples. Received: "
                             f"{both} in 'context' and in examples[{i}]. Send each feature in one place.")
    merged = [{**context, **e} for e in examples]
    if sig.example_spec is not None:
        try:
            return sig.check_inputs(sig.example_spec.parse_json(merged))
        except ValueError as e:
            raise BadRequest(str(e)) from e
    return check(sig, _rows(sig, merged, "examples"))


def check(sig: Signature, columns: dict[str, Any]) -> dict[str, np.ndarray]:
    for name, value in columns.items():
        if _has_b64(value):
            raise BadRequest(f"Input {name!r}: binary ('b64') values are not supported for numeric "
                             "inputs; only serialized tf.Examples (exports of "
                             "build_parsing_serving_input_receiver_fn) are binary.")
    try:
        return sig.check_inputs(columns)
    except ValueError as e:
        raise BadRequest(str(e)) from e


def _has_b64(value: Any) -> bool:
    while isinstance(value, list) and value:  # a loop: a body ~950 lists deep leaves no stack to recurse
        value = value[0]
    return isinstance(value, dict)


def num_rows(sig: Signature, arrays: dict[str, np.ndarray]) -> int | None:
    sizes = {a.shape[0] for n, a in arrays.items() if sig.inputs[n]["shape"][:1] == [None]}
    return sizes.pop() if len(sizes) == 1 else None


def _json(name: str, value: np.ndarray) -> Any:
    """An output as JSON: numbers as lists; strings (bytes) as TF Serving writes them."""
    value = np.asarray(value)
    if value.dtype.kind not in "SOU":
        return value.tolist()
    as_b64 = name.endswith("_bytes")

    def one(v: Any) -> Any:
        if isinstance(v, list):
            return [one(x) for x in v]
        data = v.encode("utf-8") if isinstance(v, str) else bytes(v)
        return {"b64": base64.b64encode(data).decode("ascii")} if as_b64 else data.decode("utf-8", "replace")

    return one(value.tolist())


def format_predict(outputs: dict[str, np.ndarray], rows: bool) -> dict[str, Any]:
    if rows:
        names = list(outputs)
        n = len(outputs[names[0]])
        if len(names) == 1:
            return {"predictions": _json(names[0], outputs[names[0]])}
        return {"predictions": [{k: _json(k, outputs[k][i]) for k in names} for i in range(n)]}
    if len(outputs) == 1:
        return {"outputs": _json(*next(iter(outputs.items())))}
    return {"outputs": {k: _json(k, v) for k, v in outputs.items()}}


def format_classify(outputs: dict[str, np.ndarray]) -> dict[str, Any]:
    """[[label, score], ...] per example; labels from `classes`, else "" (as TF Serving)."""
    scores, classes = outputs.get("scores"), outputs.get("classes")
    ref = scores if scores is not None else classes
    results = []
    for i in range(len(ref)):
        s = np.atleast_1d(scores[i]) if scores is not None else None
        c = np.atleast_1d(classes[i]) if classes is not None else None
        k = len(s) if s is not None else len(c)
        if c is not None and s is not None and len(c) != len(s):
            c = None  # e.g. classes = argmax: one id, but one score per class
        results.append([
            [_label(c[j]) if c is not None else "", float(s[j]) if s is not None else None]
            for j in range(k)
        ])
    return {"results": results}


def _label(value: Any) -> str:
    v = value.item() if isinstance(value, np.generic) else value
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def format_regress(outputs: dict[str, np.ndarray]) -> dict[str, Any]:
    values = outputs["outputs"]
    return {"results": [float(np.asarray(v).reshape(-1)[0]) for v in values]}


def signature_metadata(sig: Signature) -> dict[str, Any]:
    def tensors(specs: dict[str, Any]) -> dict[str, Any]:
        return {
            name: {
                "dtype": _TF_DTYPES.get(s["dtype"], s["dtype"]),
                "tensor_shape": {
                    "dim": [{"size": str(-1 if d is None else d), "name": ""} for d in s["shape"]],
                    "unknown_rank": False,
                },
                "name": name,
            }
            for name, s in specs.items()
        }

    return {"inputs": tensors(sig.request_inputs), "outputs": tensors(sig.outputs), "method_name": sig.method_name}
