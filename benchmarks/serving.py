"""Loopback load test of `tpu-estimator serve`: dynamic batching vs batch-size-1 serving.

Trains a small MLP for a few steps, exports it, then for each mode starts the
server as a subprocess on 127.0.0.1, runs 16 concurrent clients sending
one-example `:predict` requests (row format) for a bounded number of requests,
checks every response against the exported model run locally, and prints
requests/sec and p50/p99 latency. The server is always shut down.

Usage: .venv/bin/python benchmarks/serving.py [--requests_per_client 150] [--clients 16]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

import flax.linen as nn
import httpx
import numpy as np
import optax

import tpu_estimator as te

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


def run_mode(base: str, label: str, flags: list[str], args: argparse.Namespace) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1/models/bench"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tpu_estimator.serving.cli", "serve", base, "--model_name", "bench",
         "--port", str(port), "--poll_seconds", "0", "--log_level", "warning", *flags],
        env=dict(os.environ, PYTHONPATH=ROOT), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server did not start: {proc.stderr.read().decode()[-2000:]}")
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        return load_test(url, label, args)
    finally:
        proc.kill()
        proc.wait(timeout=30)


def load_test(url: str, label: str, args: argparse.Namespace) -> dict:
    model = te.load_exported(os.path.join(args.base, os.listdir(args.base)[0]))
    rng = np.random.RandomState(1)
    inputs = rng.randn(args.clients, args.requests_per_client, DIM).astype(np.float32)
    expected = model.signatures["serving_default"](x=inputs.reshape(-1, DIM))["probabilities"]
    expected = expected.reshape(args.clients, args.requests_per_client, CLASSES)
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + args.time_limit

    def client(c: int) -> None:
        mine = []
        with httpx.Client(timeout=30) as http:
            for i in range(args.requests_per_client):
                if time.monotonic() > stop_at:
                    break
                t0 = time.perf_counter()
                r = http.post(url + ":predict", json={"instances": [inputs[c, i].tolist()]})
                mine.append(time.perf_counter() - t0)
                if r.status_code != 200:
                    errors.append(f"{r.status_code}: {r.text[:200]}")
                    continue
                got = np.asarray(r.json()["predictions"][0])
                if not np.allclose(got, expected[c, i], rtol=1e-4, atol=1e-5):
                    errors.append(f"client {c} request {i}: wrong prediction")
        with lock:
            latencies.extend(mine)

    # warm-up (connections, first calls)
    with httpx.Client(timeout=30) as http:
        for _ in range(5):
            http.post(url + ":predict", json={"instances": [inputs[0, 0].tolist()]})
    threads = [threading.Thread(target=client, args=(c,)) for c in range(args.clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    lat = np.asarray(latencies) * 1e3
    result = {"mode": label, "requests": len(lat), "rps": len(lat) / wall,
              "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)),
              "errors": len(errors)}
    if errors:
        print(f"[{label}] first errors: {errors[:3]}", file=sys.stderr)
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--requests_per_client", type=int, default=150)
    p.add_argument("--time_limit", type=float, default=60.0, help="seconds per mode, at most")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        args.base = export(workdir)
        modes = [
            ("dynamic batching", ["--enable_batching", "true", "--max_batch_size", "16",
                                  "--batch_timeout_micros", "2000"]),
            ("batch size 1", ["--enable_batching", "false", "--max_batch_size", "1"]),
        ]
        results = [run_mode(args.base, label, flags, args) for label, flags in modes]
    print(f"model: MLP {DIM}-{HIDDEN}x3-{CLASSES}; {args.clients} concurrent clients, "
          f"one example per request, loopback HTTP")
    print(f"{'mode':<18} {'requests':>8} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6}")
    for r in results:
        print(f"{r['mode']:<18} {r['requests']:>8} {r['rps']:>8.1f} {r['p50_ms']:>8.2f} "
              f"{r['p99_ms']:>8.2f} {r['errors']:>6}")
    return 1 if any(r["errors"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
