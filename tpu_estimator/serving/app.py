"""The Starlette application: TensorFlow Serving's REST API over a `ModelStore`.

Routes (NAME is `--model_name`; `/versions/N` may follow it everywhere):
`GET /v1/models/NAME` (status), `GET /v1/models/NAME/metadata` (signatures),
`POST /v1/models/NAME:predict`, `:classify`, `:regress`; KServe's probes
`GET /v2/health/live` (200 while serving) and `GET /v2/health/ready` (200 once
a version is AVAILABLE, else 503); with `metrics`, Prometheus text at
`metrics_path` (--monitoring_config_file). Every error, for any
URL and method, gets TensorFlow Serving's `{"error": "..."}` body: 4xx for the
client's mistakes, 503 (with `Retry-After`) when the queue is full. JSON is read
and written as TF Serving does: `NaN`, `Infinity` and `-Infinity` are numbers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from typing import Any

import numpy as np
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from prometheus_client import CONTENT_TYPE_LATEST

from tpu_estimator.api.export_output import DEFAULT_SERVING_SIGNATURE_DEF_KEY as DEFAULT_SIGNATURE
from tpu_estimator.serving import rest
from tpu_estimator.serving.batcher import ModelRetired, QueueFull, run_padded
from tpu_estimator.serving.defaults import DEFAULT_MAX_BODY_BYTES
from tpu_estimator.serving.metrics import ServingMetrics
from tpu_estimator.serving.model_store import LoadedVersion, ModelStore, batchable

log = logging.getLogger("tpu_estimator.serving")

_PATH = re.compile(
    r"^(?P<name>[^/:]+)(?:/versions/(?P<version>[^/:]+))?"
    r"(?:(?P<metadata>/metadata)|:(?P<verb>[A-Za-z]+))?$"
)
_VERBS = {
    "predict": None,
    "classify": "tensorflow/serving/classify",
    "regress": "tensorflow/serving/regress",
}
RETRY_AFTER_SECONDS = 1
_THREAD_PARSE_BYTES = 1 << 20  # larger bodies are parsed off the event loop


class Refused(rest.BadRequest):
    """An error answered with extra headers (`Allow` for 405, `Retry-After` for 503)."""

    def __init__(self, text: str, status: int, headers: dict[str, str]) -> None:
        super().__init__(text, status)
        self.headers = headers


class TFJSONResponse(JSONResponse):
    """JSON as TF Serving writes it: NaN, Infinity and -Infinity as bare tokens."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, allow_nan=True, separators=(",", ":")).encode("utf-8")


_STATUS_CODES = {200: "OK", 400: "INVALID_ARGUMENT", 404: "NOT_FOUND", 405: "UNIMPLEMENTED",
                 413: "RESOURCE_EXHAUSTED", 503: "UNAVAILABLE"}


