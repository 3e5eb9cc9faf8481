"""TensorFlow Serving's gRPC messages, without TensorFlow.

The messages of tensorflow_serving/apis (predict, classification,
regression, inference, get_model_metadata, get_model_status, model, input,
status, config/monitoring_config) and of TensorFlow's tensor.proto, tensor_shape.proto, types.proto
and meta_graph.proto (SignatureDef, TensorInfo) that the model server reads
and writes: the same package names (`tensorflow.serving`, `tensorflow`),
message names, field numbers and types, so TF Serving's clients talk to our
server unchanged. Fields the server never reads (streaming options,
resource handles, sparse TensorInfo) are left out: proto3 keeps them as
unknown fields. `tests/serving/test_grpc.py` checks every field here against
TF Serving's own descriptors.

Like `api/example_proto.py`, the descriptors live in a private pool, so
TensorFlow's classes (same full names) can be imported in the same process;
`tf.train.Example` is that module's file, added to this pool.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, wrappers_pb2

from tpu_estimator.api import example_proto

_F = descriptor_pb2.FieldDescriptorProto
_SCALARS = {
    "string": _F.TYPE_STRING, "bytes": _F.TYPE_BYTES, "bool": _F.TYPE_BOOL, "float": _F.TYPE_FLOAT,
    "double": _F.TYPE_DOUBLE, "int32": _F.TYPE_INT32, "int64": _F.TYPE_INT64,
    "uint32": _F.TYPE_UINT32, "uint64": _F.TYPE_UINT64,
}

# TensorFlow's DataType (types.proto): the values a served model can take or give.
DATA_TYPES = {
    "DT_INVALID": 0, "DT_FLOAT": 1, "DT_DOUBLE": 2, "DT_INT32": 3, "DT_UINT8": 4, "DT_INT16": 5,
    "DT_INT8": 6, "DT_STRING": 7, "DT_COMPLEX64": 8, "DT_INT64": 9, "DT_BOOL": 10, "DT_BFLOAT16": 14,
    "DT_UINT16": 17, "DT_COMPLEX128": 18, "DT_HALF": 19, "DT_UINT32": 22, "DT_UINT64": 23,
}
# tensorflow.error.Code (error_codes.proto), as StatusProto.error_code.
ERROR_CODES = {
    "OK": 0, "CANCELLED": 1, "UNKNOWN": 2, "INVALID_ARGUMENT": 3, "DEADLINE_EXCEEDED": 4,
    "NOT_FOUND": 5, "ALREADY_EXISTS": 6, "PERMISSION_DENIED": 7, "RESOURCE_EXHAUSTED": 8,
    "FAILED_PRECONDITION": 9, "ABORTED": 10, "OUT_OF_RANGE": 11, "UNIMPLEMENTED": 12,
    "INTERNAL": 13, "UNAVAILABLE": 14, "DATA_LOSS": 15, "UNAUTHENTICATED": 16,
}
VERSION_STATES = {"UNKNOWN": 0, "START": 10, "LOADING": 20, "AVAILABLE": 30, "UNLOADING": 40, "END": 50}

# One message: (name, [(field, number, type, flags)]); type is a scalar name, a message's or
# an enum's full name (leading "."); flags: "rep" repeated, "oneof:NAME", "map:KEY".
_Spec = tuple[str, list[tuple[str, int, str, str]]]

_TENSORFLOW: list[_Spec] = [
    ("TensorShapeProto", [("dim", 2, ".tensorflow.TensorShapeProto.Dim", "rep"),
                          ("unknown_rank", 3, "bool", "")]),
    ("TensorShapeProto.Dim", [("size", 1, "int64", ""), ("name", 2, "string", "")]),
    ("TensorProto", [
        ("dtype", 1, ".tensorflow.DataType", ""), ("tensor_shape", 2, ".tensorflow.TensorShapeProto", ""),
        ("version_number", 3, "int32", ""), ("tensor_content", 4, "bytes", ""),
        ("half_val", 13, "int32", "rep"), ("float_val", 5, "float", "rep"), ("double_val", 6, "double", "rep"),
        ("int_val", 7, "int32", "rep"), ("string_val", 8, "bytes", "rep"), ("scomplex_val", 9, "float", "rep"),
        ("int64_val", 10, "int64", "rep"), ("bool_val", 11, "bool", "rep"), ("dcomplex_val", 12, "double", "rep"),
        ("uint32_val", 16, "uint32", "rep"), ("uint64_val", 17, "uint64", "rep"),
    ]),
    ("TensorInfo", [("name", 1, "string", "oneof:encoding"), ("dtype", 2, ".tensorflow.DataType", ""),
                    ("tensor_shape", 3, ".tensorflow.TensorShapeProto", "")]),
    ("SignatureDef", [("inputs", 1, ".tensorflow.TensorInfo", "map:string"),
                      ("outputs", 2, ".tensorflow.TensorInfo", "map:string"),
                      ("method_name", 3, "string", "")]),
]

_S = ".tensorflow.serving."
_SERVING: list[_Spec] = [
    ("ModelSpec", [("name", 1, "string", ""), ("version", 2, ".google.protobuf.Int64Value", "oneof:version_choice"),
                   ("version_label", 4, "string", "oneof:version_choice"), ("signature_name", 3, "string", "")]),
    ("PredictRequest", [("model_spec", 1, _S + "ModelSpec", ""), ("inputs", 2, ".tensorflow.TensorProto", "map:string"),
                        ("output_filter", 3, "string", "rep")]),
    ("PredictResponse", [("model_spec", 2, _S + "ModelSpec", ""),
                         ("outputs", 1, ".tensorflow.TensorProto", "map:string")]),
    ("ExampleList", [("examples", 1, ".tensorflow.Example", "rep")]),
    ("ExampleListWithContext", [("examples", 1, ".tensorflow.Example", "rep"), ("context", 2, ".tensorflow.Example", "")]),
    ("Input", [("example_list", 1, _S + "ExampleList", "oneof:kind"),
               ("example_list_with_context", 2, _S + "ExampleListWithContext", "oneof:kind")]),
    ("Class", [("label", 1, "string", ""), ("score", 2, "float", "")]),
    ("Classifications", [("classes", 1, _S + "Class", "rep")]),
    ("ClassificationResult", [("classifications", 1, _S + "Classifications", "rep")]),
    ("ClassificationRequest", [("model_spec", 1, _S + "ModelSpec", ""), ("input", 2, _S + "Input", "")]),
    ("ClassificationResponse", [("model_spec", 2, _S + "ModelSpec", ""), ("result", 1, _S + "ClassificationResult", "")]),
    ("Regression", [("value", 1, "float", "")]),
    ("RegressionResult", [("regressions", 1, _S + "Regression", "rep")]),
    ("RegressionRequest", [("model_spec", 1, _S + "ModelSpec", ""), ("input", 2, _S + "Input", "")]),
    ("RegressionResponse", [("model_spec", 2, _S + "ModelSpec", ""), ("result", 1, _S + "RegressionResult", "")]),
    ("InferenceTask", [("model_spec", 1, _S + "ModelSpec", ""), ("method_name", 2, "string", "")]),
    ("InferenceResult", [("model_spec", 1, _S + "ModelSpec", ""),
                         ("classification_result", 2, _S + "ClassificationResult", "oneof:result"),
                         ("regression_result", 3, _S + "RegressionResult", "oneof:result")]),
    ("MultiInferenceRequest", [("tasks", 1, _S + "InferenceTask", "rep"), ("input", 2, _S + "Input", "")]),
    ("MultiInferenceResponse", [("results", 1, _S + "InferenceResult", "rep")]),
    ("SignatureDefMap", [("signature_def", 1, ".tensorflow.SignatureDef", "map:string")]),
    ("GetModelMetadataRequest", [("model_spec", 1, _S + "ModelSpec", ""), ("metadata_field", 2, "string", "rep")]),
    ("GetModelMetadataResponse", [("model_spec", 1, _S + "ModelSpec", ""),
                                  ("metadata", 2, ".google.protobuf.Any", "map:string")]),
    ("StatusProto", [("error_code", 1, ".tensorflow.error.Code", ""), ("error_message", 2, "string", "")]),
    ("ModelVersionStatus", [("version", 1, "int64", ""), ("state", 2, _S + "ModelVersionStatus.State", ""),
                            ("status", 3, _S + "StatusProto", "")]),
    ("GetModelStatusRequest", [("model_spec", 1, _S + "ModelSpec", "")]),
    ("GetModelStatusResponse", [("model_version_status", 1, _S + "ModelVersionStatus", "rep")]),
    # tensorflow_serving/config/monitoring_config.proto: --monitoring_config_file's text format.
    ("PrometheusConfig", [("enable", 1, "bool", ""), ("path", 2, "string", "")]),
    ("MonitoringConfig", [("prometheus_config", 1, _S + "PrometheusConfig", "")]),
]


def _enum(parent: Any, name: str, values: dict[str, int]) -> None:
    e = parent.enum_type.add(name=name)
    for k, v in values.items():
        e.value.add(name=k, number=v)


def _message(fd: Any, spec: _Spec) -> None:
    name, fields = spec
    parent = fd
    *outer, leaf = name.split(".")
    for o in outer:
        parent = next(m for m in parent.message_type if m.name == o) if parent is fd else \
            next(m for m in parent.nested_type if m.name == o)
    msg = (parent.message_type if parent is fd else parent.nested_type).add(name=leaf)
    oneofs: list[str] = []
    for fname, number, ftype, flags in fields:
        label = _F.LABEL_REPEATED if flags == "rep" or flags.startswith("map:") else _F.LABEL_OPTIONAL
        f = msg.field.add(name=fname, number=number, label=label)
        if flags.startswith("map:"):  # map<key, value>: a repeated nested XxxEntry
            entry = msg.nested_type.add(name="".join(p.title() for p in fname.split("_")) + "Entry")
            entry.options.map_entry = True
            entry.field.add(name="key", number=1, label=_F.LABEL_OPTIONAL, type=_SCALARS[flags[4:]])
            _typed(entry.field.add(name="value", number=2, label=_F.LABEL_OPTIONAL), ftype)
            f.type, f.type_name = _F.TYPE_MESSAGE, f".{fd.package}.{name}.{entry.name}"
            continue
        _typed(f, ftype)
        if flags.startswith("oneof:"):
            if flags[6:] not in oneofs:
                oneofs.append(flags[6:])
                msg.oneof_decl.add(name=flags[6:])
            f.oneof_index = oneofs.index(flags[6:])


def _typed(f: Any, ftype: str) -> None:
    if not ftype.startswith("."):
        f.type = _SCALARS[ftype]
    elif ftype.endswith(("DataType", "Code", "State")):
        f.type, f.type_name = _F.TYPE_ENUM, ftype
    else:
        f.type, f.type_name = _F.TYPE_MESSAGE, ftype


def _files() -> list[descriptor_pb2.FileDescriptorProto]:
    example = descriptor_pb2.FileDescriptorProto()
    example_proto.Example.DESCRIPTOR.file.CopyToProto(example)
    wrappers = descriptor_pb2.FileDescriptorProto()
    wrappers_pb2.DESCRIPTOR.CopyToProto(wrappers)
    from google.protobuf import any_pb2

    any_file = descriptor_pb2.FileDescriptorProto()
    any_pb2.DESCRIPTOR.CopyToProto(any_file)
    errors = descriptor_pb2.FileDescriptorProto(
        name="tpu_estimator/tensorflow/core/protobuf/error_codes.proto", package="tensorflow.error", syntax="proto3")
    _enum(errors, "Code", ERROR_CODES)
    tf = descriptor_pb2.FileDescriptorProto(
        name="tpu_estimator/tensorflow/core/framework/tensor.proto", package="tensorflow", syntax="proto3")
    _enum(tf, "DataType", DATA_TYPES)
    for spec in _TENSORFLOW:
        _message(tf, spec)
    serving = descriptor_pb2.FileDescriptorProto(
        name="tpu_estimator/tensorflow_serving/apis/apis.proto", package="tensorflow.serving", syntax="proto3",
        dependency=[example.name, wrappers.name, any_file.name, errors.name, tf.name])
    for spec in _SERVING:
        _message(serving, spec)
    status = next(m for m in serving.message_type if m.name == "ModelVersionStatus")
    _enum(status, "State", VERSION_STATES)
    return [example, wrappers, any_file, errors, tf, serving]


_POOL = descriptor_pool.DescriptorPool()
for _file in _files():
    _POOL.Add(_file)


def message_class(full_name: str) -> Any:
    """The class of one message of this module's pool, e.g. 'tensorflow.serving.PredictRequest'."""
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(full_name))


