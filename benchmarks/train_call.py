"""Where one `TPUEstimator.train(steps=N)` call spends its time outside the compiled program.

    .venv/bin/python benchmarks/train_call.py [--devices 8] [--ipl 8] [--rounds 5]
        [--parameter_sharding fsdp]

The transformer of benchmarks/transformer.py at `--size cpu` (4.2M parameters, AdamW:
a 50.9 MB checkpoint of 208 arrays), one loop of `--ipl` steps per call, after two
warm-up calls. The library's public functions are wrapped with timers:

  to first dispatch   from the call to the first program's dispatch (checkpoint
                      lookup and verification, input opening, state reuse)
  find_checkpoint     Core.find_checkpoint (listing, digests verified)
  fetch               Engine.fetch: waiting for the loop's outputs (~ the program)
  save                Checkpointer.save: the caller's part of Orbax's asynchronous
                      save (state copied to the host, the step directory made)
  wait                Checkpointer.wait: the write finishing (train() returns after it)
  digests             integrity.commit_digests (on Orbax's thread, inside `wait`)

Printed: median [min-max] over `--rounds` calls, and the process CPU seconds per call.
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from transformer import load_example  # noqa: E402  (imports no JAX: XLA_FLAGS are set first)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=int, default=8)
    p.add_argument("--ipl", type=int, default=8)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--parameter_sharding", default=None)
    args = p.parse_args(argv)
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={args.devices}"
    ).strip()
    lm = load_example()
    import jax

    import tpu_estimator as te
    from tpu_estimator.checkpoint import integrity, manager
    from tpu_estimator.estimator import core, engine, runtime

    spent: dict[str, float] = collections.defaultdict(float)
    first: list[float] = []

    def timed(owner, name, label, *, static=False):
        fn = getattr(owner, name)

        @functools.wraps(fn)
        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[label] += time.perf_counter() - t

        setattr(owner, name, staticmethod(wrapper) if static else wrapper)

    timed(core.Core, "find_checkpoint", "find_checkpoint")
    timed(engine.Engine, "fetch", "fetch", static=True)
    timed(manager.Checkpointer, "save", "save")
    timed(manager.Checkpointer, "wait", "wait")
    timed(integrity, "commit_digests", "digests")
    program = runtime.Runtime.program

    def marking(self, kind):
        built = program(self, kind)
        if kind not in ("scan", "step"):
            return built

        def call(*a):
            if not first:
                first.append(time.perf_counter())
            return built(*a)

        return call

    runtime.Runtime.program = marking
    size = lm.Size(vocab=4096, width=256, layers=4, heads=8, seq_len=128, batch=32)
    batches = [(lambda s: ({"tokens": s[:, :-1]}, s[:, 1:]))(lm.sequences(size, size.batch, seed=i))
               for i in range(args.ipl)]
    options = {"parameter_sharding": args.parameter_sharding} if args.parameter_sharding else {}
    config = te.RunConfig(model_dir=tempfile.mkdtemp(prefix="bench_call_"), save_checkpoints_secs=None,
                          save_summary_steps=None, log_step_count_steps=None,
                          tpu_config=te.TPUConfig(iterations_per_loop=args.ipl, **options))
    est = te.TPUEstimator(lm.model_fn, config=config, train_batch_size=size.batch,
                          params={"size": size, "learning_rate": 1e-3, "steps": 10**6})

    def call():
        est.train(lambda params: iter(batches), steps=args.ipl)

    for _ in range(2):
        call()
    rows: dict[str, list[float]] = collections.defaultdict(list)
    for _ in range(args.rounds):
        spent.clear()
        first.clear()
        c, t = time.process_time(), time.perf_counter()
        call()
        rows["call (wall)"].append(time.perf_counter() - t)
        rows["call (process CPU)"].append(time.process_time() - c)
        rows["to first dispatch"].append(first[0] - t)
        for label in ("find_checkpoint", "fetch", "save", "wait", "digests"):
            rows[label].append(spent[label])
        rows["outside fetch (wall)"].append(rows["call (wall)"][-1] - spent["fetch"])
    print(f"{jax.device_count()} devices, {args.ipl} steps per call, options {options or 'none'}, "
          f"{args.rounds} calls, load average {os.getloadavg()[0]:.1f}")
    for label, xs in rows.items():
        print(f"  {label:22s} {statistics.median(xs):7.3f} s [{min(xs):.3f}-{max(xs):.3f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
