"""gRPC requests to a signature's input arrays, and its outputs to gRPC results.

`PredictRequest.inputs` (TensorProtos) become the signature's inputs (a
parsing signature takes its serialized tf.Examples as a DT_STRING tensor);
`Classify`/`Regress`/`MultiInference`'s `Input` (an ExampleList, or one with
a context merged into each example) maps each tf.Example's features to the
inputs by name, as REST's `:classify`/`:regress` do. Every client mistake is
a `rest.BadRequest` (answered INVALID_ARGUMENT).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tpu_estimator.export.loader import Signature
from tpu_estimator.serving import rest
from tpu_estimator.serving.tensor_proto import to_array


def predict_inputs(sig: Signature, inputs: Any) -> dict[str, np.ndarray]:
    """A PredictRequest's `inputs` map -> the checked input arrays of `sig`."""
    try:
        arrays = {name: to_array(t, name) for name, t in inputs.items()}
    except ValueError as e:
        raise rest.BadRequest(str(e)) from e
    if sig.examples_input is not None and set(arrays) == {sig.examples_input} != set(sig.inputs):
        try:
            return sig.parse_examples(list(arrays[sig.examples_input].reshape(-1)))
        except ValueError as e:
            raise rest.BadRequest(str(e)) from e
    return rest.check(sig, arrays)


def example_inputs(sig: Signature, request_input: Any) -> dict[str, np.ndarray]:
    """An `Input` (tf.Examples, with or without context) -> the checked input arrays of `sig`."""
    kind = request_input.WhichOneof("kind")
    if kind is None:
        raise rest.BadRequest("The request's input must hold examples: set input.example_list or "
                              "input.example_list_with_context.")
    if kind == "example_list":
        examples, context = list(request_input.example_list.examples), None
    else:
        examples = list(request_input.example_list_with_context.examples)
        context = request_input.example_list_with_context.context
    if not examples:
        raise rest.BadRequest(f"input.{kind} holds no examples; send at least one tf.Example.")
    merged = [_merge(e, context, i) for i, e in enumerate(examples)]
    if sig.example_spec is not None:  # parsing signature: the exported feature spec parses them
        try:
            return sig.parse_examples([e.SerializeToString() for e in merged])
        except ValueError as e:
            raise rest.BadRequest(str(e)) from e
    return rest.check(sig, _columns(sig, merged))


def _merge(example: Any, context: Any, i: int) -> Any:
    if context is None or not context.features.feature:
        return example
    both = sorted(set(context.features.feature) & set(example.features.feature))
    if both:
        raise rest.BadRequest(f"Features in the context must not appear in the examples. Received: {both} "
                              f"in the context and in examples[{i}]. Send each feature in one place.")
    merged = type(example)()
    merged.CopyFrom(context)
    merged.MergeFrom(example)
    return merged


def _columns(sig: Signature, examples: list[Any]) -> dict[str, list[Any]]:
    """Raw-input signature: each example's features, by input name, shaped as one row."""
    names = sorted(sig.inputs)
    columns: dict[str, list[Any]] = {n: [] for n in names}
    for i, example in enumerate(examples):
        features = example.features.feature
        if sorted(features) != names:
            raise rest.BadRequest(f"examples[{i}] has the features {sorted(features)}; signature "
                                  f"{sig.name!r} takes the inputs {names}.")
        for n in names:
            kind = features[n].WhichOneof("kind")
            values = list(getattr(features[n], kind).value) if kind else []
            row_shape = sig.inputs[n]["shape"][1:]
            if None in row_shape:
                raise rest.BadRequest(f"Input {n!r} has the per-example shape {row_shape}; tf.Examples "
                                      "only fill fixed shapes. Use Predict for this signature.")
            if len(values) != int(np.prod(row_shape, dtype=np.int64)):
                raise rest.BadRequest(f"examples[{i}][{n!r}] has {len(values)} values; input {n!r} takes "
                                      f"{int(np.prod(row_shape, dtype=np.int64))} per example (shape {row_shape}).")
            columns[n].append(np.asarray(values).reshape(row_shape).tolist())
    return columns


def classification_result(outputs: dict[str, np.ndarray], result: Any) -> None:
    """Fills a ClassificationResult from a classify signature's outputs (labels from `classes`)."""
    for row in rest.format_classify(outputs)["results"]:
        classes = result.classifications.add().classes
        for label, score in row:
            c = classes.add(label=label)
            if score is not None:
                c.score = score


def regression_result(outputs: dict[str, np.ndarray], result: Any) -> None:
    """Fills a RegressionResult from a regress signature's `outputs`."""
    if "outputs" not in outputs:
        raise rest.BadRequest(f"A regress signature must output 'outputs'. Received: {sorted(outputs)}.")
    for value in rest.format_regress(outputs)["results"]:
        result.regressions.add(value=value)
