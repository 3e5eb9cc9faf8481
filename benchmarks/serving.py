"""Loopback load test of `tpu-estimator serve`: REST vs gRPC, dynamic batching vs batch-size-1 serving.

Trains a small MLP for a few steps, exports it, then for each batching mode
starts the server as a subprocess on 127.0.0.1 (REST and gRPC ports), and
for each protocol (REST `:predict` row format; gRPC `PredictionService/Predict`
with a TensorProto in tensor_content) and each client count (1 and 16 by
default) runs concurrent closed-loop clients sending one-example requests
for a bounded number of requests, checks every response against the
exported model run locally, and prints requests/sec and p50/p99 latency.
The server is always shut down.

The overload run (`--run overload`) starts a server with a small queue
(`--max_enqueued_batches 2`, `--max_batch_size 16`) and more closed-loop
clients than it can serve (64 by default, each sending 8-row requests without
backing off), for a bounded time and number of requests. It reports the status
codes (no 5xx other than 503 may occur), the latency of the accepted requests
(p50/p99/max: bounded because the queue is), every accepted response checked,
and the server process's RSS sampled each second (from /proc: flat means no
pile-up or leak).

Usage: .venv/bin/python benchmarks/serving.py [--run all|compare|overload]
       [--requests_per_client 150] [--clients 1,16] [--protocols rest,grpc]
       [--overload_seconds 120] [--overload_clients 64]
(the soak run with hot reloads is benchmarks/serving_soak.py)
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

import flax.linen as nn
import grpc
import httpx
import numpy as np
import optax

import tpu_estimator as te
from tpu_estimator.serving import tf_serving_proto as pb
from tpu_estimator.serving.tensor_proto import from_array, to_array

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
DIM, HIDDEN, CLASSES = 256, 2048, 10


def model_fn(features, labels, mode, params):
    x = features["x"]
    for i in range(3):
        x = nn.relu(nn.Dense(HIDDEN, name=f"hidden_{i}")(x))
    logits = nn.Dense(CLASSES, name="logits")(x)
    if mode == te.ModeKeys.PREDICT:
        return te.TPUEstimatorSpec(mode, predictions={"probabilities": nn.softmax(logits)})
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    return te.TPUEstimatorSpec(mode, loss=loss, train_op=optax.adam(1e-3))


def export(workdir: str) -> str:
    rng = np.random.RandomState(0)
    x = rng.randn(256, DIM).astype(np.float32)
    y = rng.randint(0, CLASSES, 256).astype(np.int32)

    def input_fn(params):
        bs = params["batch_size"]
        for i in range(0, 256, bs):
            yield {"x": x[i : i + bs]}, y[i : i + bs]

    est = te.TPUEstimator(model_fn, config=te.RunConfig(model_dir=os.path.join(workdir, "model")),
                          use_tpu=False, train_batch_size=32)
    est.train(input_fn, max_steps=8)
    base = os.path.join(workdir, "export")
    est.export_saved_model(base, te.build_raw_serving_input_receiver_fn({"x": x}))
    return base


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclasses.dataclass(frozen=True)
class Server:
    url: str  # the REST model URL
    target: str  # the gRPC host:port
    pid: int
    root: str  # the REST root (probes, metrics)


@contextlib.contextmanager
def serving(base: str, flags: list[str], poll_seconds: float = 0):
    """A `tpu-estimator serve` subprocess on 127.0.0.1 (REST and gRPC): yields a `Server`."""
    port, grpc_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}/v1/models/bench"
    with tempfile.TemporaryFile() as log:  # a file, not a pipe: a full pipe would block the server
        proc = subprocess.Popen(
            [sys.executable, "-m", "tpu_estimator.serving.cli", "serve", f"--model_base_path={base}",
             "--model_name=bench", f"--rest_api_port={port}", f"--port={grpc_port}",
             f"--file_system_poll_wait_seconds={poll_seconds}", "--log_level=warning", *flags],
            env=dict(os.environ, PYTHONPATH=ROOT), stdout=subprocess.DEVNULL, stderr=log,
        )
        try:
            deadline = time.monotonic() + 120
            while True:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise RuntimeError(f"server did not start: {log.read().decode()[-2000:]}")
                try:
                    if httpx.get(url, timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.1)
            yield Server(url, f"127.0.0.1:{grpc_port}", proc.pid, f"http://127.0.0.1:{port}")
        finally:
            proc.kill()
            proc.wait(timeout=30)


def run_mode(base: str, label: str, flags: list[str], args: argparse.Namespace) -> list[dict]:
    """One server; each protocol at each client count against it."""
    results = []
    with serving(base, flags) as server:
        for protocol in args.protocols:
            for clients in args.clients:
                results.append(load_test(server, f"{protocol} {label}", args, protocol=protocol, clients=clients))
    return results


class RestClient:
    """One client's connection: `predict(x)` -> (ok, probabilities or error text)."""

    def __init__(self, server: Server) -> None:
        self._http = httpx.Client(timeout=30)
        self._url = server.url + ":predict"

    def predict(self, x: np.ndarray) -> tuple[bool, object]:
        r = self._http.post(self._url, json={"instances": x.tolist()})
        if r.status_code != 200:
            return False, f"{r.status_code}: {r.text[:200]}"
        return True, np.asarray(r.json()["predictions"])

    def close(self) -> None:
        self._http.close()


