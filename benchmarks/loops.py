"""Train, evaluate and predict throughput: TPUEstimator vs hand-written JAX loops.

    .venv/bin/python benchmarks/loops.py [--devices 1|8] [--modes train,evaluate,predict]
        [--workloads mlp,cnn] [--rounds N] [--quick] [--eval-metrics metric_fn|ops]

Workloads (benchmarks/workloads.py): an MLP (784-512-512-10, batch 256) and a
CNN (32x32x3, batch 128), Adam, the same host numpy batches for every
contender. `--devices 8` runs on 8 fake CPU devices (XLA_FLAGS set before JAX
loads): the estimator replicates over them and the references are the same
global batch in data parallelism (a 1-D mesh, batch sharded, parameters
replicated). On this 2-core VM 8 devices measure the host side and the
collectives, not a speed-up.

Contenders per (workload, mode):
  per-step, scan  the hand-written loops of benchmarks/hand_loops.py (see there
                  for how each is written, and why the scan block is stacked
                  inside the timed region, overlapped with the previous block);
                  training on several devices also as per-step/shard_map and
                  scan/shard_map (each device's step on its slice, gradients
                  pmean'ed): the faster of all forms is the reference
  estimator       whole `est.train(input_fn, steps=N)`, `est.evaluate(input_fn,
                  steps=N)` (accuracy as a TPUEstimator user writes it:
                  `eval_metrics=(metric_fn, [labels, logits])`, or with
                  `--eval-metrics ops`, an `EstimatorSpec` with
                  `eval_metric_ops` and `eval_on_tpu=False`), and
                  `list(est.predict(input_fn, yield_single_examples=False))`:
                  setup, restore, feeding, hooks and train's final checkpoint
                  included

Before the rounds each reference is probed on one block (`iterations_per_loop`
batches, compiled ahead of time; the scan form first on a block of 2); a form
over 2x slower than the other cannot be the faster one and is left out of the
rounds (XLA:CPU runs the CNN's training ~25x slower inside `lax.scan`), its
probe rate printed.

The contenders run interleaved, one call each per round, in ABBA order (this
VM's speed drifts by 10-20% over minutes). Printed per (workload, mode):
examples/sec (best round of each), and estimator / faster reference: the
median over rounds of the ratio within a round (the headline, robust to
drift), the ratio of the best rounds, the per-round min-max, the mean and its
standard error; and how many XLA programs the estimator's second call and its
later calls compiled (`loops/compiles.count_compiles`; target 0).

Time: the default (7 rounds) takes ~18 min with `--devices 1` and ~35 with
`--devices 8` on the project's 2-core VM (`--workloads`/`--modes` run a part);
`--quick` (a quarter of the batches, 3 rounds) a few minutes.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from workloads import WORKLOADS, set_device_count  # noqa: E402  (imports JAX after the flags)

MODES = ("train", "evaluate", "predict")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, choices=(1, 8), default=1)
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of " + ",".join(MODES))
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated subset of mlp,cnn")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 7; --quick 3)")
    parser.add_argument("--quick", action="store_true", help="a quarter of the batches, 3 rounds (a smoke run)")
    parser.add_argument("--eval-metrics", choices=("metric_fn", "ops"), default="metric_fn")
    args = parser.parse_args(argv)
    args.modes = [m for m in args.modes.split(",") if m]
    args.workloads = [w for w in args.workloads.split(",") if w]
    for m in args.modes:
        if m not in MODES:
            parser.error(f"unknown mode {m!r}; choose from {', '.join(MODES)}")
    for w in args.workloads:
        if w not in WORKLOADS:
            parser.error(f"unknown workload {w!r}; choose from {', '.join(WORKLOADS)}")
    if args.rounds is None:
        args.rounds = 3 if args.quick else 7
    return args


ARGS = parse_args() if __name__ == "__main__" else None
if ARGS is not None:
    set_device_count(ARGS.devices)

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import tpu_estimator as te  # noqa: E402
from hand_loops import KINDS, SHARD_MAP_KINDS, reference  # noqa: E402
from tpu_estimator import metrics  # noqa: E402
from tpu_estimator.loops.compiles import count_compiles  # noqa: E402
from workloads import DataParallel, make_batches, xent  # noqa: E402


def model_fn_for(net, eval_metrics: str):
    """The workload's model_fn, as a TPUEstimator user writes it."""

    def metric_fn(labels, logits):
        return {"accuracy": metrics.accuracy(labels, logits.argmax(-1))}

    def model_fn(features, labels, mode, params):
        logits = net(features)
        if mode == te.ModeKeys.PREDICT:
            return te.TPUEstimatorSpec(
                mode, predictions={"classes": logits.argmax(-1), "probabilities": jax.nn.softmax(logits)}
            )
        loss = xent(logits, labels).mean()
        if mode == te.ModeKeys.TRAIN:
            return te.TPUEstimatorSpec(mode, loss=loss, train_op=optax.adam(1e-3))
        if eval_metrics == "ops":
            return te.EstimatorSpec(mode, loss=loss, eval_metric_ops=metric_fn(labels, logits))
        return te.TPUEstimatorSpec(mode, loss=loss, eval_metrics=(metric_fn, [labels, logits]))

    return model_fn


