"""Peak host memory of restoring a large embedding table onto another device count/strategy.

A table of ROWS x DIM float32 (Adagrad) is saved by the real estimator on 8 devices
('div'), then restored in fresh processes (tests/embedding/restore_memory_worker.py)
onto 8, 4 and 2 devices (one case per process), two ways: `rows` (each device's rows read from
the checkpoint for it alone: `EmbeddingTables.from_checkpoint`) and `whole` (the saved
arrays read whole into numpy, then placed: what tpu_estimator 0.2 did for evaluation and
for another device count or strategy). Cases run interleaved, ROUNDS times; it prints
the peak's growth during the restore over the bytes restored (MB, median and range).

    python benchmarks/embedding_restore.py [--rows 1638400] [--dim 64] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "embedding", "restore_memory_worker.py")
CASES = [(8, "div", 0), (4, "div", 1), (2, "mod", 0)]  # devices, strategy, slots (training)


def worker(devices: int, *args: object) -> dict | None:
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, WORKER, *map(str, args)], env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1]) if args[0] == "restore" else None  # one case


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_638_400)  # x 64 x 4 B = 400 MiB
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--model-dir", default=None, help="a checkpoint saved before (skips saving)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model_dir or os.path.join(tmp, "model")
        if args.model_dir is None:
            worker(8, "save", model_dir, args.rows, args.dim, "div")
        table = args.rows * args.dim * 4
        print(f"table {table / 1e6:.0f} MB saved on 8 devices ('div'), Adagrad")
        results: dict[tuple, list[dict]] = {}
        for _ in range(args.rounds):
            for devices, strategy, slots in CASES:
                for how in ("rows", "whole"):
                    got = worker(devices, "restore", model_dir, args.rows, args.dim, f"{strategy}:{slots}:{how}")
                    results.setdefault((devices, strategy, slots, how), []).append(got)
    print("devices strategy slots how    restored MB  peak growth MB          over restored MB")
    for (devices, strategy, slots, how), runs in results.items():
        own = runs[0]["own"] / 1e6
        peaks = [r["peak_growth"] / 1e6 for r in runs]
        over = [p - own for p in peaks]
        print(
            f"{devices:7d} {strategy:8s} {slots:5d} {how:6s} {own:11.0f}  "
            f"{statistics.median(peaks):6.0f} ({min(peaks):.0f}-{max(peaks):.0f})  "
            f"{statistics.median(over):14.0f} ({min(over):.0f}-{max(over):.0f})"
        )


if __name__ == "__main__":
    main()
