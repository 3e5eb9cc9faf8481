"""The gRPC API, called with TF Serving's own client stubs (tensorflow-serving-api): same answers
as REST and predict(), TF Serving's status codes, and messages that match TF Serving's field by field."""

import concurrent.futures as cf
import re

import grpc
import httpx
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import (classification_pb2, get_model_metadata_pb2, get_model_status_pb2,
                                     inference_pb2, model_service_pb2_grpc, predict_pb2,
                                     prediction_service_pb2_grpc, regression_pb2)

import export_test_model as tm
from tests.serving.conftest import MODEL
from tpu_estimator.serving import tf_serving_proto as ours
from tpu_estimator.serving.grpc_server import GrpcServer
from tpu_estimator.serving.model_store import ModelStore


@pytest.fixture(scope="module")
def grpc_server(server):  # the REST fixture's store (loaded), served over gRPC too
    with GrpcServer(server.store, MODEL, max_threads=8) as g:
        yield g


@pytest.fixture(scope="module")
def stub(grpc_server):
    with grpc.insecure_channel(grpc_server.target) as channel:
        yield prediction_service_pb2_grpc.PredictionServiceStub(channel)


@pytest.fixture(scope="module")
def rest(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def _fields(d):
    return {f.name: (f.number, f.type, f.is_repeated,
                     (f.message_type or f.enum_type).full_name if (f.message_type or f.enum_type) else None,
                     f.containing_oneof.name if f.containing_oneof else None) for f in d.fields}


def _compare(mine, theirs, seen):
    if mine.full_name in seen:
        return
    seen.add(mine.full_name)
    assert mine.full_name == theirs.full_name
    for name, spec in _fields(mine).items():
        assert spec == _fields(theirs)[name], f"{mine.full_name}.{name}"
    for f in mine.fields:
        if f.message_type is not None:
            _compare(f.message_type, theirs.fields_by_name[f.name].message_type, seen)
        if f.enum_type is not None:
            theirs_values = {v.name: v.number for v in theirs.fields_by_name[f.name].enum_type.values}
            assert {v.name: v.number for v in f.enum_type.values}.items() <= theirs_values.items()


@pytest.mark.parametrize("name", ["PredictRequest", "PredictResponse", "ClassificationRequest",
                                  "ClassificationResponse", "RegressionRequest", "RegressionResponse",
                                  "MultiInferenceRequest", "MultiInferenceResponse", "GetModelMetadataRequest",
                                  "GetModelMetadataResponse", "SignatureDefMap", "GetModelStatusRequest",
                                  "GetModelStatusResponse"])
def test_messages_match_tf_servings_field_by_field(name):
    modules = [predict_pb2, classification_pb2, regression_pb2, inference_pb2, get_model_metadata_pb2,
               get_model_status_pb2]
    theirs = next(getattr(m, name) for m in modules if hasattr(m, name))
    _compare(getattr(ours, name).DESCRIPTOR, theirs.DESCRIPTOR, set())


def _predict_request(x, *, version=None, signature="", content=True, name="x", model=MODEL):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = signature
    if version is not None:
        request.model_spec.version.value = version
    if content:
        request.inputs[name].CopyFrom(tf.make_tensor_proto(x))
    else:  # the typed field: float_val
        request.inputs[name].dtype = tf.float32.as_datatype_enum
        request.inputs[name].tensor_shape.dim.extend([tf.TensorShape([d]).as_proto().dim[0] for d in x.shape])
        request.inputs[name].float_val.extend(x.reshape(-1).tolist())
    return request


def test_predict_matches_estimator_with_tensor_content_and_typed_values(trained_est, stub, server):
    expected = tm.expected_predictions(trained_est)
    for content in (True, False):
        response = stub.Predict(_predict_request(tm.X[:7], content=content), timeout=60)
        np.testing.assert_allclose(tf.make_ndarray(response.outputs["logits"]), expected["logits"][:7],
                                   rtol=1e-5, atol=1e-5)
        assert tf.make_ndarray(response.outputs["classes"]).tolist() == expected["classes"][:7].tolist()
        assert (response.model_spec.name, response.model_spec.version.value,
                response.model_spec.signature_name) == (MODEL, server.store.current.version, "serving_default")
    only = _predict_request(tm.X[:2])
    only.output_filter.append("classes")
    assert list(stub.Predict(only, timeout=60).outputs) == ["classes"]


def _examples(x, context=None):
    examples = [tf.train.Example(features=tf.train.Features(feature={
        "x": tf.train.Feature(float_list=tf.train.FloatList(value=row.tolist()))})) for row in x]
    if context is None:
        return {"example_list": {"examples": examples}}
    return {"example_list_with_context": {"examples": examples, "context": context}}


def test_classify_regress_and_multi_inference_match_rest(stub, rest):
    x = tm.X[:3]
    request = classification_pb2.ClassificationRequest(input=_examples(x))
    request.model_spec.name, request.model_spec.signature_name = MODEL, "classify"
    got = stub.Classify(request, timeout=60).result.classifications
    want = rest.post(f"/v1/models/{MODEL}:classify", json={
        "signature_name": "classify", "examples": [{"x": r} for r in x.tolist()]}).json()["results"]
    np.testing.assert_allclose([[c.score for c in row.classes] for row in got],
                               [[s for _, s in row] for row in want], rtol=1e-5)
    assert [[c.label for c in row.classes] for row in got] == [[label for label, _ in row] for row in want]
    reg = regression_pb2.RegressionRequest(input=_examples(x))
    reg.model_spec.name, reg.model_spec.signature_name = MODEL, "regress"
    values = [r.value for r in stub.Regress(reg, timeout=60).result.regressions]
    want_reg = rest.post(f"/v1/models/{MODEL}:regress", json={
        "signature_name": "regress", "examples": [{"x": r} for r in x.tolist()]}).json()["results"]
    np.testing.assert_allclose(values, want_reg, rtol=1e-5)
    multi = inference_pb2.MultiInferenceRequest(input=_examples(x))
    for sig, method in (("classify", "tensorflow/serving/classify"), ("regress", "tensorflow/serving/regress")):
        task = multi.tasks.add(method_name=method)
        task.model_spec.name, task.model_spec.signature_name = MODEL, sig
    results = stub.MultiInference(multi, timeout=60).results
    np.testing.assert_allclose([r.value for r in results[1].regression_result.regressions], values, rtol=1e-6)
    assert len(results[0].classification_result.classifications) == 3


def test_metadata_and_status(stub, grpc_server, server):
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    request.model_spec.name = MODEL
    response = stub.GetModelMetadata(request, timeout=60)
    sig_map = get_model_metadata_pb2.SignatureDefMap()
    assert response.metadata["signature_def"].Unpack(sig_map)
    assert sorted(sig_map.signature_def) == ["classify", "regress", "serving_default"]
    x = sig_map.signature_def["serving_default"].inputs["x"]
    assert (x.dtype, [d.size for d in x.tensor_shape.dim]) == (tf.float32.as_datatype_enum, [-1, 4])
    assert sig_map.signature_def["classify"].method_name == "tensorflow/serving/classify"
    with grpc.insecure_channel(grpc_server.target) as channel:
        status = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(
            get_model_status_pb2.GetModelStatusRequest(model_spec={"name": MODEL}), timeout=60)
    [entry] = status.model_version_status
    assert (entry.version, entry.state, entry.status.error_code) == (
        server.store.current.version, get_model_status_pb2.ModelVersionStatus.AVAILABLE, 0)


def _code(call):
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code(), info.value.details()


@pytest.mark.parametrize("request_kwargs, code, match", [
    ({"name": "y"}, grpc.StatusCode.INVALID_ARGUMENT, r"takes the inputs \['x'\].*unknown=\['y'\]"),
    ({"x": np.zeros((2, 5), np.float32)}, grpc.StatusCode.INVALID_ARGUMENT, r"'x'.*\(2, 5\)|shape"),
    ({"x": np.zeros((2, 4), np.float64)}, grpc.StatusCode.OK, ""),
    ({"model": "other"}, grpc.StatusCode.NOT_FOUND, r"Latest\(other\)"),
    ({"version": 1}, grpc.StatusCode.NOT_FOUND, r"Specific\(mlp, 1\)"),
    ({"signature": "nope"}, grpc.StatusCode.INVALID_ARGUMENT, r'"nope" not found.*serving_default'),
])
def test_errors_carry_tf_servings_codes(stub, request_kwargs, code, match):
    kwargs = dict(request_kwargs)
    x = kwargs.pop("x", tm.X[:2])
    request = _predict_request(x, **kwargs)
    if code == grpc.StatusCode.OK:
        assert stub.Predict(request, timeout=60).outputs["logits"].tensor_shape.dim[0].size == 2
        return
    got, details = _code(lambda: stub.Predict(request, timeout=60))
    assert got == code and re.search(match, details), details


def test_malformed_tensors_and_examples_are_invalid_argument(stub):
    short = _predict_request(tm.X[:2])
    short.inputs["x"].tensor_content = short.inputs["x"].tensor_content[:-4]
    code, details = _code(lambda: stub.Predict(short, timeout=60))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "tensor_content must hold 8" in details
    wrong_width = classification_pb2.ClassificationRequest(input=_examples(tm.X[:2, :3]))
    wrong_width.model_spec.name, wrong_width.model_spec.signature_name = MODEL, "classify"
    code, details = _code(lambda: stub.Classify(wrong_width, timeout=60))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "has 3 values" in details
    predict_sig = classification_pb2.ClassificationRequest(input=_examples(tm.X[:2]))
    predict_sig.model_spec.name = MODEL  # serving_default is a predict signature
    code, details = _code(lambda: stub.Classify(predict_sig, timeout=60))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "method_name to be tensorflow/serving/classify" in details
    code, details = _code(lambda: stub.GetModelMetadata(
        get_model_metadata_pb2.GetModelMetadataRequest(model_spec={"name": MODEL}), timeout=60))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "metadata_field" in details


def test_overload_is_resource_exhausted_never_unknown(export_base):
    store = ModelStore(export_base, poll_seconds=0, batching_flags={
        "max_batch_size": 2, "allowed_batch_sizes": [2], "max_enqueued_batches": 1, "batch_timeout_micros": 50000})
    store.start()
    try:
        with GrpcServer(store, MODEL, max_threads=32) as g, grpc.insecure_channel(g.target) as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)

            def one(_):
                try:
                    stub.Predict(_predict_request(tm.X[:2]), timeout=60)
                    return grpc.StatusCode.OK
                except grpc.RpcError as e:
                    return e.code()

            with cf.ThreadPoolExecutor(32) as pool:
                codes = list(pool.map(one, range(96)))
    finally:
        store.stop()
    assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}, set(codes)
    assert codes.count(grpc.StatusCode.OK) > 0 and codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) > 0


