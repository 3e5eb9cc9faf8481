"""The Starlette application: TensorFlow Serving's REST API over a `ModelStore`.

Routes (NAME is `--model_name`; `/versions/N` may follow it everywhere):
`GET /v1/models/NAME` (status), `GET /v1/models/NAME/metadata` (signatures),
`POST /v1/models/NAME:predict`, `:classify`, `:regress`. Client errors get a
4xx status and TensorFlow Serving's `{"error": "..."}` body.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from typing import Any

import numpy as np
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tpu_estimator.api.export_output import DEFAULT_SERVING_SIGNATURE_DEF_KEY as DEFAULT_SIGNATURE
from tpu_estimator.serving import rest
from tpu_estimator.serving.batcher import ModelRetired, run_padded
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
DEFAULT_MAX_BODY_BYTES = 64 << 20


def create_app(store: ModelStore, model_name: str, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> Starlette:
    """The ASGI app; its lifespan starts and stops `store` (loading and hot reload)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        await asyncio.to_thread(store.start)
        try:
            yield
        finally:
            await asyncio.to_thread(store.stop)

    async def handle(request: Request) -> Response:
        try:
            return await _dispatch(request, store, model_name, max_body_bytes)
        except rest.BadRequest as e:
            return _error(str(e), e.status)
        except Exception as e:  # a server bug: report it, keep serving
            log.exception("Request failed.")
            return _error(f"Internal error: {type(e).__name__}: {e}", 500)

    routes = [Route("/v1/models/{rest:path}", handle, methods=["GET", "POST"])]
    return Starlette(routes=routes, lifespan=lifespan)


def _error(text: str, status: int) -> JSONResponse:
    return JSONResponse({"error": text}, status_code=status)


async def _dispatch(request: Request, store: ModelStore, model_name: str, limit: int) -> Response:
    match = _PATH.match(request.path_params["rest"])
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
            raise rest.BadRequest(f"Malformed request: {request.method} {request.url.path}", 405)
        loaded = _loaded(store, name, version_n)
        if match["metadata"]:
            return JSONResponse(_metadata(loaded, name))
        return JSONResponse({"model_version_status": [{
            "version": str(loaded.version), "state": "AVAILABLE",
            "status": {"error_code": "OK", "error_message": ""},
        }]})
    if verb not in _VERBS:
        raise rest.BadRequest(f"Malformed request: unknown method ':{verb}'; use :predict, :classify "
                              "or :regress.", 404)
    if request.method != "POST":
        raise rest.BadRequest(f":{verb} needs a POST request.", 405)
    body = await _json_body(request, limit)
    for attempt in range(3):
        loaded = _loaded(store, name, version_n)
        try:
            return JSONResponse(await _run(loaded, verb, body))
        except ModelRetired:  # a newer version replaced it meanwhile: run there
            if version_n is not None:
                raise rest.BadRequest(f"Servable not found for request: Specific({name}, {version_n})", 404)
    raise rest.BadRequest("The model is being reloaded; retry.", 503)


def _loaded(store: ModelStore, name: str, version: int | None) -> LoadedVersion:
    loaded = store.get(version)
    if loaded is None:
        which = f"Latest({name})" if version is None else f"Specific({name}, {version})"
        raise rest.BadRequest(f"Servable not found for request: {which}", 404)
    return loaded


async def _json_body(request: Request, limit: int) -> dict[str, Any]:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise rest.BadRequest(f"Request body of {declared} bytes exceeds the limit of {limit} bytes.", 413)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise rest.BadRequest(f"Request body exceeds the limit of {limit} bytes.", 413)
        chunks.append(chunk)
    try:
        body = json.loads(b"".join(chunks))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise rest.BadRequest(f"JSON Parse error: {e}") from e
    if not isinstance(body, dict):
        raise rest.BadRequest("JSON Value: the request body must be a JSON object.")
    return body


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
    if rows is None or not batchable(sig):
        return await asyncio.to_thread(sig, arrays)
    if batcher is None:  # batching off: one request per call, padded to an allowed size
        return await asyncio.to_thread(run_padded, sig, arrays, rows, loaded.options)
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
            "allowed_batch_sizes": list(o.allowed_batch_sizes)}

