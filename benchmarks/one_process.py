"""One process doing train, evaluate and predict, as an outside harness measures it.

    .venv/bin/python benchmarks/one_process.py [--rounds 6] [--repeats 5] [--batches 220]
        [--ipl 100] [--kinds estimator hand-scan hand-step] [--without google.cloud.storage]

The shape of run an outside harness used (issue 21): 1 CPU device, the MLP
784-512-512-10 at batch 256, Adam, `iterations_per_loop=100`, 220 batches per
call of each mode, `predict(yield_single_examples=False)`. Three kinds of child
process, each fresh, their order rotated over `--rounds` rounds:

  estimator  one TPUEstimator (benchmarks/loops.py's): per repeat a train(), an
             evaluate() and a predict() call
  hand-scan  benchmarks/hand_script.py's "scan" form: a jitted `lax.scan` over blocks
             of 100 stacked batches (`lax.map` for predict); numpy, JAX, Optax only
  hand-step  the same script's per-step form (one jitted program per batch)

Each child first runs every call once (compiles), then `--repeats` timed repeats
(the three modes in turn). Speed: per (round, repeat, mode) the ratio faster
hand-written form's seconds / the estimator's; printed per mode: the median, a 95%
confidence interval of the median (order statistics: no assumption on the
spread's shape; a gap is real when the whole interval is below 0.97) and the range.
Memory: each process's peak RSS (VmHWM: imports, compilation, the calls); the
ratio estimator / the lighter hand-written process (target <= 1.25); where each
process's memory goes (VmRSS, and VmHWM so far, after `import jax`, after the other
imports, after building the batches, after each mode's first call, at the end); and
what each package the estimator's process imported added (benchmarks/import_memory.py).

To see what a part costs: `--without MODULE` makes MODULE unimportable in the children
(what an install without it saves, e.g. google.cloud.storage, which tensorboardX imports
when installed); `MALLOC_ARENA_MAX=1` in the environment reaches the children (glibc's
per-thread arenas); `--ipl` changes iterations_per_loop and the hand-written scan block.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from memory import status_mb  # noqa: E402  (VmRSS / VmHWM of this process)

MODES = ("train", "evaluate", "predict")
KINDS = ("estimator", "hand-scan", "hand-step")
MLP = dict(shape=(28, 28), batch=256, pool=200, ipl=100)


def child(kind: str, repeats: int, n: int, ipl: int, without: list[str]) -> dict:
    """Runs one kind in this fresh process; returns its times and memory."""
    from import_memory import ImportMemory

    for name in without:
        sys.modules[name] = None  # `import name` raises ImportError

    flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "", os.environ.get("XLA_FLAGS", ""))
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count=1".strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    marks = []

    def mark(name: str) -> None:
        marks.append((name, round(status_mb("VmRSS"), 1), round(status_mb("VmHWM"), 1)))

    mark("python")
    with ImportMemory() as imports:
        import jax

        jax.devices()
        mark("import jax")
        if kind == "estimator":
            import loops  # tpu_estimator (its names load on first use), flax, optax

            loops.te.TPUEstimator  # noqa: B018  (the estimator's modules)
        else:
            import hand_script  # optax
        mark("imports")
        from batches import make_batches

        batches = make_batches(MLP["shape"], MLP["batch"], n, MLP["pool"])
        mark("batches")
        if kind == "estimator":
            est = loops.build_estimator(dict(loops.WORKLOADS["mlp"], ipl=ipl), "metric_fn")
            calls = {mode: (lambda m: lambda: loops.estimator_call(est, m, batches))(mode) for mode in MODES}
        else:
            calls = hand_script.programs(kind.split("-")[1], batches, ipl)
        for mode in MODES:  # warm-up: every program compiled once (lazy imports included)
            calls[mode]()
            mark(f"first {mode}")
    times = {mode: [] for mode in MODES}
    for _ in range(repeats):
        for mode in MODES:
            t = time.perf_counter()
            calls[mode]()
            times[mode].append(time.perf_counter() - t)
    mark("end")
    return {"times": times, "peak_mb": status_mb("VmHWM"), "marks": marks, "imports": imports.by_package(),
            "roots": imports.roots()}


def run_child(kind: str, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--child", kind, "--repeats", str(args.repeats), "--batches", str(args.batches),
           "--ipl", str(args.ipl), "--without", *args.without]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{kind} child failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """A distribution-free confidence interval of the median: the order statistics
    x_(k) and x_(n+1-k) (1-based) cover it with probability 1 - 2 P(Binomial(n, 1/2) < k);
    the narrowest such pair that still covers with `confidence` (min-max when n is small)."""
    v, n = sorted(values), len(values)
    below = lambda k: sum(math.comb(n, i) for i in range(k)) / 2**n  # P(Binomial < k)  # noqa: E731
    k = 1
    while k + 1 <= n // 2 and 1 - 2 * below(k + 1) >= confidence:
        k += 1
    return v[k - 1], v[n - k]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--batches", type=int, default=220)
    p.add_argument("--ipl", type=int, default=MLP["ipl"], help="iterations_per_loop and the hand scan's block")
    p.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS),
                   help="the estimator and at least one hand-written form")
    p.add_argument("--without", nargs="*", default=[], metavar="MODULE", help="made unimportable in the children")
    p.add_argument("--child", choices=KINDS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.repeats, args.batches, args.ipl, args.without)))
        return 0
    kinds = [k for k in KINDS if k in args.kinds]
    hands = kinds[1:]
    if kinds[0] != "estimator" or not hands:
        p.error(f"--kinds needs the estimator and a hand-written form; Received: --kinds {' '.join(args.kinds)}")
    ratios = {mode: [] for mode in MODES}
    peaks = {kind: [] for kind in kinds}
    last = {}
    for r in range(args.rounds):
        order = kinds[r % len(kinds):] + kinds[: r % len(kinds)]  # each kind first, second ... in turn
        got = {kind: run_child(kind, args) for kind in order}
        line = [f"round {r + 1} ({', '.join(order)})"]
        for mode in MODES:
            est = got["estimator"]["times"][mode]
            new = [min(got[h]["times"][mode][i] for h in hands) / e for i, e in enumerate(est)]
            ratios[mode].extend(new)
            line.append(f"{mode} {statistics.median(new):.3f}")
        for kind in kinds:
            peaks[kind].append(got[kind]["peak_mb"])
        line.append("peak RSS " + " / ".join(f"{got[k]['peak_mb']:.0f}" for k in kinds) + " MB")
        print("; ".join(line), flush=True)
        last = got
    print(f"\n{args.rounds} rounds x {args.repeats} repeats, {args.batches} batches per call, ipl {args.ipl},"
          f" 1 CPU device" + (f", without {' '.join(args.without)}" if args.without else ""))
    print("throughput / faster hand-written form, per repeat: median [95% CI of the median] (range)")
    for mode in MODES:
        v = ratios[mode]
        lo, hi = median_interval(v)
        print(f"  {mode:8s} {statistics.median(v):.3f} [{lo:.3f}-{hi:.3f}] ({min(v):.3f}-{max(v):.3f}), n={len(v)}")
    print("whole-process peak RSS, MB: median (range)")
    for kind in kinds:
        print(f"  {kind:9s} {statistics.median(peaks[kind]):6.0f} ({min(peaks[kind]):.0f}-{max(peaks[kind]):.0f})")
    lighter = [min(each) for each in zip(*(peaks[h] for h in hands))]
    rr = [e / h for e, h in zip(peaks["estimator"], lighter)]
    print(f"  estimator / lighter hand-written process: median {statistics.median(rr):.2f} "
          f"[{min(rr):.2f}-{max(rr):.2f}] (target <= 1.25)")
    print("\nwhere the memory goes (last round), MB: VmRSS (VmHWM so far) after each mark")
    names = [name for name, _, _ in last["estimator"]["marks"]]
    print(f"  {'':18s}" + "".join(f"{k:>18s}" for k in kinds))
    for i, name in enumerate(names):
        cells = "".join(f"{last[k]['marks'][i][1]:11.0f} ({last[k]['marks'][i][2]:4.0f})" for k in kinds)
        print(f"  {name:18s}{cells}")
    print("\nresident memory added by each imported package (last round), MB; packages over 1 MB")
    for kind in kinds:
        big = {pkg: mb for pkg, mb in last[kind]["imports"].items() if mb >= 1.0}
        total = sum(last[kind]["imports"].values())
        print(f"  {kind} (all imports {total:.0f}): " + ", ".join(f"{pkg} {mb:.1f}" for pkg, mb in big.items()))
    print("  the estimator's root imports (begun outside any other import), each with all it loaded, MB: "
          + ", ".join(f"{pkg} {mb:.1f}" for pkg, mb in last["estimator"]["roots"].items() if mb >= 1.0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