TensorProto = message_class("tensorflow.TensorProto")
TensorShapeProto = message_class("tensorflow.TensorShapeProto")
SignatureDef = message_class("tensorflow.SignatureDef")
Example = message_class("tensorflow.Example")
ModelSpec = message_class("tensorflow.serving.ModelSpec")
PredictRequest = message_class("tensorflow.serving.PredictRequest")
PredictResponse = message_class("tensorflow.serving.PredictResponse")
Input = message_class("tensorflow.serving.Input")
ClassificationRequest = message_class("tensorflow.serving.ClassificationRequest")
ClassificationResponse = message_class("tensorflow.serving.ClassificationResponse")
RegressionRequest = message_class("tensorflow.serving.RegressionRequest")
RegressionResponse = message_class("tensorflow.serving.RegressionResponse")
MultiInferenceRequest = message_class("tensorflow.serving.MultiInferenceRequest")
MultiInferenceResponse = message_class("tensorflow.serving.MultiInferenceResponse")
SignatureDefMap = message_class("tensorflow.serving.SignatureDefMap")
GetModelMetadataRequest = message_class("tensorflow.serving.GetModelMetadataRequest")
GetModelMetadataResponse = message_class("tensorflow.serving.GetModelMetadataResponse")
GetModelStatusRequest = message_class("tensorflow.serving.GetModelStatusRequest")
GetModelStatusResponse = message_class("tensorflow.serving.GetModelStatusResponse")
MonitoringConfig = message_class("tensorflow.serving.MonitoringConfig")
