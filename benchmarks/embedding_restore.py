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
# devices, strategy, slots (training), plan on restore, ways of restoring
CASES = [(8, "div", 0, None, ("rows", "whole")), (4, "div", 1, None, ("rows", "whole")), (2, "mod", 0, None, ("rows", "whole"))]
SMALL = [(8, "div", 0, "replicated", ("rows", "perdevice")), (4, "mod", 0, None, ("warm", "warmwhole"))]


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
    parser.add_argument("--small-rows", type=int, default=204_800)  # x 64 x 4 B = 50 MiB
    parser.add_argument("--only", choices=["row", "small"], default=None)
    parser.add_argument("--model-dir", default=None, help="a checkpoint saved before (skips saving)")
    args = parser.parse_args()
    groups = {"row": (args.rows, CASES), "small": (args.small_rows, SMALL)}
    if args.only:
        groups = {args.only: groups[args.only]}
    with tempfile.TemporaryDirectory() as tmp:
        dirs = {}
        for name, (rows, _) in groups.items():
            dirs[name] = os.path.join(tmp, name)
            if args.model_dir is not None and name == "row":
                dirs[name] = args.model_dir
            else:
                worker(8, "save", dirs[name], rows, args.dim, "div")
            print(f"{name}: table {rows * args.dim * 4 / 1e6:.0f} MB saved on 8 devices ('div'), Adagrad")
        results: dict[tuple, list[dict]] = {}
        for _ in range(args.rounds):
            for name, (rows, cases) in groups.items():
                for devices, strategy, slots, plan, hows in cases:
                    for how in hows:
                        case = f"{strategy}:{slots}:{how}" + (f":{plan}" if plan else "")
                        got = worker(devices, "restore", dirs[name], rows, args.dim, case)
                        results.setdefault((devices, strategy, slots, plan or "-", how), []).append(got)
    print(
        "devices strategy slots plan       how        restored MB  host MB  read MB  "
        "peak growth MB        over host MB          seconds"
    )
    for (devices, strategy, slots, plan, how), runs in results.items():
        own, host = runs[0]["own"] / 1e6, runs[0]["distinct"] / 1e6
        peaks = [r["peak_growth"] / 1e6 for r in runs]
        over = [p - host for p in peaks]
        secs = [r["seconds"] for r in runs]
        read = runs[0]["read_bytes"] / 1e6
        print(
            f"{devices:7d} {strategy:8s} {slots:5d} {plan:10s} {how:9s} {own:11.0f} {host:8.0f} {read:8.0f}  "
            f"{statistics.median(peaks):6.0f} ({min(peaks):.0f}-{max(peaks):.0f})  "
            f"{statistics.median(over):8.0f} ({min(over):.0f}-{max(over):.0f})  "
            f"{statistics.median(secs):6.2f} ({min(secs):.2f}-{max(secs):.2f})"
        )


if __name__ == "__main__":
    main()
