"""The REST server: TF Serving formats, predictions equal predict(), batching, hot reload."""

import concurrent.futures as cf
import os
import re
import socket
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import pytest

import export_test_model as tm
from tests.serving.conftest import MODEL
from tpu_estimator.loops.compiles import count_compiles
from tpu_estimator.serving.model_store import ModelStore
from tpu_estimator.serving.server import ServerThread

URL = f"/v1/models/{MODEL}"


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def test_predict_rows_and_columns_match_estimator(trained_est, client):
    expected = tm.expected_predictions(trained_est)
    rows = client.post(URL + ":predict", json={"instances": [{"x": r} for r in tm.X.tolist()]})
    assert rows.status_code == 200, rows.text
    preds = rows.json()["predictions"]
    np.testing.assert_allclose([p["logits"] for p in preds], expected["logits"], rtol=1e-5, atol=1e-5)
    assert [p["classes"] for p in preds] == expected["classes"].tolist()
    cols = client.post(URL + ":predict", json={"inputs": {"x": tm.X[:5].tolist()}}).json()["outputs"]
    np.testing.assert_allclose(cols["logits"], expected["logits"][:5], rtol=1e-5, atol=1e-5)
    bare = client.post(URL + ":predict", json={"instances": tm.X[:2].tolist()}).json()["predictions"]
    assert [p["classes"] for p in bare] == expected["classes"][:2].tolist()


def test_status_metadata_and_versions(client, server):
    version = str(server.store.current.version)
    status = client.get(URL).json()["model_version_status"]
    assert status == [{"version": version, "state": "AVAILABLE",
                       "status": {"error_code": "OK", "error_message": ""}}]
    assert client.get(f"{URL}/versions/{version}").status_code == 200
    meta = client.get(f"{URL}/versions/{version}/metadata").json()
    sigs = meta["metadata"]["signature_def"]["signature_def"]
    assert sorted(sigs) == ["classify", "regress", "serving_default"]
    assert sigs["classify"]["method_name"] == "tensorflow/serving/classify"
    assert sigs["serving_default"]["inputs"]["x"]["dtype"] == "DT_FLOAT"
    assert [d["size"] for d in sigs["serving_default"]["inputs"]["x"]["tensor_shape"]["dim"]] == ["-1", "4"]
    r = client.post(f"{URL}/versions/{version}:predict", json={"instances": [[0, 0, 0, 0]]})
    assert r.status_code == 200
    r = client.post(f"{URL}/versions/1:predict", json={"instances": [[0, 0, 0, 0]]})
    assert r.status_code == 404 and "Specific(mlp, 1)" in r.json()["error"]


def test_classify_and_regress(client):
    x = tm.X[:3]
    body = {"signature_name": "classify", "examples": [{"x": r} for r in x.tolist()]}
    results = client.post(URL + ":classify", json=body).json()["results"]
    logits = np.asarray(client.post(URL + ":predict", json={"instances": x.tolist()}).json()["predictions"][0]["logits"])
    assert len(results) == 3 and len(results[0]) == 3
    scores = np.exp(logits) / np.exp(logits).sum()
    np.testing.assert_allclose([s for _, s in results[0]], scores, rtol=1e-4)
    reg = client.post(URL + ":regress", json={"signature_name": "regress", "context": {},
                                               "examples": [{"x": r} for r in x.tolist()]})
    assert reg.status_code == 200
    np.testing.assert_allclose(reg.json()["results"][0], scores[1], rtol=1e-4)


P = URL + ":predict"


@pytest.mark.parametrize(
    "method, path, kwargs, status, match",
    [
        ("post", P, {"content": b"{not json"}, 400, "JSON Parse error"),
        ("post", P, {"json": [1, 2]}, 400, "JSON object"),
        ("post", P, {"json": {}}, 400, "exactly one of 'instances'"),
        ("post", P, {"json": {"instances": [[0] * 4], "inputs": [[0] * 4]}}, 400, "exactly one of"),
        ("post", P, {"json": {"instances": []}}, 400, "non-empty"),
        ("post", P, {"json": {"instances": [{"y": [0] * 4}]}}, 400, r"inputs \['y'\]"),
        ("post", P, {"json": {"inputs": {"y": [[0] * 4]}}}, 400, r"missing=\['x'\], unknown=\['y'\]"),
        ("post", P, {"json": {"instances": [[0, 0, 0]]}}, 400, "must have shape"),
        ("post", P, {"json": {"instances": [[0, 0, 0, 0], [0, 0]]}}, 400, "rectangular|shape"),
        ("post", P, {"json": {"instances": [["a", "b", "c", "d"]]}}, 400, "numeric"),
        ("post", P, {"json": {"instances": [[True, False, True, False]]}}, 400, "dtype float32"),
        ("post", P, {"json": {"instances": [{"b64": "AAAA"}]}}, 400, "b64"),
        ("post", P, {"json": {"signature_name": "nope", "instances": [[0] * 4]}}, 400, "not found in signature def"),
        ("post", URL + ":classify", {"json": {"examples": [{"x": [0] * 4}]}}, 400, "method_name"),
        ("post", URL + ":classify", {"json": {"signature_name": "classify"}}, 400, "'examples'"),
        ("post", URL + ":regress", {"json": {"signature_name": "regress", "examples": [[0] * 4]}}, 400, "JSON object"),
        ("post", "/v1/models/other:predict", {"json": {"instances": [[0] * 4]}}, 404, "Servable not found"),
        ("post", URL + ":explode", {"json": {}}, 404, "unknown method"),
        ("post", URL + "/versions/abc:predict", {"json": {}}, 400, "Malformed version"),
        ("get", P, {}, 405, "POST"),
        ("post", P, {"content": b"[" + b"0," * (1 << 20) + b"0]"}, 413, "exceeds the limit"),
    ],
)
def test_bad_requests_get_tf_serving_errors(client, method, path, kwargs, status, match):
    r = getattr(client, method)(path, **kwargs)
    assert r.status_code == status, r.text
    assert set(r.json()) == {"error"}
    assert re.search(match, r.json()["error"]), r.json()["error"]
    ok = client.post(P, json={"instances": [[0, 0, 0, 0]]})  # the server keeps serving
    assert ok.status_code == 200


