"""Prometheus metrics (--monitoring_config_file), KServe's health probes, and the CLI serving
REST, gRPC and metrics at once: read with a real HTTP client, prometheus_client's parser and
TF Serving's gRPC stubs."""

import os
import shutil
import socket
import subprocess
import sys
import time

import grpc
import httpx
import pytest
import tensorflow as tf
from prometheus_client.parser import text_string_to_metric_families
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

import export_test_model as tm
from tests.serving.conftest import MODEL
from tpu_estimator.serving.grpc_server import GrpcServer
from tpu_estimator.serving.metrics import DEFAULT_PATH, ServingMetrics, read_monitoring_config
from tpu_estimator.serving.model_store import ModelStore
from tpu_estimator.serving.server import ServerThread

PATH = "/monitoring/prometheus/metrics"


def _config(tmp_path, text):
    path = tmp_path / "monitoring.config"
    path.write_text(text)
    return str(path)


def test_monitoring_config_in_tf_servings_text_format(tmp_path):
    assert read_monitoring_config(_config(tmp_path, 'prometheus_config {\n enable: true,\n path: "/m/x"\n}')) == "/m/x"
    assert read_monitoring_config(_config(tmp_path, "prometheus_config { enable: true }")) == DEFAULT_PATH
    assert read_monitoring_config(_config(tmp_path, "prometheus_config { enable: false }")) is None
    with pytest.raises(ValueError, match=r"--monitoring_config_file=.* is not a MonitoringConfig in text format.*"
                                         r"prometheus_config \{ enable: true"):
        read_monitoring_config(_config(tmp_path, "prometheus { enable: true }"))
    with pytest.raises(ValueError, match=r"prometheus_config.path must start with '/'.*Received: path='metrics'"):
        read_monitoring_config(_config(tmp_path, 'prometheus_config { enable: true path: "metrics" }'))
    with pytest.raises(ValueError, match=r"--monitoring_config_file=.*missing.config.* cannot be read"):
        read_monitoring_config(str(tmp_path / "missing.config"))


def _families(text):
    return {f.name: f for f in text_string_to_metric_families(text)}


def _predict(target, rows=2, name="x"):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = MODEL
    request.inputs[name].CopyFrom(tf.make_tensor_proto(tm.X[:rows]))
    with grpc.insecure_channel(target) as channel:
        return prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=60)


def test_metrics_count_rest_and_grpc_requests_batches_and_loads(export_base):
    metrics = ServingMetrics()
    store = ModelStore(export_base, poll_seconds=0, events=metrics)
    metrics.queue_rows = store.queued_rows
    with ServerThread(store, MODEL, metrics=metrics, metrics_path=PATH) as rest, \
            GrpcServer(store, MODEL, metrics=metrics) as g, httpx.Client(base_url=rest.url, timeout=60) as http:
        assert http.post(f"/v1/models/{MODEL}:predict", json={"instances": tm.X[:3].tolist()}).status_code == 200
        assert http.post(f"/v1/models/{MODEL}:predict", json={"instances": [[1.0]]}).status_code == 400
        assert http.get("/v1/models/other").status_code == 404
        version = store.current.version
        _predict(g.target)
        with pytest.raises(grpc.RpcError):
            _predict(g.target, name="y")
        scrape = http.get(PATH)
    assert scrape.status_code == 200 and scrape.headers["content-type"].startswith("text/plain")
    families = _families(scrape.text)
    counts = {(s.labels["entrypoint"], s.labels["API"], s.labels["status"]): s.value
              for s in families[":tensorflow:serving:request_count"].samples}
    assert counts == {("REST", "predict", "OK"): 1, ("REST", "predict", "INVALID_ARGUMENT"): 1,
                      ("REST", "get_model_status", "NOT_FOUND"): 1, ("GRPC", "predict", "OK"): 1,
                      ("GRPC", "predict", "INVALID_ARGUMENT"): 1}
    latency = {s.labels["entrypoint"]: s.value for s in families[":tensorflow:serving:request_latency"].samples
               if s.name.endswith("_count") and s.labels["API"] == "predict"}
    assert latency == {"REST": 2, "GRPC": 2}
    batches = [s for s in families[":tensorflow:serving:batching:processed_batch_size"].samples
               if s.name.endswith("_count")]
    rows = [s for s in families[":tensorflow:serving:batching:processed_batch_size"].samples
            if s.name.endswith("_sum")]
    assert batches[0].value >= 1 and rows[0].value == 5  # 3 REST rows + 2 gRPC rows, batched
    loads = families[":tensorflow:cc:saved_model:load_attempt_count"].samples
    assert [(s.labels["status"], s.value) for s in loads] == [("success", 1)]
    assert loads[0].labels["model_path"] == os.path.join(export_base, str(version))
    assert families[":tensorflow:serving:batching:queue_rows"].samples[0].value == 0