def build_estimator(workload: dict, eval_metrics: str) -> te.TPUEstimator:
    config = te.RunConfig(
        model_dir=tempfile.mkdtemp(prefix="bench_"),
        save_checkpoints_secs=None,
        log_step_count_steps=None,
        save_summary_steps=None,
        tpu_config=te.TPUConfig(iterations_per_loop=workload["ipl"]),
    )
    b = workload["batch"]
    return te.TPUEstimator(
        model_fn_for(workload["net"], eval_metrics), config=config, train_batch_size=b, eval_batch_size=b,
        predict_batch_size=b, eval_on_tpu=eval_metrics != "ops",
    )


def estimator_call(est: te.TPUEstimator, mode: str, batches: list):
    """One whole call of `mode` over `batches` (returns what the caller gets)."""
    if mode == "train":
        return est.train(lambda params: iter(batches), steps=len(batches))
    if mode == "evaluate":
        return est.evaluate(lambda params: iter(batches), steps=len(batches))
    return list(est.predict(lambda params: (x for x, _ in batches), yield_single_examples=False))


class EstimatorContender:
    """`timed()`: one estimator call, in seconds; compilations counted per call."""

    def __init__(self, est: te.TPUEstimator, mode: str, batches: list) -> None:
        self.est, self.mode, self.batches = est, mode, batches
        self.compiles: list[tuple[int, list[str]]] = []
        estimator_call(est, mode, batches)  # warm-up: compiles (train: "auto" decides)

    def timed(self) -> float:
        with count_compiles() as c:
            t = time.perf_counter()
            estimator_call(self.est, self.mode, self.batches)
            seconds = time.perf_counter() - t
        self.compiles.append((c.count, c.names))
        return seconds


