"""The quick embedding model's train() time split into a per-call and a per-step cost.

    .venv/bin/python benchmarks/embedding_call_cost.py [--rounds N] [--sharding planner|row|replicated]

`benchmarks/embedding.py --quick`'s model and batches on 8 fake CPU devices: ours
(`est.train(steps=n)`, the tables placed by the planner or every table `--sharding`) and
the hand-written replicated `jnp.take` scan loop (benchmarks/embedding.py `Replicated`),
each timed at n = 50 and 200 steps per call in every round (interleaved). Per round the
line t(n) = a + b n through the two: a is what a call costs whatever its steps (ours: the
restore check, feed start, final checkpoint and its wait; the hand loop: none of that),
b the step. Printed: medians [min-max] of a and b, and the per-round ratio of the steps
(hand b / our b: > 1, ours faster).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import embedding as bench  # noqa: E402  (sets 8 devices before JAX loads)

import jax  # noqa: E402
import numpy as np  # noqa: E402

SHORT, LONG = 50, 200


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--sharding", choices=("planner", "row", "replicated"), default="planner")
    args = parser.parse_args(argv)
    shapes = bench.tables(True)
    batches = bench.make_batches(shapes, LONG)
    est = bench.estimator(shapes, None if args.sharding == "planner" else args.sharding, SHORT)
    est.train(lambda params: iter(batches[:SHORT]), steps=SHORT)  # warm-up: compiles
    ref = bench.Replicated(shapes)
    for n in (SHORT, LONG):
        ref.scanned(batches[:n])  # compiles the scans of both lengths

    def ours(n: int) -> float:
        t = time.perf_counter()
        est.train(lambda params: iter(batches[:n]), steps=n)
        return time.perf_counter() - t

    fits: dict[str, list[tuple[float, float]]] = {"ours": [], "hand-written scan": []}
    for r in range(args.rounds):
        seconds = {}
        order = [("ours", n) for n in (SHORT, LONG)] + [("hand-written scan", n) for n in (SHORT, LONG)]
        for name, n in order[r % 4:] + order[: r % 4]:
            seconds[name, n] = ours(n) if name == "ours" else ref.scanned(batches[:n])
        for name in fits:
            b = (seconds[name, LONG] - seconds[name, SHORT]) / (LONG - SHORT)
            fits[name].append((seconds[name, SHORT] - SHORT * b, b))
    print(f"jax {jax.__version__}, {jax.device_count()} devices, the --quick model, tables: {args.sharding}; "
          f"{SHORT} and {LONG} steps per call, {args.rounds} interleaved rounds")
    for name, values in fits.items():
        a, b = (np.array(v) * 1e3 for v in zip(*values))
        print(f"{name:18} per call {np.median(a):6.0f} ms [{a.min():.0f}-{a.max():.0f}]   "
              f"per step {np.median(b):5.2f} ms [{b.min():.2f}-{b.max():.2f}]")
    ratio = np.array([h[1] / o[1] for h, o in zip(fits["hand-written scan"], fits["ours"])])
    print(f"per step, hand-written / ours, per round: median {np.median(ratio):.2f} "
          f"[{ratio.min():.2f}-{ratio.max():.2f}] (> 1: ours faster)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
