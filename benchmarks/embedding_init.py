"""Peak host memory of initializing a large embedding table on 8 devices, before and after.

A ROWS x DIM float32 table (Adagrad: a slot as large) is drawn in fresh processes
(tests/embedding/init_memory_worker.py, one case per process, 8 fake CPU devices), two
ways: `pinned` (the program `ShardedTables.init` compiles now: each device draws and
orders its own rows, embedding/initial.py) and `whole` (the program of tpu_estimator 0.2:
the logical table drawn and put in storage order without constraints). Cases run
interleaved, ROUNDS times; it prints the peak's growth during the init (MB, median and
range) and the compiled program's per-device memory analysis (temporaries, outputs).

    python benchmarks/embedding_init.py [--rows 400000] [--dim 32] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "embedding", "init_memory_worker.py")


def worker(*args: object) -> dict:
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, WORKER, *map(str, args)], env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    results: dict[tuple, list[dict]] = {}
    for _ in range(args.rounds):
        for strategy in ("div", "mod"):
            for how in ("pinned", "whole"):
                results.setdefault((strategy, how), []).append(worker(args.rows, args.dim, strategy, how))
    print(f"table {args.rows * args.dim * 4 / 1e6:.1f} MB on 8 devices, Adagrad (a slot as large)")
    print("strategy how     own MB  peak growth MB       per device: temp MB  output MB")
    for (strategy, how), runs in results.items():
        peaks = [r["peak_growth"] / 1e6 for r in runs]
        print(
            f"{strategy:8s} {how:6s} {runs[0]['own'] / 1e6:7.1f}  "
            f"{statistics.median(peaks):6.0f} ({min(peaks):.0f}-{max(peaks):.0f})  "
            f"{runs[0]['temp_per_device'] / 1e6:18.1f}  {runs[0]['output_per_device'] / 1e6:9.1f}"
        )


if __name__ == "__main__":
    main()
