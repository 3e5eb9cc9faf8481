"""What grows per hot reload in `tpu-estimator serve`: the server traced from inside, reloads every few seconds.

Runs the real server (`tpu_estimator.serving.cli`, the soak's flags) in a
subprocess whose extra thread samples, every `--sample_every` seconds, as JSON
lines: VmRSS; glibc's `mallinfo2` (bytes malloc has in use vs free in its
arenas, and mmapped blocks); threads; open file descriptors; live JAX arrays;
Python objects by type (gc); and with `--tracemalloc` the traced Python
allocations. Meanwhile 1 REST and 1 gRPC client send requests and a new
version (a copy of the newest) appears every `--reload_every` seconds. At the
end it prints, per quantity, the change per reload (least squares over the
samples after the first `--warmup` reloads), and the object types and
allocation sites that grew most from the first sample after warm-up to the last.
The census of Python objects (`gc.get_objects()` from another thread) can make a
request thread's tuple resize fail (CPython's SystemError "bad argument to
internal function"): an artefact of the census, seen once in 40 reloads; the
soak (serving_soak.py) takes no census.

Usage: .venv/bin/python benchmarks/reload_trace.py [--reloads 60] [--reload_every 10] [--tracemalloc]
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import gc
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]


def _mallinfo() -> dict[str, float]:
    libc = ctypes.CDLL(None)
    fn = getattr(libc, "mallinfo2", None)
    if fn is None:
        return {}
    fn.restype = _MallInfo2
    m = fn()
    return {"malloc_in_use_mb": m.uordblks / 2**20, "malloc_free_mb": m.fordblks / 2**20,
            "malloc_mmapped_mb": m.hblkhd / 2**20, "malloc_arena_mb": m.arena / 2**20}


def _rss_mb(pid: str = "self") -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def _sample(snapshots: list) -> dict:
    import jax

    gc.collect()
    types = collections.Counter(type(o).__qualname__ for o in gc.get_objects())
    arrays = jax.live_arrays()
    s = {"t": time.monotonic(), "rss_mb": _rss_mb(), **_mallinfo(),
         "threads": len(os.listdir("/proc/self/task")), "py_threads": threading.active_count(),
         "fds": len(os.listdir("/proc/self/fd")), "live_arrays": len(arrays),
         "live_array_mb": sum(a.nbytes for a in arrays) / 2**20, "gc_objects": sum(types.values()),
         "types": dict(types)}
    import tracemalloc

    if tracemalloc.is_tracing():
        snap = tracemalloc.take_snapshot()
        s["traced_mb"] = tracemalloc.get_traced_memory()[0] / 2**20
        snapshots.append(snap)
    return s


def serve(out: str, every: float, baseline: int, argv: list[str]) -> int:
    """The server role: the CLI in this process, a sampling thread beside it."""
    import tracemalloc

    if os.environ.get("RELOAD_TRACE_TRACEMALLOC"):
        tracemalloc.start(8)
    from tpu_estimator.serving import cli

    snapshots: list = []

    def sampler() -> None:
        with open(out, "w") as f:
            while True:
                time.sleep(every)
                s = _sample(snapshots)
                if len(snapshots) > baseline:  # allocation sites grown since the baseline sample
                    diff = snapshots[-1].compare_to(snapshots[baseline], "traceback")[:12]
                    s["top_growth"] = [
                        {"kb": d.size_diff / 1024, "count": d.count_diff,
                         "where": [f"{fr.filename.split('site-packages/')[-1]}:{fr.lineno}" for fr in d.traceback][:8]}
                        for d in diff]
                    del snapshots[baseline + 1:-1]
                f.write(json.dumps(s) + "\n")
                f.flush()

    threading.Thread(target=sampler, daemon=True, name="reload-trace").start()
    return cli.main(argv)


def drive(args: argparse.Namespace) -> dict:
    import serving as bench
    from serving_soak import new_version

    with tempfile.TemporaryDirectory() as workdir:
        base = bench.export(workdir)
        out = os.path.join(workdir, "trace.jsonl")
        port, grpc_port = bench.free_port(), bench.free_port()
        env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE))
        if args.tracemalloc:
            env["RELOAD_TRACE_TRACEMALLOC"] = "1"
        log = open(os.path.join(workdir, "server.log"), "w+")
        proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--serve", out, "--sample_every", str(args.sample_every),
             "--warmup", str(args.warmup), "--reload_every", str(args.reload_every),
             "--", "serve", f"--model_base_path={base}", "--model_name=bench", f"--rest_api_port={port}",
             f"--port={grpc_port}", "--file_system_poll_wait_seconds=1", "--log_level=warning",
             "--enable_batching=true", "--max_batch_size=16", "--batch_timeout_micros=2000",
             "--model_version_policy=latest:1"], env=env, stdout=subprocess.DEVNULL, stderr=log)
        server = bench.Server(f"http://127.0.0.1:{port}/v1/models/bench", f"127.0.0.1:{grpc_port}", proc.pid,
                              f"http://127.0.0.1:{port}")
        stop = threading.Event()
        counts: collections.Counter = collections.Counter()
        try:
            import httpx

            deadline = time.monotonic() + 180
            while True:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise RuntimeError(f"server did not start: {log.read()[-2000:]}")
                try:
                    if httpx.get(server.url, timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.2)
            x = np.random.RandomState(0).randn(1, bench.DIM).astype(np.float32)

            def client(protocol: str) -> None:
                conn = bench.CLIENTS[protocol](server)
                while not stop.is_set():
                    ok, _ = conn.predict(x)
                    counts[(protocol, ok)] += 1
                    stop.wait(0.02)
                conn.close()

            threads = [threading.Thread(target=client, args=(p,), daemon=True) for p in ("rest", "grpc")]
            for t in threads:
                t.start()
            reload_times = []
            for i in range(args.reloads):
                time.sleep(args.reload_every)
                new_version(base)
                reload_times.append(time.monotonic())
                print(f"reload {i + 1}: server RSS {_rss_mb(str(proc.pid)):.1f} MB", flush=True)
            time.sleep(args.reload_every)
            stop.set()
            for t in threads:
                t.join(timeout=30)
        finally:
            proc.kill()
            proc.wait(timeout=30)
            log.seek(0)
            errors = [line for line in log.read().splitlines() if "Error" in line or "Traceback" in line]
        with open(out) as f:
            samples = [json.loads(line) for line in f]
    return summarize(samples, reload_times, args, counts, errors)


def summarize(samples: list[dict], reload_times: list[float], args: argparse.Namespace,
              counts: collections.Counter, errors: list[str]) -> dict:
    n_reloads = [sum(r <= s["t"] for r in reload_times) for s in samples]
    warm = [i for i, n in enumerate(n_reloads) if n >= args.warmup]
    keys = [k for k, v in samples[0].items() if isinstance(v, (int, float)) and k != "t"]
    per_reload = {}
    for k in keys:
        xs = np.asarray([n_reloads[i] for i in warm], float)
        ys = np.asarray([samples[i].get(k, np.nan) for i in warm], float)
        if len(xs) > 2 and np.ptp(xs) > 0:
            coef = np.polyfit(xs, ys, 1)
            per_reload[k] = {"per_reload": float(coef[0]), "residual_std": float((ys - np.polyval(coef, xs)).std()),
                             "first": ys[0], "last": ys[-1]}
    first, last = samples[warm[0]]["types"], samples[-1]["types"]
    grown = sorted(((last.get(t, 0) - first.get(t, 0), t) for t in set(first) | set(last)), reverse=True)[:15]
    return {"reloads": len(reload_times), "samples": len(samples), "requests": {f"{p} ok={ok}": n for (p, ok), n in
                                                                             counts.items()},
            "server_errors": errors[:5], "per_reload": per_reload, "types_grown": grown,
            "top_growth": samples[-1].get("top_growth", [])}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reloads", type=int, default=60)
    p.add_argument("--reload_every", type=float, default=10)
    p.add_argument("--sample_every", type=float, default=5)
    p.add_argument("--warmup", type=int, default=3, help="reloads before the fit starts")
    p.add_argument("--tracemalloc", action="store_true", help="trace Python allocations (slower)")
    p.add_argument("--serve", default=None, help=argparse.SUPPRESS)  # the server role: its samples' file
    p.add_argument("--json", default=None)
    args, rest = p.parse_known_args()
    if args.serve:
        baseline = int(args.warmup * args.reload_every / args.sample_every) + 4  # samples before the first reload too
        return serve(args.serve, args.sample_every, baseline, [a for a in rest if a != "--"])
    r = drive(args)
    print(json.dumps(r, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