def create_app(store: ModelStore, model_name: str, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               metrics: ServingMetrics | None = None, metrics_path: str | None = None) -> Starlette:
    """The ASGI app; its lifespan starts and stops `store` (loading and hot reload).

    With `metrics`, REST requests are counted there, and `metrics_path` (if given)
    answers its Prometheus text."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        await asyncio.to_thread(store.start)
        try:
            yield
        finally:
            await asyncio.to_thread(store.stop)

    async def handle(request: Request) -> Response:
        path = request.url.path
        if request.method == "GET" and path in _PROBES:
            return _probe(path, store)
        if metrics_path is not None and path == metrics_path and metrics is not None:
            return Response(await asyncio.to_thread(metrics.exposition), media_type=CONTENT_TYPE_LATEST)
        if metrics is None or not path.startswith("/v1/models/"):
            return await answer(request)
        start = time.perf_counter()
        response = await answer(request)
        api = _api(path)
        metrics.request(model_name, api, "REST", _STATUS_CODES.get(response.status_code, str(response.status_code)),
                        time.perf_counter() - start)
        return response

    async def answer(request: Request) -> Response:
        try:
            return await _dispatch(request, store, model_name, max_body_bytes)
        except rest.BadRequest as e:
            return _error(str(e), e.status, e.headers if isinstance(e, Refused) else None)
        except QueueFull as e:
            return _error(str(e), 503, {"Retry-After": str(RETRY_AFTER_SECONDS)})
        except Exception as e:  # a server bug: report it, keep serving
            log.exception("Request failed.")
            return _error(f"Internal error: {type(e).__name__}: {e}", 500)

    async def http_error(request: Request, exc: Exception) -> Response:  # Starlette's own 4xx
        status, detail = getattr(exc, "status_code", 500), getattr(exc, "detail", str(exc))
        return _error(f"{detail}: {request.method} {request.url.path}", status, getattr(exc, "headers", None))

    methods = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
    routes = [Route("/{path:path}", handle, methods=methods)]  # every URL: errors stay JSON
    return Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: http_error})


_PROBES = ("/v2/health/live", "/v2/health/ready")


def _probe(path: str, store: ModelStore) -> Response:
    if path.endswith("/live"):
        return TFJSONResponse({"live": True})
    ready = store.ready
    return TFJSONResponse({"ready": ready}, status_code=200 if ready else 503)


def _api(path: str) -> str:
    """The API of a /v1/models URL, as the metrics label it: predict, classify, regress,
    get_model_metadata or get_model_status."""
    if ":" in path:
        verb = path.rsplit(":", 1)[1]
        return verb if verb in _VERBS else "other"  # a bounded set of label values
    return "get_model_metadata" if path.endswith("/metadata") else "get_model_status"


def _error(text: str, status: int, headers: dict[str, str] | None = None) -> JSONResponse:
    return TFJSONResponse({"error": text}, status_code=status, headers=headers)


async def _dispatch(request: Request, store: ModelStore, model_name: str, limit: int) -> Response:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise rest.BadRequest(f"Request body of {declared} bytes exceeds the limit of {limit} bytes "
                              "(--max_body_bytes).", 413)
    path = request.url.path
    if not path.startswith("/v1/models/"):
        raise rest.BadRequest(f"Malformed request: {request.method} {path}; the API is under "
                              f"/v1/models/{model_name}.", 404)
    match = _PATH.match(path[len("/v1/models/"):])
    if match is None:
        raise rest.BadRequest(f"Malformed request: {request.method} {request.url.path}", 404)
    name, version, verb = match["name"], match["version"], match["verb"]
    if version is not None and not version.isdigit():
        raise rest.BadRequest(f"Malformed version: {version!r}; versions are integers.", 400)
    version_n = None if version is None else int(version)
    if name != model_name:
        raise rest.BadRequest(f"Servable not found for request: Latest({name})", 404)
    if verb is None:
        if request.method != "GET":
            raise Refused(f"Malformed request: {request.method} {request.url.path}; use GET.",
                          405, {"Allow": "GET"})
        if match["metadata"]:
            return TFJSONResponse(_metadata(_loaded(store, name, version_n), name))
        status = store.status(version_n)
        if not status:
            which = f"version {version_n} of model" if version_n is not None else "any versions of model"
            raise rest.BadRequest(f"Could not find {which} {name}", 404)
        return TFJSONResponse({"model_version_status": status})
    if verb not in _VERBS:
        raise rest.BadRequest(f"Malformed request: unknown method ':{verb}'; use :predict, :classify "
                              "or :regress.", 404)
    if request.method != "POST":
        raise Refused(f":{verb} needs a POST request.", 405, {"Allow": "POST"})
    body = await _json_body(request, limit)
    for attempt in range(3):
        loaded = _loaded(store, name, version_n)
        try:
            return TFJSONResponse(await _run(loaded, verb, body))
        except ModelRetired:  # a newer version replaced it meanwhile: run there
            if version_n is not None:
                raise rest.BadRequest(f"Servable not found for request: Specific({name}, {version_n})", 404)
    raise Refused("The model is being reloaded; retry.", 503, {"Retry-After": str(RETRY_AFTER_SECONDS)})


def _loaded(store: ModelStore, name: str, version: int | None) -> LoadedVersion:
    loaded = store.get(version)
    if loaded is None:
        which = f"Latest({name})" if version is None else f"Specific({name}, {version})"
        raise rest.BadRequest(f"Servable not found for request: {which}", 404)
    return loaded


async def _json_body(request: Request, limit: int) -> dict[str, Any]:
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise rest.BadRequest(f"Request body exceeds the limit of {limit} bytes.", 413)
        chunks.append(chunk)
    raw = b"".join(chunks)
    try:
        body = await asyncio.to_thread(_parse, raw) if len(raw) > _THREAD_PARSE_BYTES else _parse(raw)
    except RecursionError as e:
        raise rest.BadRequest("JSON Parse error: the body is nested too deeply.") from e
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, ints of over 4300 digits
        raise rest.BadRequest(f"JSON Parse error: {e}") from e
    if not isinstance(body, dict):
        raise rest.BadRequest("JSON Value: the request body must be a JSON object.")
    return body


def _parse(raw: bytes) -> Any:
    """JSON as TF Serving reads it: NaN, Infinity, -Infinity accepted; 1e400 is Infinity."""
    return json.loads(raw)


async def _run(loaded: LoadedVersion, verb: str, body: dict[str, Any]) -> dict[str, Any]:
    signatures = loaded.model.signatures
    sig_name = body.get("signature_name", DEFAULT_SIGNATURE)
    if not isinstance(sig_name, str) or sig_name not in signatures:
        raise rest.BadRequest(
            f'Serving signature name: "{sig_name}" not found in signature def; '
            f"the signatures are {sorted(signatures)}."
        )
    sig = signatures[sig_name]
    wanted = _VERBS[verb]
    if wanted is not None and sig.method_name != wanted:
        raise rest.BadRequest(
            f"Expected {verb} signature method_name to be {wanted}. Was: {sig.method_name} "
            f"(signature {sig_name!r})."
        )
    if verb == "predict":
        arrays, row_format = rest.parse_predict(sig, body)
    else:
        arrays, row_format = rest.parse_examples(sig, body), True
    outputs = await _compute(loaded, sig_name, arrays)
    if verb == "classify":
        return rest.format_classify(outputs)
    if verb == "regress":
        return rest.format_regress(outputs)
    return rest.format_predict(outputs, row_format)


async def _compute(loaded: LoadedVersion, sig_name: str, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    sig = loaded.model.signatures[sig_name]
    batcher = loaded.batchers.get(sig_name)
    rows = rest.num_rows(sig, arrays)
    if rows is None or not batchable(sig) or batcher is None:  # one call per request, bounded
        loaded.gate.enter(rows or 1, loaded.options)
        try:
            if rows is None or not batchable(sig):
                return await asyncio.to_thread(sig, arrays)
            # batching off: one request per call, padded to an allowed size
            return await asyncio.to_thread(run_padded, sig, arrays, rows, loaded.options)
        finally:
            loaded.gate.leave()
    parts = await asyncio.gather(*(asyncio.wrap_future(f) for f in batcher.submit(arrays, rows)))
    if len(parts) == 1:
        return parts[0]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def _metadata(loaded: LoadedVersion, name: str) -> dict[str, Any]:
    sigs = {k: rest.signature_metadata(s) for k, s in loaded.model.signatures.items()}
    return {
        "model_spec": {"name": name, "signature_name": "", "version": str(loaded.version)},
        "metadata": {"signature_def": {"signature_def": sigs, "tags": list(loaded.model.tags)},
                     "platforms": list(loaded.model.platforms),
                     "batching": _options_json(loaded)},
    }


def _options_json(loaded: LoadedVersion) -> dict[str, Any]:
    o = loaded.options
    return {"enabled": o.enabled, "max_batch_size": o.max_batch_size,
            "batch_timeout_micros": o.batch_timeout_micros, "num_batch_threads": o.num_batch_threads,
            "allowed_batch_sizes": list(o.allowed_batch_sizes), "max_enqueued_batches": o.max_enqueued_batches}

