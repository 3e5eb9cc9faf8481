"""TF Serving's gRPC API over a `ModelStore`: `tensorflow.serving.PredictionService` and `ModelService`.

`Predict`, `Classify`, `Regress`, `MultiInference`, `GetModelMetadata` and
`GetModelStatus`, served with grpc's generic handlers on the messages of
`tf_serving_proto` (no TensorFlow, no generated code). Requests go through
the same batching queue, versions and checks as the REST API; errors carry
TF Serving's status codes: a client's mistake INVALID_ARGUMENT, an unknown
model or version NOT_FOUND, a full queue RESOURCE_EXHAUSTED, a version being
swapped UNAVAILABLE.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

import grpc
import numpy as np

from tpu_estimator.api.export_output import DEFAULT_SERVING_SIGNATURE_DEF_KEY as DEFAULT_SIGNATURE
from tpu_estimator.serving import grpc_inputs, rest
from tpu_estimator.serving import tf_serving_proto as pb
from tpu_estimator.serving.batcher import ModelRetired, QueueFull, run_padded
from tpu_estimator.serving.metrics import ServingMetrics
from tpu_estimator.serving.model_store import LoadedVersion, ModelStore, batchable
from tpu_estimator.serving.tensor_proto import dtype_enum, from_array

log = logging.getLogger("tpu_estimator.serving")

CLASSIFY = "tensorflow/serving/classify"
REGRESS = "tensorflow/serving/regress"
_CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 404: grpc.StatusCode.NOT_FOUND,
          413: grpc.StatusCode.RESOURCE_EXHAUSTED, 503: grpc.StatusCode.UNAVAILABLE}


class PredictionService:
    """The handlers of both services for one model name (`handlers()` registers them)."""

    def __init__(self, store: ModelStore, model_name: str, metrics: ServingMetrics | None = None) -> None:
        self.store = store
        self.model_name = model_name
        self.metrics = metrics

    def handlers(self) -> list[grpc.GenericRpcHandler]:
        def unary(fn: Callable[[Any], Any], request_cls: Any, api: str) -> grpc.RpcMethodHandler:
            return grpc.unary_unary_rpc_method_handler(
                self._guarded(fn, api), request_deserializer=request_cls.FromString,
                response_serializer=lambda m: m.SerializeToString())

        prediction = {
            "Predict": unary(self.predict, pb.PredictRequest, "predict"),
            "Classify": unary(self.classify, pb.ClassificationRequest, "classify"),
            "Regress": unary(self.regress, pb.RegressionRequest, "regress"),
            "MultiInference": unary(self.multi_inference, pb.MultiInferenceRequest, "multi_inference"),
            "GetModelMetadata": unary(self.get_model_metadata, pb.GetModelMetadataRequest, "get_model_metadata"),
        }
        model = {"GetModelStatus": unary(self.get_model_status, pb.GetModelStatusRequest, "get_model_status")}
        return [grpc.method_handlers_generic_handler("tensorflow.serving.PredictionService", prediction),
                grpc.method_handlers_generic_handler("tensorflow.serving.ModelService", model)]

    def _guarded(self, fn: Callable[[Any], Any], api: str) -> Callable[[Any, grpc.ServicerContext], Any]:
        def handle(request: Any, context: grpc.ServicerContext) -> Any:
            start, code, text = time.perf_counter(), grpc.StatusCode.OK, ""
            try:
                return fn(request)
            except rest.BadRequest as e:
                code, text = _CODES.get(e.status, grpc.StatusCode.INVALID_ARGUMENT), str(e)
            except QueueFull as e:
                code, text = grpc.StatusCode.RESOURCE_EXHAUSTED, str(e)
            except Exception as e:  # a server bug: report it, keep serving
                log.exception("gRPC %s failed.", api)
                code, text = grpc.StatusCode.INTERNAL, f"Internal error: {type(e).__name__}: {e}"
            finally:
                if self.metrics is not None:
                    # the served name: a client's names would make the label set unbounded
                    self.metrics.request(self.model_name, api, "GRPC", code.name, time.perf_counter() - start)
            context.abort(code, text)

        return handle

    # --- the model, its version and signature ---------------------------------

    def _version(self, spec: Any) -> int | None:
        if spec.name != self.model_name:
            raise rest.BadRequest(f"Servable not found for request: Latest({spec.name}); this server "
                                  f"serves the model {self.model_name!r} (model_spec.name).", 404)
        choice = spec.WhichOneof("version_choice")
        if choice == "version_label":
            raise rest.BadRequest(f"Version labels are not supported (model_spec.version_label="
                                  f"{spec.version_label!r}); set model_spec.version, or neither for the newest.")
        return spec.version.value if choice == "version" else None

    def _loaded(self, spec: Any) -> LoadedVersion:
        version = self._version(spec)
        loaded = self.store.get(version)
        if loaded is None:
            which = f"Latest({spec.name})" if version is None else f"Specific({spec.name}, {version})"
            raise rest.BadRequest(f"Servable not found for request: {which}", 404)
        return loaded

    def _signature(self, loaded: LoadedVersion, spec: Any, method: str | None = None) -> str:
        name = spec.signature_name or DEFAULT_SIGNATURE
        signatures = loaded.model.signatures
        if name not in signatures:
            raise rest.BadRequest(f'Serving signature name: "{name}" not found in signature def; '
                                  f"the signatures are {sorted(signatures)} (model_spec.signature_name).")
        if method is not None and signatures[name].method_name != method:
            raise rest.BadRequest(f"Expected {method.rsplit('/', 1)[1]} signature method_name to be {method}. "
                                  f"Was: {signatures[name].method_name} (signature {name!r}).")
        return name

    def _run(self, spec: Any, method: str | None, inputs: Callable[[Any], dict[str, np.ndarray]]) -> tuple[Any, str, dict]:
        """(loaded version, signature name, outputs); a version replaced meanwhile is retried on the newest."""
        for _ in range(3):
            loaded = self._loaded(spec)
            sig_name = self._signature(loaded, spec, method)
            arrays = inputs(loaded.model.signatures[sig_name])
            try:
                return loaded, sig_name, compute(loaded, sig_name, arrays)
            except ModelRetired:
                if spec.WhichOneof("version_choice") == "version":
                    raise rest.BadRequest(f"Servable not found for request: Specific({spec.name}, "
                                          f"{spec.version.value})", 404) from None
        raise rest.BadRequest("The model is being reloaded; retry.", 503)

    def _answer_spec(self, out: Any, loaded: LoadedVersion, sig_name: str) -> None:
        out.name = self.model_name
        out.version.value = loaded.version
        out.signature_name = sig_name

    # --- PredictionService -------------------------------------------------------

    def predict(self, request: Any) -> Any:
        loaded, sig_name, outputs = self._run(
            request.model_spec, None, lambda sig: grpc_inputs.predict_inputs(sig, request.inputs))
        wanted = list(request.output_filter)
        unknown = sorted(set(wanted) - set(outputs))
        if unknown:
            raise rest.BadRequest(f"output_filter names {unknown}, which signature {sig_name!r} does not output; "
                                  f"its outputs are {sorted(outputs)}.")
        response = pb.PredictResponse()
        for name in wanted or outputs:
            response.outputs[name].CopyFrom(from_array(outputs[name]))
        self._answer_spec(response.model_spec, loaded, sig_name)
        return response

    def classify(self, request: Any) -> Any:
        loaded, sig_name, outputs = self._run(
            request.model_spec, CLASSIFY, lambda sig: grpc_inputs.example_inputs(sig, request.input))
        response = pb.ClassificationResponse()
        grpc_inputs.classification_result(outputs, response.result)
        self._answer_spec(response.model_spec, loaded, sig_name)
        return response

    def regress(self, request: Any) -> Any:
        loaded, sig_name, outputs = self._run(
            request.model_spec, REGRESS, lambda sig: grpc_inputs.example_inputs(sig, request.input))
        response = pb.RegressionResponse()
        grpc_inputs.regression_result(outputs, response.result)
        self._answer_spec(response.model_spec, loaded, sig_name)
        return response

    def multi_inference(self, request: Any) -> Any:
        """Each task (classify or regress, one model) on the same examples."""
        if not request.tasks:
            raise rest.BadRequest("MultiInference needs at least one task (tasks).")
        response = pb.MultiInferenceResponse()
        for i, task in enumerate(request.tasks):
            if task.method_name not in (CLASSIFY, REGRESS):
                raise rest.BadRequest(f"tasks[{i}].method_name must be {CLASSIFY!r} or {REGRESS!r}. "
                                      f"Received: {task.method_name!r}.")
            loaded, sig_name, outputs = self._run(
                task.model_spec, task.method_name, lambda sig: grpc_inputs.example_inputs(sig, request.input))
            result = response.results.add()
            self._answer_spec(result.model_spec, loaded, sig_name)
            if task.method_name == CLASSIFY:
                grpc_inputs.classification_result(outputs, result.classification_result)
            else:
                grpc_inputs.regression_result(outputs, result.regression_result)
        return response

    def get_model_metadata(self, request: Any) -> Any:
        fields = list(request.metadata_field)
        if fields != ["signature_def"]:
            raise rest.BadRequest(f"metadata_field must be ['signature_def'] (the only metadata served). "
                                  f"Received: {fields}.")
        loaded = self._loaded(request.model_spec)
        sig_map = pb.SignatureDefMap()
        for name, sig in loaded.model.signatures.items():
            entry = sig_map.signature_def[name]
            entry.method_name = sig.method_name
            for target, specs in ((entry.inputs, sig.request_inputs), (entry.outputs, sig.outputs)):
                for tensor, spec in specs.items():
                    info = target[tensor]
                    info.name, info.dtype = tensor, dtype_enum(spec["dtype"])
                    for d in spec["shape"]:
                        info.tensor_shape.dim.add(size=-1 if d is None else d)
        response = pb.GetModelMetadataResponse()
        response.model_spec.name = self.model_name
        response.model_spec.version.value = loaded.version
        packed = response.metadata["signature_def"]
        packed.type_url = "type.googleapis.com/tensorflow.serving.SignatureDefMap"
        packed.value = sig_map.SerializeToString()
        return response

    # --- ModelService --------------------------------------------------------------

    def get_model_status(self, request: Any) -> Any:
        version = self._version(request.model_spec)
        entries = self.store.status(version)
        if not entries:
            which = f"version {version} of model" if version is not None else "any versions of model"
            raise rest.BadRequest(f"Could not find {which} {request.model_spec.name}", 404)
        response = pb.GetModelStatusResponse()
        for e in entries:
            s = response.model_version_status.add(version=int(e["version"]), state=pb.VERSION_STATES[e["state"]])
            s.status.error_code = pb.ERROR_CODES[e["status"]["error_code"]]
            s.status.error_message = e["status"]["error_message"]
        return response


def compute(loaded: LoadedVersion, sig_name: str, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Runs one request on the caller's thread: through the batcher, or bounded by the gate."""
    sig = loaded.model.signatures[sig_name]
    batcher = loaded.batchers.get(sig_name)
    rows = rest.num_rows(sig, arrays)
    if rows is None or not batchable(sig) or batcher is None:
        loaded.gate.enter(rows or 1, loaded.options)
        try:
            if rows is None or not batchable(sig):
                return sig(arrays)
            return run_padded(sig, arrays, rows, loaded.options)
        finally:
            loaded.gate.leave()
    parts = [f.result() for f in batcher.submit(arrays, rows)]
    if len(parts) == 1:
        return parts[0]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