def test_dynamic_batching_merges_and_never_compiles_new_shapes(client, server):
    loaded = server.store.current
    before = loaded.batchers["serving_default"].batches_run
    sizes = [1, 3, 5, 7, 2, 6, 1, 4] * 4

    def one(i):
        n = sizes[i]
        x = tm.X[i : i + n]
        r = client.post(P, json={"instances": x.tolist()})
        assert r.status_code == 200, r.text
        return x, r.json()["predictions"]

    with count_compiles() as compiles:  # the server compiled its batch sizes when it loaded
        with cf.ThreadPoolExecutor(16) as ex:
            results = list(ex.map(one, range(len(sizes))))
    assert compiles.count == 0, compiles.names  # padding: no new shapes
    ref = __import__("tpu_estimator").load_exported(
        os.path.join(server.store.base, str(loaded.version))).signatures["serving_default"]
    for x, preds in results:
        np.testing.assert_allclose([p["logits"] for p in preds], ref(x=x)["logits"], rtol=1e-5, atol=1e-5)
    batches = loaded.batchers["serving_default"].batches_run - before
    assert batches < len(sizes)  # requests were merged


def test_batching_off_serves_one_request_per_call(export_base):
    store = ModelStore(export_base, enable_batching=False, poll_seconds=0)
    with ServerThread(store, MODEL) as s, httpx.Client(base_url=s.url, timeout=60) as c:
        r = c.post(P, json={"instances": tm.X[:3].tolist()})
        assert r.status_code == 200 and len(r.json()["predictions"]) == 3
        assert store.current.batchers == {}


def test_hot_reload_without_dropping_requests(trained_est, tmp_path):
    base = tmp_path / "hot"
    trained_est.export_saved_model(str(base), tm.receiver_fn)
    store = ModelStore(str(base), poll_seconds=0.1)
    codes, stop = [], threading.Event()
    with ServerThread(store, MODEL) as s, httpx.Client(base_url=s.url, timeout=60) as c:
        first = store.current.version

        def hammer():
            while not stop.is_set():
                codes.append(c.post(P, json={"instances": [[1, 2, 3, 4]]}).status_code)

        workers = [threading.Thread(target=hammer) for _ in range(4)]
        for w in workers:
            w.start()
        try:
            new = int(os.fsdecode(trained_est.export_saved_model(str(base), tm.receiver_fn)).split("/")[-1])
            deadline = time.monotonic() + 60
            while store.current.version != new and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.3)
        finally:
            stop.set()
            for w in workers:
                w.join(timeout=30)
        assert new > first and store.current.version == new
        assert c.get(URL).json()["model_version_status"][0]["version"] == str(new)
    assert codes and set(codes) == {200}


def test_api_v2_batching_settings_are_served(trained_est, tmp_path):
    est = tm.estimator(trained_est.model_dir, fn=tm.model_fn_v2, export_saved_model_api_version=2)
    est.export_saved_model(str(tmp_path), tm.receiver_fn)
    store = ModelStore(str(tmp_path), poll_seconds=0)
    with ServerThread(store, MODEL) as s, httpx.Client(base_url=s.url, timeout=60) as c:
        batching = c.get(URL + "/metadata").json()["metadata"]["batching"]
        assert batching["max_batch_size"] == 8 and batching["allowed_batch_sizes"] == [2, 4, 8]
        assert batching["num_batch_threads"] == 2
        r = c.post(P, json={"instances": tm.X[:11].tolist()})  # > max_batch_size: split
        expected = tm.expected_predictions(trained_est)["logits"][:11]
        np.testing.assert_allclose([p["logits"] for p in r.json()["predictions"]], expected, rtol=1e-5, atol=1e-5)


def test_cli_serves_in_a_subprocess(export_base, tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=tm._ROOT)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tpu_estimator.serving.cli", "serve", export_base, "--model_name", MODEL,
         "--rest_api_port", str(port), "--port", "0", "--poll_seconds", "0", "--log_level", "warning"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    try:
        deadline, status = time.monotonic() + 90, None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                status = httpx.get(f"http://127.0.0.1:{port}{URL}", timeout=5)
                break
            except httpx.TransportError:
                time.sleep(0.2)
        assert status is not None and status.status_code == 200, proc.stdout.read1().decode() if proc.poll() else ""
        r = httpx.post(f"http://127.0.0.1:{port}{P}", json={"instances": [[0, 0, 0, 0]]}, timeout=30)
        assert r.status_code == 200
    finally:
        proc.kill()
        proc.wait(timeout=30)
