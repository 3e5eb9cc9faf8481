"""Soak test of `tpu-estimator serve`: hours of REST and gRPC traffic with hot reloads, on loopback.

Exports the benchmark MLP (benchmarks/serving.py), starts the server
(`--model_version_policy latest:1`, polling every second, Prometheus
metrics on), and for `--soak_seconds` runs `--rest_clients` REST and
`--grpc_clients` gRPC clients, each sending one-example `:predict`/`Predict`
requests with `--think_ms` between them. Every `--reload_every` seconds a new
version appears (a copy of the newest export under the next version number,
renamed into place atomically), so the server loads and warms it up, then
unloads the old one, while traffic goes on. Every answer is checked against
the model run locally; every failure is an error (none expected).

Resident memory of the server process (VmRSS) is sampled every
`--rss_every` seconds; "flat" is measured as the least-squares slope of the
samples after warm-up (the first reload cycle), in MB per hour (with its standard
error and the samples' scatter around the line), and the difference between the
last sample and the first one after warm-up; the samples are in the JSON.
Progress is printed once a minute (flush), so a cut-short run still reports.

Usage: .venv/bin/python benchmarks/serving_soak.py [--soak_seconds 3600] [--reload_every 300]
       [--rest_clients 2] [--grpc_clients 2] [--think_ms 20] [--json out.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import sys
import tempfile
import threading
import time

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import serving as bench  # noqa: E402

import tpu_estimator as te  # noqa: E402


def new_version(base: str) -> int:
    """Copies the newest export to the next version number, renamed into place at once."""
    versions = sorted(int(n) for n in os.listdir(base) if n.isdigit())
    new = versions[-1] + 1
    staging = os.path.join(base, f".staging-{new}")
    shutil.copytree(os.path.join(base, str(versions[-1])), staging)
    os.rename(staging, os.path.join(base, str(new)))
    return new


def rss_fit(times: np.ndarray, mbs: np.ndarray) -> dict[str, float]:
    """The least-squares slope of RSS in MB/hour, its standard error, and the samples' scatter
    around the line (standard deviation of the residuals, MB): "flat" = a slope within that noise.
    Neighbouring samples are correlated (a swap holds two versions for seconds), so the standard
    error is a lower bound."""
    if len(times) < 3:
        return {"rss_slope_mb_per_hour": float("nan")}
    coef, cov = np.polyfit(times / 3600, mbs, 1, cov=True)
    residuals = mbs - np.polyval(coef, times / 3600)
    return {"rss_slope_mb_per_hour": float(coef[0]), "rss_slope_stderr_mb_per_hour": float(np.sqrt(cov[0, 0])),
            "rss_residual_std_mb": float(residuals.std(ddof=2))}


def soak(args: argparse.Namespace) -> dict:
    base = args.base
    model = te.load_exported(os.path.join(base, os.listdir(base)[0]))
    rng = np.random.RandomState(3)
    inputs = rng.randn(64, bench.DIM).astype(np.float32)
    expected = model.signatures["serving_default"](x=inputs)["probabilities"]
    config = os.path.join(args.workdir, "monitoring.config")
    with open(config, "w") as f:
        f.write('prometheus_config { enable: true path: "/monitoring/prometheus/metrics" }\n')
    counts: collections.Counter = collections.Counter()
    errors: list[str] = []
    latencies: dict[str, list[float]] = {"rest": [], "grpc": []}
    lock = threading.Lock()
    stop = threading.Event()
    flags = ["--enable_batching=true", "--max_batch_size=16", "--batch_timeout_micros=2000",
             f"--monitoring_config_file={config}", "--model_version_policy=latest:1"]
    with bench.serving(base, flags, poll_seconds=1) as server:
        def client(protocol: str, c: int) -> None:
            conn = bench.CLIENTS[protocol](server)
            i = c
            try:
                while not stop.is_set():
                    x = inputs[i % len(inputs) : i % len(inputs) + 1]
                    t0 = time.perf_counter()
                    ok, got = conn.predict(x)
                    dt = time.perf_counter() - t0
                    with lock:
                        counts[protocol] += 1
                        latencies[protocol].append(dt)
                        if not ok:
                            errors.append(f"{protocol}: {got}")
                        elif not np.allclose(got[0], expected[i % len(inputs)], rtol=1e-4, atol=1e-5):
                            errors.append(f"{protocol}: wrong prediction")
                    i += 1
                    stop.wait(args.think_ms / 1e3)
            finally:
                conn.close()

        threads = [threading.Thread(target=client, args=(p, c), daemon=True)
                   for p, n in (("rest", args.rest_clients), ("grpc", args.grpc_clients)) for c in range(n)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        rss: list[tuple[float, float]] = []
        reloads: list[tuple[float, int]] = []
        next_reload, next_report = args.reload_every, 60.0
        while (now := time.monotonic() - t0) < args.soak_seconds:
            rss.append((now, bench.rss_mb(server.pid)))
            if now >= next_reload:
                reloads.append((now, new_version(base)))
                next_reload += args.reload_every
            if now >= next_report:
                with lock:
                    print(f"[{now / 60:5.1f} min] requests {dict(counts)}, errors {len(errors)}, "
                          f"RSS {rss[-1][1]:.1f} MB, reloads {len(reloads)}", flush=True)
                next_report += 60
            time.sleep(min(args.rss_every, max(0.0, args.soak_seconds - now)))
        stop.set()
        for t in threads:
            t.join(timeout=60)
        wall = time.monotonic() - t0
        time.sleep(2 * 1.0)  # one more poll: the last version is loaded
        status = httpx.get(server.url, timeout=10).json()["model_version_status"]
        ready = httpx.get(server.root + "/v2/health/ready", timeout=10).status_code
        text = httpx.get(server.root + "/monitoring/prometheus/metrics", timeout=30).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    served = {s.labels["status"]: 0 for s in families[":tensorflow:serving:request_count"].samples}
    for s in families[":tensorflow:serving:request_count"].samples:
        served[s.labels["status"]] += s.value
    loads = {s.labels["status"]: 0 for s in families[":tensorflow:cc:saved_model:load_attempt_count"].samples}
    for s in families[":tensorflow:cc:saved_model:load_attempt_count"].samples:
        loads[s.labels["status"]] += s.value
    times, mbs = np.asarray([t for t, _ in rss]), np.asarray([m for _, m in rss])
    warm = times >= min(args.reload_every, 0.25 * wall)
    return {
        "wall_s": wall, "requests": dict(counts), "errors": len(errors), "first_errors": errors[:5],
        "p50_ms": {p: float(np.percentile(v, 50) * 1e3) for p, v in latencies.items() if v},
        "p99_ms": {p: float(np.percentile(v, 99) * 1e3) for p, v in latencies.items() if v},
        "reloads": len(reloads), "versions_at_end": status, "ready_status": ready,
        "metrics_request_count_by_status": served, "metrics_load_attempts": loads,
        "rss_samples": len(mbs), "rss_after_warmup_mb": float(mbs[warm][0]) if warm.any() else float("nan"),
        "rss_last_mb": float(mbs[-1]), "rss_max_mb": float(mbs.max()), "rss_min_after_warmup_mb":
        float(mbs[warm].min()) if warm.any() else float("nan"), **rss_fit(times[warm], mbs[warm]),
        "reload_at_s": [round(t, 1) for t, _ in reloads],
        "rss_mb_samples": [[round(t, 1), round(m, 2)] for t, m in rss],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--soak_seconds", type=float, default=3600)
    p.add_argument("--reload_every", type=float, default=300)
    p.add_argument("--rest_clients", type=int, default=2)
    p.add_argument("--grpc_clients", type=int, default=2)
    p.add_argument("--think_ms", type=float, default=20)
    p.add_argument("--rss_every", type=float, default=5)
    p.add_argument("--json", default=None, help="also write the result here")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        args.workdir = workdir
        args.base = bench.export(workdir)
        r = soak(args)
    print(json.dumps({k: v for k, v in r.items() if k != "rss_mb_samples"}, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=1)
    return 1 if r["errors"] or r["ready_status"] != 200 else 0


if __name__ == "__main__":
    sys.exit(main())