class GrpcClient:
    """TF Serving's PredictionService/Predict on one channel (wire-identical to its stubs)."""

    def __init__(self, server: Server) -> None:
        self._channel = grpc.insecure_channel(server.target)
        self._predict = self._channel.unary_unary(
            "/tensorflow.serving.PredictionService/Predict",
            request_serializer=lambda m: m.SerializeToString(), response_deserializer=pb.PredictResponse.FromString)

    def predict(self, x: np.ndarray) -> tuple[bool, object]:
        request = pb.PredictRequest()
        request.model_spec.name = "bench"
        request.inputs["x"].CopyFrom(from_array(x))
        try:
            response = self._predict(request, timeout=30)
        except grpc.RpcError as e:
            return False, f"{e.code().name}: {e.details()[:200]}"
        return True, to_array(response.outputs["probabilities"], "probabilities")

    def close(self) -> None:
        self._channel.close()


CLIENTS = {"rest": RestClient, "grpc": GrpcClient}


def load_test(server: Server, label: str, args: argparse.Namespace, *, protocol: str = "rest",
              clients: int = 16) -> dict:
    model = te.load_exported(os.path.join(args.base, os.listdir(args.base)[0]))
    rng = np.random.RandomState(1)
    inputs = rng.randn(clients, args.requests_per_client, DIM).astype(np.float32)
    expected = model.signatures["serving_default"](x=inputs.reshape(-1, DIM))["probabilities"]
    expected = expected.reshape(clients, args.requests_per_client, CLASSES)
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + args.time_limit

    def client(c: int) -> None:
        mine = []
        conn = CLIENTS[protocol](server)
        try:
            for i in range(args.requests_per_client):
                if time.monotonic() > stop_at:
                    break
                t0 = time.perf_counter()
                ok, got = conn.predict(inputs[c, i : i + 1])
                mine.append(time.perf_counter() - t0)
                if not ok:
                    errors.append(str(got))
                elif not np.allclose(got[0], expected[c, i], rtol=1e-4, atol=1e-5):
                    errors.append(f"client {c} request {i}: wrong prediction")
        finally:
            conn.close()
        with lock:
            latencies.extend(mine)

    warm = CLIENTS[protocol](server)  # warm-up (connections, first calls)
    for _ in range(5):
        warm.predict(inputs[0, :1])
    warm.close()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    lat = np.asarray(latencies) * 1e3
    result = {"mode": label, "clients": clients, "requests": len(lat), "rps": len(lat) / wall,
              "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)),
              "errors": len(errors)}
    if errors:
        print(f"[{label}] first errors: {errors[:3]}", file=sys.stderr)
    return result


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


OVERLOAD_FLAGS = ["--enable_batching=true", "--max_batch_size=16", "--batch_timeout_micros=2000",
                  "--max_enqueued_batches=2"]


