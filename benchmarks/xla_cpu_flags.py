"""XLA:CPU flags vs training speed: which XLA_FLAGS a CPU user should set.

    .venv/bin/python benchmarks/xla_cpu_flags.py [--rounds N] [--quick]
        [--settings baseline,ynn-no-conv,...] [--no-estimator] [--list]

Why: training the CNN on CPU is far slower than TensorFlow's oneDNN kernels,
and the time goes to XLA:CPU's convolution gradients, not to our host loop.
XLA:CPU has switches for the libraries it hands convolutions and dots to
(YNNPACK, XNNPACK, oneDNN), for fast math and for Eigen's threading; this
measures each.

XLA_FLAGS is read once, when the CPU backend starts, so each setting runs in
its own worker process (this file with `--worker`), started once: it checks
the flags (an unknown flag aborts XLA), compiles, and reports the loss after
a few steps from the same initial parameters and batches (a flag that changes
results shows as a loss that differs from the baseline's), how many of the
CNN step's ops went to each library, and whether its optimized HLO is the
baseline's. Then the workers, all alive and idle but one, are timed in
rounds: round r times every setting once, in an order rotated by r (the
machine's speed drifts and others share it), each time one call of the
hand-written per-step training loop (`hand_loops.reference`, 1 CPU device,
compiled and warmed up) over `steps` batches of each workload
(`workloads.WORKLOADS`: the CNN, 32x32x3 batch 128, and the MLP,
784-512-512-10 batch 256, Adam).

Printed per setting and workload: the median ms/step over rounds and its
min-max, and the median over rounds of the ratio to the baseline's time in
the same round (< 1 is faster). With the estimator phase (default), the
fastest setting per workload, where it is not the baseline, is then timed
against the baseline as whole `est.train()` calls (`loops.build_estimator`),
interleaved the same way.

Time: ~6-8 min on the project's 2-core VM with the default 3 rounds; `--quick`
halves the CNN's steps.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

YNN = "--xla_cpu_experimental_ynn_fusion_type="
XNN_MODE = "--xla_cpu_experimental_xnn_graph_fusion_mode=XNN_GRAPH_FUSION_MODE_"

# name -> XLA_FLAGS. In jaxlib 0.10.2 XLA:CPU hands convolutions, dots and reductions
# to YNNPACK by default (ynn fusion types individual_convolution, individual_dot,
# reduce); "-type" removes one from that default list.
SETTINGS = {
    "baseline": "",
    "ynn-no-conv": YNN + "-individual_convolution",
    "ynn-off": YNN + "-individual_convolution,-individual_dot,-reduce",
    "ynn+eltwise": YNN + "+eltwise",
    "xnnpack=true": "--xla_cpu_use_xnnpack=true",
    "xnnpack=false": "--xla_cpu_use_xnnpack=false",
    "xnn-fuse-dot": "--xla_cpu_experimental_xnn_fusion_type=dot",
    "xnn-fuse-all": "--xla_cpu_experimental_xnn_fusion_type=dot,eltwise,reduce",
    "xnn-greedy": XNN_MODE + "GREEDY",
    "xnn-slinky": XNN_MODE + "GREEDY_SLINKY",
    "xnn-bypass-cost": XNN_MODE + "BYPASS_COST_MODEL",
    "onednn": "--xla_cpu_use_onednn=true",
    "onednn-cc": "--xla_cpu_use_onednn=true --xla_cpu_experimental_onednn_custom_call=true",
    "onednn-fuse": "--xla_cpu_use_onednn=true --xla_cpu_experimental_onednn_fusion_type=dot,eltwise",
    "fast-math": "--xla_cpu_enable_fast_math=true",
    "eigen-1-thread": "--xla_cpu_multi_thread_eigen=false",
    "ynn-no-conv+fast": YNN + "-individual_convolution --xla_cpu_enable_fast_math=true",
}

STEPS = {"cnn": 16, "mlp": 100}  # batches per timed call (the MLP's a multiple of its ipl, 100)
CHECK_STEPS = {"cnn": 8, "mlp": 20}  # steps from the initial parameters before the loss is compared
STARTING = 2  # workers starting (importing, compiling) at a time: the VM's cores
POOL = 8  # distinct batches per workload, reused in turn
LOSS_RTOL = 1e-3  # a loss further than this (relative) from the baseline's: "differs"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--quick", action="store_true", help="half the CNN's steps per timed call")
    parser.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated subset (baseline is always run)")
    parser.add_argument("--no-estimator", action="store_true", help="skip the est.train() phase")
    parser.add_argument("--list", action="store_true", help="print the settings and their flags, and exit")
    args = parser.parse_args(argv)
    names = [s for s in args.settings.split(",") if s]
    for s in names:
        if s not in SETTINGS:
            parser.error(f"unknown setting {s!r}; choose from {', '.join(SETTINGS)}")
    args.settings = ["baseline"] + [s for s in names if s != "baseline"]
    args.steps = {k: max(v // (2 if args.quick else 1), 8) for k, v in STEPS.items()}
    args.steps["mlp"] = STEPS["mlp"]  # est.train() runs whole loops of iterations_per_loop=100
    return args


# ---------------------------------------------------------------- the worker (one setting)


def worker(steps: dict) -> None:
    """Serves one setting: set-up facts first, then one JSON line per command read."""
    from workloads import set_device_count

    set_device_count(1)  # keeps the setting's flags
    import jax

    from hand_loops import reference
    from workloads import WORKLOADS, DataParallel, make_batches

    dp = DataParallel()
    batches = {k: make_batches(WORKLOADS[k]["shape"], WORKLOADS[k]["batch"], n, POOL) for k, n in steps.items()}
    facts = {"jax": jax.__version__, "backend": jax.default_backend(), "devices": jax.device_count()}
    for name in steps:
        facts[name] = check(WORKLOADS[name], batches[name][: CHECK_STEPS[name]])
    timed = {name: reference(WORKLOADS[name], batches[name], "train", "per-step", dp) for name in steps}
    reply(facts)
    estimators = {}
    for line in iter(sys.stdin.readline, ""):
        what, name = line.split()
        if what == "time":
            reply({"s": timed[name]()})
        elif what == "est":
            if name not in estimators:
                estimators[name] = Trainer(WORKLOADS[name], batches[name])
            reply({"s": estimators[name].timed()})


def reply(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def check(workload: dict, batches: list) -> dict:
    """The training step compiled under this process's flags, run from fixed parameters over
    `batches`: compile seconds, the last loss, which libraries got the step's ops, and a hash
    of the optimized HLO (equal hashes: the flag did not change the program)."""
    import jax
    import optax

    from workloads import Net, xent

    net, tx = Net(workload["net"]), optax.adam(1e-3)
    params = net.init(jax.random.PRNGKey(0), batches[0][0])["params"]
    state = (params, tx.init(params))

    def step(state, x, y):
        p, opt = state
        loss, grads = jax.value_and_grad(lambda q: xent(net.apply({"params": q}, x), y).mean())(p)
        updates, opt = tx.update(grads, opt, p)
        return (optax.apply_updates(p, updates), opt), loss

    t = time.perf_counter()
    compiled = jax.jit(step).lower(state, *batches[0]).compile()
    compile_s = time.perf_counter() - t
    for x, y in batches:
        state, loss = compiled(state, x, y)
    text = compiled.as_text()
    return {
        "compile_s": compile_s,
        "loss": float(loss),
        "libraries": library_ops(text),
        "hlo": hashlib.sha1(re.sub(r", metadata=\{[^}]*\}", "", text).encode()).hexdigest()[:10],
    }


def library_ops(hlo: str) -> dict:
    """How many fusions / custom calls of the optimized HLO each library runs."""
    kinds = re.findall(r'"kind":"__(\w+?)_fusion"', hlo) + re.findall(r'custom_call_target="__(\w+?)\$', hlo)
    return {k: kinds.count(k) for k in sorted(set(kinds))}


class Trainer:
    """Whole `est.train()` calls over the workload's batches (`benchmarks/loops.py`'s estimator)."""

    def __init__(self, workload: dict, batches: list) -> None:
        from loops import build_estimator, estimator_call

        self.est, self.batches, self.call = build_estimator(workload, "metric_fn"), batches, estimator_call
        self.call(self.est, "train", batches)  # warm-up: compiles

    def timed(self) -> float:
        t = time.perf_counter()
        self.call(self.est, "train", self.batches)
        return time.perf_counter() - t


# ---------------------------------------------------------------- the driver


class Worker:
    """A worker process for one setting, started with its XLA_FLAGS."""

    def __init__(self, name: str, steps: dict) -> None:
        self.name, self.flags = name, SETTINGS[name]
        env = dict(os.environ, XLA_FLAGS=self.flags, JAX_PLATFORMS="cpu")
        self.log = tempfile.TemporaryFile(mode="w+")
        argv = [sys.executable, os.path.abspath(__file__), "--worker", "--steps-json", json.dumps(steps)]
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, text=True)
        self.facts = None

    def ready(self) -> None:
        """Waits for the set-up facts (the worker has compiled and warmed up)."""
        self.facts = self.read()

    def read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            self.log.seek(0)
            tail = self.log.read()[-2000:]
            raise RuntimeError(f"worker {self.name!r} (XLA_FLAGS={self.flags!r}) exited {self.proc.returncode}:\n{tail}")
        return json.loads(line)

    def ask(self, what: str, workload: str) -> float:
        self.proc.stdin.write(f"{what} {workload}\n")
        self.proc.stdin.flush()
        return self.read()["s"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def rounds(workers: dict, what: str, workloads: list, n: int) -> dict:
    """`n` rounds; round r asks every worker once, in an order rotated by r: seconds per call."""
    names = list(workers)
    seconds = {(s, w): [] for s in names for w in workloads}
    for r in range(n):
        k = r % len(names)
        for s in names[k:] + names[:k]:
            for w in workloads:
                seconds[(s, w)].append(workers[s].ask(what, w))
    return seconds


def summary(seconds: list, base: list, steps: int) -> tuple:
    """(median ms/step, min, max, median ratio to the baseline within a round, min ratio, max ratio)."""
    import numpy as np

    ms = np.array(seconds) / steps * 1e3
    ratio = np.array(seconds) / np.array(base)
    return float(np.median(ms)), ms.min(), ms.max(), float(np.median(ratio)), ratio.min(), ratio.max()


def main(args) -> int:
    if args.list:
        for s, f in SETTINGS.items():
            print(f"{s:18} {f or '(no flags)'}")
        return 0
    t0 = time.perf_counter()
    workers = {}
    try:
        for i in range(0, len(args.settings), STARTING):
            started = [Worker(s, args.steps) for s in args.settings[i : i + STARTING]]
            workers.update((w.name, w) for w in started)
            for w in started:
                try:
                    w.ready()
                except RuntimeError as e:  # e.g. a flag this jaxlib does not know aborts XLA
                    if w.name == "baseline":
                        raise
                    del workers[w.name]
                    print(f"{w.name}: left out, {str(e).splitlines()[0]} {str(e).strip().splitlines()[-1][:200]}")
        f = workers["baseline"].facts
        print(f"jax {f['jax']}, backend {f['backend']}, {f['devices']} device(s), {args.rounds} rounds,"
              f" steps per call: cnn {args.steps['cnn']}, mlp {args.steps['mlp']};"
              f" workers started in {time.perf_counter() - t0:.0f} s", flush=True)
        loads = list(args.steps)
        times = rounds(workers, "time", loads, args.rounds)
        print_table(workers, times, args)
        if not args.no_estimator:
            estimator_phase(workers, times, args)
    finally:
        for w in workers.values():
            w.close()
    print(f"total {time.perf_counter() - t0:.0f} s")
    return 0


def print_table(workers: dict, times: dict, args) -> None:
    base = workers["baseline"].facts
    print("\nhand-written per-step training loop, 1 CPU device. ms/step: median over rounds [min-max];"
          " ratio: time / baseline's in the same round, median [min-max] (< 1 faster);"
          f" loss: relative difference from the baseline's after {CHECK_STEPS['cnn']} (cnn) /"
          f" {CHECK_STEPS['mlp']} (mlp) steps; compile: the CNN step's seconds; libraries: fusions or"
          " custom calls per library in the CNN step; HLO: optimized program is the baseline's")
    print(f"{'setting':18} {'cnn ms/step':>20} {'cnn ratio':>20} {'mlp ms/step':>17} {'mlp ratio':>20}"
          f" {'loss cnn':>8} {'loss mlp':>8} {'compile':>7} {'HLO':>4}  libraries")
    for s, w in workers.items():
        cols = []
        for load in args.steps:
            med, lo, hi, r, rlo, rhi = summary(times[(s, load)], times[("baseline", load)], args.steps[load])
            width = 20 if load == "cnn" else 17
            cols.append(f"{med:7.1f} [{lo:.1f}-{hi:.1f}]".rjust(width))
            cols.append(f"{r:6.3f} [{rlo:.3f}-{rhi:.3f}]".rjust(20))
        diffs = [abs(w.facts[k]["loss"] - base[k]["loss"]) / abs(base[k]["loss"]) for k in args.steps]
        marks = [f"{d:8.1e}" + ("!" if d > LOSS_RTOL else "") for d in diffs]
        same = "same" if w.facts["cnn"]["hlo"] == base["cnn"]["hlo"] else "new"
        libs = ", ".join(f"{k} {v}" for k, v in w.facts["cnn"]["libraries"].items()) or "none"
        print(f"{s:18} {' '.join(cols)} {' '.join(marks)} {w.facts['cnn']['compile_s']:6.1f}s {same:>4}  {libs}")
    print(f"(!: loss differs from the baseline's by more than {LOSS_RTOL:g}, relative)")
    print("flags: " + "; ".join(f"{s}: {SETTINGS[s] or '(none)'}" for s in workers), flush=True)


def estimator_phase(workers: dict, times: dict, args) -> None:
    """est.train() under the baseline and under each workload's fastest setting."""
    import numpy as np

    for load in args.steps:
        ratio = {s: np.median(np.array(times[(s, load)]) / np.array(times[("baseline", load)])) for s in workers}
        best = min(ratio, key=ratio.get)
        if best == "baseline":
            print(f"\nest.train() {load}: the baseline is the fastest setting; nothing to compare")
            continue
        pair = {s: workers[s] for s in ("baseline", best)}
        secs = rounds(pair, "est", [load], max(args.rounds, 4))
        n = args.steps[load]
        print(f"\nest.train() {load}, {n} steps per call, {max(args.rounds, 4)} rounds alternating:")
        for s in pair:
            med, lo, hi, r, rlo, rhi = summary(secs[(s, load)], secs[("baseline", load)], n)
            print(f"  {s:18} {med:7.1f} ms/step [{lo:.1f}-{hi:.1f}]  ratio {r:.3f} [{rlo:.3f}-{rhi:.3f}]"
                  f"  (hand loop: {np.median(times[(s, load)]) / n * 1e3:.1f} ms/step)", flush=True)


if __name__ == "__main__":
    if "--worker" in sys.argv:
        i = sys.argv.index("--steps-json")
        worker(json.loads(sys.argv[i + 1]))
    else:
        sys.exit(main(parse_args()))
