"""The server under bad input and overload: never a 500, every error JSON, a bounded queue."""

import json
import math
import os
import random
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
from tpu_estimator.api.export_output import DEFAULT_SERVING_SIGNATURE_DEF_KEY as DEFAULT_SIGNATURE
from tpu_estimator.serving import cli
from tpu_estimator.serving.batcher import Batcher, BatchingOptions, Gate, QueueFull
from tpu_estimator.serving.model_store import ModelStore
from tpu_estimator.serving.server import ServerThread

URL = f"/v1/models/{MODEL}"
P = URL + ":predict"
VALID = json.dumps({"instances": [[1.0, 2.0, 3.0, 4.0], [0.5, 0.5, 0.5, 0.5]]}).encode()


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def _fuzz_bodies() -> list[bytes]:
    bodies = [
        b"", b"{", b"}", b"null", b"[]", b"123", b'"x"', b"{}", b"\xff\xfe\x00", b"{\"instances\": }",
        b"[" * 100_000 + b"]" * 100_000,  # deeper than the parser's recursion limit
        b'{"instances": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        b'{"instances": ' + b"[" * 60 + b"1" + b"]" * 60 + b"}",  # deeper than numpy's 32/64 dims
        b'{"instances": ' + b"[" * 950 + b"1" + b"]" * 950 + b"}",  # just within the parser's limit
        b'{"inputs": ' + b'{"x": ' * 900 + b"1" + b"}" * 900 + b"}",
        b'{"instances": [{"x": ' + b'[{"b64": ' * 400 + b'"AAAA"' + b"}]" * 400 + b"}]}",
        b'{"instances": [[' + b"9" * 5000 + b", 1, 2, 3]]}",  # an int of 5000 digits
        b'{"instances": [[1e400, -1e400, 1e-400, 3]]}',
        b'{"instances": [[NaN, Infinity, -Infinity, 0]]}',
        b'{"instances": [[18446744073709551616, 1, 2, 3]]}',
        b'{"instances": []}', b'{"instances": [[]]}', b'{"instances": [{}]}', b'{"instances": [null]}',
        b'{"instances": {"x": [[1, 2, 3, 4]]}}', b'{"instances": "abc"}', b'{"instances": [[1, 2, 3]]}',
        b'{"instances": [[1, 2, 3, 4], [1, 2]]}', b'{"instances": [[[1, 2, 3, 4]]]}',
        b'{"instances": [["a", "b", "c", "d"]]}', b'{"instances": [[true, false, true, false]]}',
        b'{"instances": [{"x": [1, 2, 3, 4]}, [1, 2, 3, 4]]}',  # mixed objects and bare rows
        b'{"instances": [{"x": [1, 2, 3, 4], "y": 1}]}', b'{"instances": [{"x": {"b64": "AAAA"}}]}',
        b'{"instances": [[1, 2, 3, 4]], "inputs": [[1, 2, 3, 4]]}',  # row and columnar mixed
        b'{"inputs": []}', b'{"inputs": {}}', b'{"inputs": {"x": 5}}', b'{"inputs": {"x": null}}',
        b'{"inputs": {"x": [[1, 2, 3, 4]], "y": [1]}}', b'{"inputs": [[{"x": 1}]]}',
        b'{"signature_name": 5, "instances": [[1, 2, 3, 4]]}', b'{"signature_name": null, "inputs": [[1, 2, 3, 4]]}',
        b'{"signature_name": "classify", "examples": 5}', b'{"examples": [{"x": "abc"}], "context": []}',
        b'{"examples": [], "context": {"x": [1, 2, 3, 4]}}', b'{"examples": [null, 1, "a"]}',
        b'{"examples": [{"x": [1, 2, 3, 4]}], "context": {"x": [1, 2, 3, 4]}}',
        '{"instances": [["é", 1, 2, 3]]}'.encode("utf-16"),
    ]
    rng = random.Random(0)
    for _ in range(12):  # valid bodies cut short, and bytes flipped
        bodies.append(VALID[: rng.randrange(1, len(VALID))])
        flipped = bytearray(VALID)
        flipped[rng.randrange(len(flipped))] = rng.randrange(256)
        bodies.append(bytes(flipped))
    return bodies


@pytest.mark.parametrize("verb", ["predict", "classify", "regress"])
def test_fuzzed_bodies_never_get_a_500_and_errors_are_json(client, verb):
    for body in _fuzz_bodies():
        r = client.post(f"{URL}:{verb}", content=body, headers={"content-type": "application/json"})
        assert r.status_code < 500, (body[:80], r.status_code, r.text[:300])
        assert r.headers["content-type"] == "application/json"
        payload = json.loads(r.content)  # NaN/Infinity tokens included
        if r.status_code != 200:
            assert set(payload) == {"error"} and payload["error"], (body[:80], payload)
    assert client.post(P, content=VALID).status_code == 200  # still serving


def test_nan_and_infinity_are_read_and_written_as_tf_serving_does(client):
    r = client.post(P, content=b'{"instances": [[NaN, 1, 2, 3], [1e400, 0, 0, 0], [-Infinity, 0, 0, 0]]}')
    assert r.status_code == 200, r.text
    assert b"NaN" in r.content  # bare tokens, as TF Serving writes them
    logits = [p["logits"] for p in r.json()["predictions"]]
    assert all(math.isnan(v) for v in logits[0])
    cols = client.post(P, content=b'{"inputs": {"x": [[Infinity, 1, 2, 3]]}}')
    assert cols.status_code == 200 and not np.isfinite(cols.json()["outputs"]["logits"]).all()
    classify = client.post(URL + ":classify",
                           content=b'{"signature_name": "classify", "examples": [{"x": [NaN, 1, 2, 3]}]}')
    assert classify.status_code == 200 and math.isnan(classify.json()["results"][0][0][1])


@pytest.mark.parametrize(
    "method, path, status, match, allow",
    [
        ("GET", "/", 404, r"Malformed request: GET /; the API is under /v1/models/mlp", None),
        ("GET", "/v2/models/mlp", 404, "the API is under", None),
        ("POST", "/v1/models/other:predict", 404, r"Servable not found for request: Latest\(other\)", None),
        ("GET", URL + "/versions/7", 404, "Could not find version 7 of model mlp", None),
        ("GET", URL + "/versions/7/metadata", 404, r"Specific\(mlp, 7\)", None),
        ("GET", URL + "/labels", 404, "Malformed request", None),
        ("PUT", P, 405, ":predict needs a POST request", "POST"),
        ("DELETE", URL, 405, "Malformed request: DELETE /v1/models/mlp; use GET", "GET"),
        ("POST", URL + "/metadata", 405, "use GET", "GET"),
        ("BREW", URL, 405, "Method Not Allowed: BREW /v1/models/mlp", None),
    ],
)
def test_unknown_urls_and_wrong_methods_get_json(client, method, path, status, match, allow):
    r = client.request(method, path)
    assert r.status_code == status, r.text
    assert set(r.json()) == {"error"} and re.search(match, r.json()["error"]), r.json()
    if allow:
        assert r.headers["allow"] == allow


def _raw(server, head: bytes) -> tuple[int, dict]:
    """Sends raw request bytes (httpx refuses a false Content-Length); (status, JSON body)."""
    with socket.create_connection((server.host, server.port), timeout=30) as s:
        s.sendall(head)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
            if b"\r\n\r\n" in data:
                head_part, _, body = data.partition(b"\r\n\r\n")
                length = re.search(rb"content-length: (\d+)", head_part, re.I)
                if length and len(body) >= int(length[1]):
                    break
    head_part, _, body = data.partition(b"\r\n\r\n")
    assert re.search(rb"content-type: application/json", head_part, re.I), data[:300]
    return int(head_part.split()[1]), json.loads(body)


def test_oversized_and_unparsable_content_length_get_json(server):
    req = f"POST {P} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n".encode()
    status, body = _raw(server, req + b"Content-Length: 1000000000000\r\n\r\n{")
    assert status == 413 and "exceeds the limit of 1048576 bytes (--max_body_bytes)" in body["error"]
    status, body = _raw(server, req + b"Content-Length: " + b"9" * 30 + b"\r\n\r\n{")
    assert status == 400 and body["error"].startswith("Malformed HTTP request")
    status, body = _raw(server, req + b"Content-Length: abc\r\n\r\n{")
    assert status == 400 and body["error"].startswith("Malformed HTTP request")
    status, body = _raw(server, b"GET /nope HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000000\r\n\r\n")
    assert status == 413


# --- the bounded queue ---------------------------------------------------------------


def test_batcher_queue_is_bounded_and_refuses_whole_requests():
    gate = threading.Event()

    def run(inputs):
        gate.wait(10)
        return {"y": inputs["x"]}

    opts = BatchingOptions.create(max_batch_size=2, batch_timeout_micros=0, max_enqueued_batches=2)
    b = Batcher(run, opts)
    x = np.ones((1, 1), np.float32)
    first = b.submit({"x": x}, 1)  # taken by the worker, which blocks in run()
    deadline = time.monotonic() + 10
    while b.waiting_rows and time.monotonic() < deadline:
        time.sleep(0.01)
    queued = [b.submit({"x": x}, 1) for _ in range(4)]  # 2 batches of 2 rows wait
    assert b.waiting_rows == 4
    with pytest.raises(QueueFull, match=r"at most max_enqueued_batches=2 batches of 2 rows may wait\. "
                                        r"Received: a request of 1 rows with the queue full\. Retry later\."):
        b.submit({"x": x}, 1)
    assert b.waiting_rows == 4  # nothing of the refused request was queued
    gate.set()
    for f in first + [f for fs in queued for f in fs]:
        assert f.result(10)["y"].shape == (1, 1)
    assert b.waiting_rows == 0
    b.submit({"x": np.ones((9, 1), np.float32)}, 9)  # an empty queue takes a request of any size
    b.close()


def test_gate_bounds_unbatched_calls():
    opts = BatchingOptions.create(max_enqueued_batches=2)
    g = Gate(2)
    g.enter(1, opts)
    g.enter(1, opts)
    with pytest.raises(QueueFull, match="max_enqueued_batches=2"):
        g.enter(1, opts)
    g.leave()
    g.enter(1, opts)


def test_max_enqueued_batches_must_be_positive():
    with pytest.raises(ValueError, match=r"`max_enqueued_batches` must be a positive int\. "
                                         r"Received: max_enqueued_batches=0"):
        BatchingOptions.create(max_enqueued_batches=0)
    assert BatchingOptions.create().max_enqueued_batches == 10


def test_full_queue_answers_503_with_retry_after(export_base):
    store = ModelStore(export_base, poll_seconds=0, batching_flags={
        "max_batch_size": 1, "batch_timeout_micros": 0, "max_enqueued_batches": 2})
    big = {"instances": np.zeros((3000, 4)).tolist()}  # 3000 one-row batches: seconds of work
    with ServerThread(store, MODEL) as s, httpx.Client(base_url=s.url, timeout=120) as c:
        result = {}
        t = threading.Thread(target=lambda: result.update(r=c.post(P, json=big)))
        t.start()
        # small requests only once the big one is queued: one queued before it would refuse it
        batcher = store.current.batchers[DEFAULT_SIGNATURE]
        deadline = time.monotonic() + 60
        while batcher.waiting_rows < 3 and t.is_alive() and time.monotonic() < deadline:
            time.sleep(0.001)
        refused = None
        while refused is None and t.is_alive() and time.monotonic() < deadline:
            r = c.post(P, json={"instances": [[0, 0, 0, 0]]})
            if r.status_code != 200:
                refused = r
        t.join(120)
        assert refused is not None, "no request was refused while 3000 rows were queued"
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert "The server is overloaded" in refused.json()["error"]
        assert result["r"].status_code == 200 and len(result["r"].json()["predictions"]) == 3000
        assert c.post(P, json={"instances": [[0, 0, 0, 0]]}).status_code == 200  # drained: serving
        assert c.get(URL + "/metadata").json()["metadata"]["batching"]["max_enqueued_batches"] == 2


# --- the command line ------------------------------------------------------------------


def test_cli_takes_tf_serving_spellings_and_the_old_ones():
    p = cli.parser()
    new = p.parse_args(["serve", "--model_base_path=/m", "--rest_api_port=9000", "--model_name=a",
                        "--max_enqueued_batches=3", "--model_version_policy=latest:2",
                        "--file_system_poll_wait_seconds=5"])
    old = p.parse_args(["serve", "/m", "--model_name", "a", "--poll_seconds", "5"])
    assert (new.model_base_path, new.port, new.max_enqueued_batches, new.model_version_policy,
            new.poll_seconds) == ("/m", 9000, 3, "latest:2", 5.0)
    assert (old.export_dir_base, old.poll_seconds) == ("/m", 5.0)
    # TF Serving's meanings and defaults: --port is gRPC's (8500), --rest_api_port REST's (8501)
    assert (old.grpc_port, old.port) == (8500, 8501)
    assert p.parse_args(["serve", "/m", "--port", "9000"]).grpc_port == 9000


@pytest.mark.parametrize(
    "argv, match",
    [
        (["serve"], r"One export directory: --model_base_path DIR .* Received: --model_base_path=None"),
        (["serve", "/a", "--model_base_path", "/b"], r"Received: --model_base_path='/b', EXPORT_DIR_BASE='/a'"),
    ],
)
def test_cli_needs_one_base_path(argv, match, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2 and re.search(match, capsys.readouterr().err)


@pytest.mark.parametrize(
    "flags, match",
    [
        (["--max_enqueued_batches", "0"], r"`max_enqueued_batches` must be a positive int\. Received: max_enqueued_batches=0"),
        (["--model_version_policy", "newest:2"], r"Received: model_version_policy='newest:2'\. Use 'latest'"),
        (["--max_batch_size", "0"], r"`max_batch_size` must be an int >= 1"),
    ],
)
def test_cli_refuses_bad_flags_before_serving(tmp_path, flags, match, capsys):
    assert cli.main(["serve", "--model_base_path", str(tmp_path), *flags]) == 2
    assert re.search(match, capsys.readouterr().err)


def test_cli_with_tf_serving_flags_in_a_subprocess(export_base, tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tpu_estimator.serving.cli", "serve", f"--model_base_path={export_base}",
         f"--model_name={MODEL}", f"--rest_api_port={port}", "--port=0", "--file_system_poll_wait_seconds=0",
         "--max_enqueued_batches=4", "--model_version_policy=latest:1", "--log_level=warning"],
        cwd=tmp_path, env=dict(os.environ, PYTHONPATH=tm._ROOT), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline, status = time.monotonic() + 90, None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                status = httpx.get(base + URL, timeout=5)
                break
            except httpx.TransportError:
                time.sleep(0.2)
        out = proc.stdout.read1().decode() if proc.poll() is not None else ""
        assert status is not None and status.status_code == 200, out
        assert status.json()["model_version_status"][0]["state"] == "AVAILABLE"
        nan = httpx.post(base + P, content=b'{"instances": [[NaN, 0, 0, 0]]}', timeout=30)
        assert nan.status_code == 200 and b"NaN" in nan.content
        missing = httpx.get(base + "/nowhere", timeout=30)
        assert missing.status_code == 404 and "error" in missing.json()
    finally:
        proc.kill()
        proc.wait(timeout=30)