def steps_for(workload: dict, mode: str, quick: bool) -> int:
    ipl = workload["ipl"]
    steps = max(ipl, workload["steps"][mode] // (4 if quick else 1))
    return steps - steps % ipl


def probe_rates(refs: dict, workload: dict) -> dict[str, float]:
    """Examples/sec of each reference on one block (`ipl` batches); the scan form first on
    a block of 2, and on a whole block only if that is not already over 2x slower.

    A scan probe is the first run of its program, which pays one-time costs (on 1 device
    the MLP's first block of 2 measured under half its later rate): one over 2x slower
    than the per-step form is run once more and the faster of the two kept."""
    ipl, b = workload["ipl"], workload["batch"]
    probe = {}
    for step_kind in (k for k in refs if k.startswith("per-step")):
        probe[step_kind] = ipl * b / refs[step_kind](ipl)
    short = min(2, ipl)
    for scan_kind in (k for k in refs if k.startswith("scan")):
        per_step = probe[scan_kind.replace("scan", "per-step")]

        def rate(k: int) -> float:
            r = k * b / refs[scan_kind](k)
            return max(r, k * b / refs[scan_kind](k)) if r * 2 < per_step else r

        refs[scan_kind].prepare(short)
        probe[scan_kind] = rate(short)
        if probe[scan_kind] * 2 >= per_step and short < ipl:
            probe[scan_kind] = rate(ipl)
    return probe


def measure(name: str, workload: dict, mode: str, est: te.TPUEstimator, dp: DataParallel, args) -> dict:
    """Rounds of one (workload, mode): returns the row to print."""
    n = steps_for(workload, mode, args.quick)
    batches = make_batches(workload["shape"], workload["batch"], n, workload["pool"])
    kinds = KINDS + (SHARD_MAP_KINDS if mode == "train" and jax.device_count() > 1 else ())
    refs = {kind: reference(workload, batches, mode, kind, dp) for kind in kinds}
    b = workload["batch"]
    probe = probe_rates(refs, workload)
    left_out = {k: v for k, v in probe.items() if v * 2 < max(probe.values())}
    contenders = {k: refs[k] for k in kinds if k not in left_out}
    est_contender = EstimatorContender(est, mode, batches)
    contenders["estimator"] = est_contender.timed
    rates = {k: [] for k in contenders}
    for r in range(args.rounds):
        for k in list(contenders)[:: 1 if r % 2 == 0 else -1]:  # ABBA: linear drift cancels
            rates[k].append(n * b / contenders[k]())
    refs_in = [k for k in kinds if k in rates]
    paired = np.array([e / max(rates[k][i] for k in refs_in) for i, e in enumerate(rates["estimator"])])
    best = {k: max(v) for k, v in rates.items()}
    return dict(
        name=name, mode=mode, n=n, best=best, probe=probe, left_out=left_out, paired=paired,
        ratio_best=best["estimator"] / max(best[k] for k in refs_in),
        compiles=est_contender.compiles,
        strategy=est.loop_strategy if mode == "train" else est.inference_loop_strategy,
    )


def report(row: dict) -> float:
    paired = row["paired"]
    median = float(np.median(paired))
    se = float(np.std(paired, ddof=1) / np.sqrt(len(paired))) if len(paired) > 1 else float("nan")
    cols = []
    for k in (*KINDS, "estimator"):
        if k in row["best"]:
            cols.append(f"{row['best'][k]:9.0f}")
        else:
            cols.append(f"{'(' + format(row['left_out'][k], '.0f') + ')':>9}")
    second, later = row["compiles"][0], sum(c for c, _ in row["compiles"][1:])
    print(
        f"{row['name']:4} {row['mode']:8} {row['n']:5d} {' '.join(cols)} {median:7.3f} {row['ratio_best']:6.3f}"
        f" {paired.min():.3f}-{paired.max():.3f} {np.mean(paired):.3f}±{se:.3f}"
        f" {second[0]:3d} {later:3d}  {row['strategy']}"
        + (f"  2nd-call compiled: {', '.join(second[1])}" if second[0] else ""),
        flush=True,
    )
    extra = [k for k in SHARD_MAP_KINDS if k in row["best"] or k in row["left_out"]]
    if extra:
        print("     shard_map references (in the faster-reference ratio): " + ", ".join(
            f"{k} {row['best'][k]:.0f}" if k in row["best"] else f"{k} ({row['left_out'][k]:.0f}, left out)"
            for k in extra), flush=True)
    return median


def main(args) -> int:
    print(
        f"jax {jax.__version__}, backend {jax.default_backend()}, {jax.device_count()} device(s),"
        f" {args.rounds} rounds{' (quick)' if args.quick else ''}, eval metrics: {args.eval_metrics}",
        flush=True,
    )
    print(
        "ex/s: best round of each; (x): left out of the rounds, its one-block probe rate.\n"
        "ratio = estimator / faster reference per round: median, best rounds, min-max, mean±s.e.;"
        " compiles of the estimator's 2nd call and of all later calls (target 0 0)"
    )
    print(f"{'work':4} {'mode':8} {'steps':>5} {'per-step':>9} {'scan':>9} {'estimator':>9}"
          f" {'median':>7} {'best':>6} {'min-max':>11} {'mean±s.e.':>11} {'2nd':>3} {'later':>3}  strategy")
    dp = DataParallel()
    worst = float("inf")
    for name in args.workloads:
        w = WORKLOADS[name]
        est = build_estimator(w, args.eval_metrics)
        train = make_batches(w["shape"], w["batch"], steps_for(w, "train", args.quick), w["pool"])
        estimator_call(est, "train", train)  # a checkpoint for evaluate/predict; compiles train
        for mode in args.modes:
            worst = min(worst, report(measure(name, w, mode, est, dp, args)))
    print(f"estimator / faster reference, median over rounds, worst (workload, mode): {worst:.3f} (target >= 0.97)")
    return 0


if __name__ == "__main__":
    sys.exit(main(ARGS))
