"""TensorFlow Serving's REST formats: request bodies to arrays, outputs to JSON.

Row format `{"instances": [...]}` (one entry per example: a value when the
signature has one input, else a dict of input name to value) answers
`{"predictions": [...]}`; columnar `{"inputs": ...}` answers `{"outputs": ...}`.
`:classify` and `:regress` take `{"examples": [{name: value}], "context": {...}}`
and answer `{"results": ...}`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tpu_estimator.export.loader import Signature

_TF_DTYPES = {
    "float32": "DT_FLOAT", "float64": "DT_DOUBLE", "float16": "DT_HALF", "bfloat16": "DT_BFLOAT16",
    "int8": "DT_INT8", "int16": "DT_INT16", "int32": "DT_INT32", "int64": "DT_INT64",
    "uint8": "DT_UINT8", "uint16": "DT_UINT16", "uint32": "DT_UINT32", "uint64": "DT_UINT64",
    "bool": "DT_BOOL", "complex64": "DT_COMPLEX64",
}


class BadRequest(ValueError):
    """A client error: answered with status 400 (or `status`) and `{"error": message}`."""

    def __init__(self, text: str, status: int = 400) -> None:
        super().__init__(text)
        self.status = status


def _rows(sig: Signature, entries: Any, what: str) -> dict[str, Any]:
    """A list of per-example entries -> {input name: list of values}."""
    if not isinstance(entries, list) or not entries:
        raise BadRequest(f"'{what}' must be a non-empty JSON list.")
    names = list(sig.inputs)
    batched = [n for n in names if sig.inputs[n]["shape"][:1] == [None]]
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


def parse_examples(sig: Signature, body: Any) -> dict[str, np.ndarray]:
    """Checked input arrays of a `:classify`/`:regress` body (context merged into each example)."""
    context = body.get("context", {})
    examples = body.get("examples")
    if not isinstance(context, dict):
        raise BadRequest("'context' must be a JSON object.")
    if not isinstance(examples, list) or not examples:
        raise BadRequest("The request must contain 'examples': a non-empty JSON list of objects.")
    if not all(isinstance(e, dict) for e in examples):
        raise BadRequest("Each of 'examples' must be a JSON object of input name to value.")
    return check(sig, _rows(sig, [{**context, **e} for e in examples], "examples"))


def check(sig: Signature, columns: dict[str, Any]) -> dict[str, np.ndarray]:
    for name, value in columns.items():
        if _has_b64(value):
            raise BadRequest(f"Input {name!r}: binary ('b64') values are not supported; "
                             "exported models take numeric arrays.")
    try:
        return sig.check_inputs(columns)
    except ValueError as e:
        raise BadRequest(str(e)) from e


def _has_b64(value: Any) -> bool:
    if isinstance(value, dict):
        return True
    return isinstance(value, list) and bool(value) and _has_b64(value[0])


def num_rows(sig: Signature, arrays: dict[str, np.ndarray]) -> int | None:
    sizes = {a.shape[0] for n, a in arrays.items() if sig.inputs[n]["shape"][:1] == [None]}
    return sizes.pop() if len(sizes) == 1 else None


def format_predict(outputs: dict[str, np.ndarray], rows: bool) -> dict[str, Any]:
    if rows:
        names = list(outputs)
        n = len(outputs[names[0]])
        if len(names) == 1:
            return {"predictions": outputs[names[0]].tolist()}
        return {"predictions": [{k: outputs[k][i].tolist() for k in names} for i in range(n)]}
    if len(outputs) == 1:
        return {"outputs": next(iter(outputs.values())).tolist()}
    return {"outputs": {k: v.tolist() for k, v in outputs.items()}}


def format_classify(outputs: dict[str, np.ndarray]) -> dict[str, Any]:
    """[[label, score], ...] per example; labels from `classes` (else the class index)."""
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
            [str(c[j].item()) if c is not None else str(j), float(s[j]) if s is not None else None]
            for j in range(k)
        ])
    return {"results": results}


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

    return {"inputs": tensors(sig.inputs), "outputs": tensors(sig.outputs), "method_name": sig.method_name}