def overload(base: str, args: argparse.Namespace) -> dict:
    """More clients than capacity, none backing off; bounded in time and requests."""
    model = te.load_exported(os.path.join(base, os.listdir(base)[0]))
    rng = np.random.RandomState(2)
    inputs = rng.randn(args.overload_clients, args.overload_rows, DIM).astype(np.float32)
    expected = model.signatures["serving_default"](x=inputs.reshape(-1, DIM))["probabilities"]
    expected = expected.reshape(args.overload_clients, args.overload_rows, CLASSES)
    bodies = [json.dumps({"instances": x.tolist()}).encode() for x in inputs]
    codes: collections.Counter = collections.Counter()
    accepted: list[float] = []
    refused: list[float] = []
    wrong: list[str] = []
    lock = threading.Lock()
    sent = [0]
    with serving(base, OVERLOAD_FLAGS) as server:
        url, pid = server.url, server.pid
        stop_at = time.monotonic() + args.overload_seconds
        stop = threading.Event()

        def client(c: int) -> None:
            with httpx.Client(timeout=60, headers={"content-type": "application/json"}) as http:
                while not stop.is_set() and time.monotonic() < stop_at:
                    with lock:
                        if sent[0] >= args.overload_max_requests:
                            return
                        sent[0] += 1
                    t0 = time.perf_counter()
                    try:
                        r = http.post(url + ":predict", content=bodies[c])
                    except httpx.TransportError as e:
                        with lock:
                            codes[f"transport: {type(e).__name__}"] += 1
                        continue
                    dt = time.perf_counter() - t0
                    ok = r.status_code == 200 and np.allclose(
                        np.asarray(r.json()["predictions"]), expected[c], rtol=1e-4, atol=1e-5)
                    with lock:
                        codes[r.status_code] += 1
                        (accepted if r.status_code == 200 else refused).append(dt)
                        if r.status_code == 200 and not ok:
                            wrong.append(f"client {c}: wrong predictions")
                        if r.status_code == 503 and "retry-after" not in r.headers:
                            wrong.append("503 without Retry-After")

        rss: list[tuple[float, float]] = []
        threads = [threading.Thread(target=client, args=(c,)) for c in range(args.overload_clients)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            rss.append((time.monotonic() - t0, rss_mb(pid)))
            time.sleep(1.0)
        wall = time.monotonic() - t0
        for t in threads:
            t.join()
    acc = np.asarray(accepted) * 1e3
    ref = np.asarray(refused) * 1e3 if refused else np.zeros(1)
    times, mbs = np.asarray([t for t, _ in rss]), np.asarray([m for _, m in rss])
    later = times >= 0.1 * wall  # after warm-up
    slope = float(np.polyfit(times[later], mbs[later], 1)[0] * 60) if later.sum() > 2 else float("nan")
    return {
        "wall_s": wall, "codes": dict(codes), "accepted": len(acc), "refused": len(refused),
        "accepted_rps": len(acc) / wall, "rows_per_s": len(acc) * args.overload_rows / wall,
        "p50_ms": float(np.percentile(acc, 50)), "p99_ms": float(np.percentile(acc, 99)),
        "max_ms": float(acc.max()), "refused_p99_ms": float(np.percentile(ref, 99)),
        "bad_5xx": sum(n for k, n in codes.items() if isinstance(k, int) and k >= 500 and k != 503),
        "other": sum(n for k, n in codes.items() if k not in (200, 503)), "wrong": wrong,
        "rss_first_mb": float(mbs[later][0]), "rss_last_mb": float(mbs[-1]), "rss_max_mb": float(mbs.max()),
        "rss_slope_mb_per_min": slope, "rss_samples": len(mbs),
    }


def _ints(text: str) -> list[int]:
    return [int(t) for t in text.split(",")]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", choices=["all", "compare", "overload"], default="all")
    p.add_argument("--clients", type=_ints, default=[1, 16], help="client counts, e.g. 1,16")
    p.add_argument("--protocols", type=lambda t: t.split(","), default=["rest", "grpc"])
    p.add_argument("--requests_per_client", type=int, default=150)
    p.add_argument("--time_limit", type=float, default=60.0, help="seconds per mode, at most")
    p.add_argument("--overload_clients", type=int, default=64)
    p.add_argument("--overload_rows", type=int, default=8, help="rows per overload request")
    p.add_argument("--overload_seconds", type=float, default=120.0)
    p.add_argument("--overload_max_requests", type=int, default=500_000)
    args = p.parse_args()
    failed = False
    with tempfile.TemporaryDirectory() as workdir:
        args.base = export(workdir)
        if args.run in ("all", "compare"):
            modes = [
                ("dynamic batching", ["--enable_batching", "true", "--max_batch_size", "16",
                                      "--batch_timeout_micros", "2000"]),
                # each request is its own batch: room for every client's request
                ("batch size 1", ["--enable_batching", "false", "--max_batch_size", "1",
                                  "--max_enqueued_batches", str(max(args.clients))]),
            ]
            results = [r for label, flags in modes for r in run_mode(args.base, label, flags, args)]
            print(f"model: MLP {DIM}-{HIDDEN}x3-{CLASSES}; closed-loop clients, one example per request, "
                  f"loopback (REST: HTTP/1.1 JSON; gRPC: TensorProto)")
            print(f"{'mode':<24} {'clients':>7} {'requests':>8} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6}")
            for r in results:
                print(f"{r['mode']:<24} {r['clients']:>7} {r['requests']:>8} {r['rps']:>8.1f} {r['p50_ms']:>8.2f} "
                      f"{r['p99_ms']:>8.2f} {r['errors']:>6}")
            failed |= any(r["errors"] for r in results)
        if args.run in ("all", "overload"):
            o = overload(args.base, args)
            print(f"\noverload: {args.overload_clients} clients x {args.overload_rows} rows per request, no "
                  f"back-off, {o['wall_s']:.0f} s; server {' '.join(OVERLOAD_FLAGS)}")
            print(f"status codes: {dict(sorted(o['codes'].items(), key=str))}")
            print(f"accepted {o['accepted']} ({o['accepted_rps']:.1f} req/s, {o['rows_per_s']:.0f} rows/s), "
                  f"refused (503) {o['refused']}; 5xx other than 503: {o['bad_5xx']}; wrong: {len(o['wrong'])}")
            print(f"accepted latency ms: p50 {o['p50_ms']:.1f}, p99 {o['p99_ms']:.1f}, max {o['max_ms']:.1f}; "
                  f"503 p99 {o['refused_p99_ms']:.1f}")
            print(f"server RSS MB ({o['rss_samples']} samples, 1/s): after warm-up {o['rss_first_mb']:.1f}, "
                  f"last {o['rss_last_mb']:.1f}, max {o['rss_max_mb']:.1f}, "
                  f"trend {o['rss_slope_mb_per_min']:+.2f} MB/min")
            if o["wrong"]:
                print(f"first problems: {o['wrong'][:3]}", file=sys.stderr)
            failed |= bool(o["bad_5xx"] or o["other"] or o["wrong"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