@pytest.mark.parametrize("value", [
    np.arange(6, dtype=np.float32).reshape(2, 3), np.float64([1.5, -2]), np.float16([1.5, -2]),
    np.array([1.5, -2], tf.bfloat16.as_numpy_dtype), np.int8([1, -2]), np.uint8([3]), np.int16([-7]),
    np.uint16([7]), np.int32([[1], [2]]), np.int64([2**40]), np.uint32([2**31]), np.uint64([2**63]),
    np.bool_([True, False]), np.complex64([1 + 2j, 3 - 4j]), np.complex128([5 - 6j]), np.array([b"a", b"bc"]),
])
def test_tensor_protos_convert_as_tensorflow_does(value):
    """TensorFlow's protos (tensor_content or typed *_val, whichever TF writes) -> ours, and back."""
    from tpu_estimator.serving.tensor_proto import from_array, to_array

    got = to_array(ours.TensorProto.FromString(tf.make_tensor_proto(value).SerializeToString()), "x")
    assert got.shape == value.shape and got.tolist() == value.tolist()
    back = tf.make_ndarray(type(tf.make_tensor_proto(value)).FromString(from_array(got).SerializeToString()))
    assert back.dtype == (value.dtype if value.dtype.kind != "S" else object) and back.tolist() == value.tolist()
    if value.dtype.kind not in "Sc":  # the typed field, one value filling the shape (TensorFlow's rule)
        one = tf.make_tensor_proto(value.reshape(-1)[:1].tolist(), dtype=tf.as_dtype(value.dtype), shape=[3])
        proto = ours.TensorProto.FromString(one.SerializeToString())
        assert to_array(proto, "x").tolist() == [value.reshape(-1)[0]] * 3
