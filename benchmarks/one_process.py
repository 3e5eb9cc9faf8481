"""One process doing train, evaluate and predict, as an outside harness measures it.

    .venv/bin/python benchmarks/one_process.py [--rounds 5] [--repeats 3] [--batches 220]

The shape of run an outside harness used (issue 21): 1 CPU device, the MLP
784-512-512-10 at batch 256, Adam, `iterations_per_loop=100`, 220 batches per
call of each mode, `predict(yield_single_examples=False)`. Two kinds of child
process, each fresh, alternated over `--rounds` rounds:

  estimator  one TPUEstimator: per repeat a train(), an evaluate() and a predict() call
  hand       the hand-written loops of benchmarks/hand_loops.py, both forms (a jitted
             `lax.scan` over blocks of 100 stacked batches; a per-step loop), the same
             calls per repeat

Each child first runs every call once (compiles), then `--repeats` timed
repeats. Printed per round and mode: the ratio estimator throughput / the
faster hand-written form's (median over the repeats); then the median and
range of those ratios over all rounds and repeats (target >= 0.97). Also the
whole process's peak RSS (VmHWM: imports, compilation, the calls), estimator /
hand (target <= 1.25), and where the estimator's memory went (VmRSS after
imports, after the warm-up calls, at the end).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from memory import status_mb  # noqa: E402  (VmRSS / VmHWM of this process)

MODES = ("train", "evaluate", "predict")


def child(kind: str, repeats: int, n: int) -> dict:
    from workloads import WORKLOADS, set_device_count

    set_device_count(1)
    sys.path.insert(0, HERE)
    import jax  # noqa: F401  (imported before the marks: both kinds pay for it)

    marks = {}
    workload = dict(WORKLOADS["mlp"])
    from workloads import DataParallel, make_batches

    if kind == "estimator":
        import loops

        marks["imported"] = status_mb("VmRSS")
        batches = make_batches(workload["shape"], workload["batch"], n, workload["pool"])
        est = loops.build_estimator(workload, "fn")

        def calls(mode):
            return lambda: loops.estimator_call(est, mode, batches)

        contenders = {mode: {"estimator": calls(mode)} for mode in MODES}
    else:
        import hand_loops

        marks["imported"] = status_mb("VmRSS")
        batches = make_batches(workload["shape"], workload["batch"], n, workload["pool"])
        dp = DataParallel()
        contenders = {
            mode: {k: hand_loops.reference(workload, batches, mode, k, dp) for k in hand_loops.KINDS}
            for mode in MODES
        }
    import time

    for mode in MODES:  # warm-up: every program compiled once
        for fn in contenders[mode].values():
            fn()
    marks["warm"] = status_mb("VmRSS")
    times = {mode: {name: [] for name in contenders[mode]} for mode in MODES}
    for _ in range(repeats):
        for mode in MODES:
            for name, fn in contenders[mode].items():
                t = time.perf_counter()
                out = fn()
                seconds = out if isinstance(out, float) else time.perf_counter() - t
                times[mode][name].append(seconds)
    marks["end"] = status_mb("VmRSS")
    return {"times": times, "peak_mb": status_mb("VmHWM"), "marks": marks}


def run_child(kind: str, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--child", kind, "--repeats", str(args.repeats), "--batches", str(args.batches)]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{kind} child failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batches", type=int, default=220)
    p.add_argument("--child", choices=["estimator", "hand"])
    args = p.parse_args()
    if args.child:
        sys.path.insert(0, HERE)
        print(json.dumps(child(args.child, args.repeats, args.batches)))
        return 0
    ratios = {mode: [] for mode in MODES}
    rss = []
    for r in range(args.rounds):
        order = ("estimator", "hand") if r % 2 == 0 else ("hand", "estimator")  # ABBA
        got = {kind: run_child(kind, args) for kind in order}
        est, hand = got["estimator"], got["hand"]
        line = [f"round {r + 1}"]
        for mode in MODES:
            for i, e in enumerate(est["times"][mode]["estimator"]):
                best = min(hand["times"][mode][k][i] for k in hand["times"][mode])
                ratios[mode].append(best / e)
            line.append(f"{mode} {statistics.median(ratios[mode][-args.repeats:]):.3f}")
        rss.append((est["peak_mb"], hand["peak_mb"]))
        line.append(f"peak RSS {est['peak_mb']:.0f} vs {hand['peak_mb']:.0f} MB")
        line.append("estimator RSS " + ", ".join(f"{k} {v:.0f}" for k, v in est["marks"].items()))
        print("; ".join(line), flush=True)
    print(f"\n{args.rounds} rounds x {args.repeats} repeats, {args.batches} batches per call, 1 CPU device")
    for mode in MODES:
        v = ratios[mode]
        print(f"  {mode:8s} throughput / faster hand loop: median {statistics.median(v):.3f} "
              f"[{min(v):.3f}-{max(v):.3f}]")
    rr = [e / h for e, h in rss]
    print(f"  whole-process peak RSS estimator / hand: median {statistics.median(rr):.2f} "
          f"[{min(rr):.2f}-{max(rr):.2f}] ({statistics.median(e for e, _ in rss):.0f} vs "
          f"{statistics.median(h for _, h in rss):.0f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