def test_health_probes_turn_ready_when_a_version_is_available(export_base, tmp_path):
    base = tmp_path / "exports"
    base.mkdir()
    store = ModelStore(str(base), poll_seconds=0)
    with ServerThread(store, MODEL) as s, httpx.Client(base_url=s.url, timeout=60) as http:
        assert http.get("/v2/health/live").status_code == 200
        not_ready = http.get("/v2/health/ready")
        assert not_ready.status_code == 503 and not_ready.json() == {"ready": False}
        version = os.listdir(export_base)[0]
        shutil.copytree(os.path.join(export_base, version), base / version)
        store.reload()
        assert http.get("/v2/health/ready").status_code == 200
        status = http.get(f"/v1/models/{MODEL}")
        assert status.status_code == 200 and status.json()["model_version_status"][0]["state"] == "AVAILABLE"
        assert http.get(PATH).status_code == 404  # no monitoring config: no metrics route


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_cli_serves_grpc_rest_and_metrics(export_base, tmp_path):
    rest_port, grpc_port = _free_port(), _free_port()
    config = _config(tmp_path, f'prometheus_config {{ enable: true path: "{PATH}" }}')
    proc = subprocess.Popen(
        [sys.executable, "-m", "tpu_estimator.serving.cli", "serve", f"--model_base_path={export_base}",
         f"--model_name={MODEL}", f"--port={grpc_port}", f"--rest_api_port={rest_port}",
         f"--monitoring_config_file={config}", "--file_system_poll_wait_seconds=0", "--log_level=warning"],
        cwd=tmp_path, env=dict(os.environ, PYTHONPATH=tm._ROOT), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{rest_port}"
    try:
        deadline, ready = time.monotonic() + 90, None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                ready = httpx.get(base + "/v2/health/ready", timeout=5)
                if ready.status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        assert ready is not None and ready.status_code == 200, proc.stdout.read1().decode() if proc.poll() else ""
        response = _predict(f"127.0.0.1:{grpc_port}", rows=4)
        assert tf.make_ndarray(response.outputs["logits"]).shape == (4, 3)
        families = _families(httpx.get(base + PATH, timeout=30).text)
        [sample] = families[":tensorflow:serving:request_count"].samples
        assert (sample.labels["entrypoint"], sample.labels["status"], sample.value) == ("GRPC", "OK", 1)
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_cli_refuses_a_bad_monitoring_config_before_loading(export_base, tmp_path):
    config = _config(tmp_path, "prometheus_config { enable: yes please }")
    proc = subprocess.run(
        [sys.executable, "-m", "tpu_estimator.serving.cli", "serve", f"--model_base_path={export_base}",
         "--port=0", "--rest_api_port=0", f"--monitoring_config_file={config}"],
        env=dict(os.environ, PYTHONPATH=tm._ROOT), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--port (gRPC) or --rest_api_port (REST) must be non-zero" in proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "tpu_estimator.serving.cli", "serve", f"--model_base_path={export_base}",
         "--port=0", f"--monitoring_config_file={config}"],
        env=dict(os.environ, PYTHONPATH=tm._ROOT), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "is not a MonitoringConfig in text format" in proc.stderr


def test_a_taken_grpc_port_is_an_error_naming_the_flag(export_base):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError, match=r"Cannot listen for gRPC on 127.0.0.1:\d+ \(--port\).*Pick another --port"):
            GrpcServer(ModelStore(export_base, poll_seconds=0), MODEL, port=taken.getsockname()[1])
