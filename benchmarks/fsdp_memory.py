"""Per-device bytes of parameters and optimizer state, "replicated" vs "fsdp".

    .venv/bin/python benchmarks/fsdp_memory.py [--devices 2 4 8] [--json]

An MLP 512-1024-2048-1024-16 (4.7M float32 parameters, Adam: 3 copies) trained
by `TPUEstimator` for one scan loop of 4 steps on N fake CPU devices (one fresh
process per N), with `TPUConfig(parameter_sharding=...)`. Measured, none of it
dependent on this machine's speed:

  live       bytes of params + opt_state on device 0: the sum of each live
             array's `addressable_shards[0].data.nbytes` after training
  arg/out/tmp  `compiled.memory_analysis()` of the training program (the scan
             loop, lowered again on the live state): argument, output and temp
             bytes per device
  in loop / once  collective result bytes per device in the compiled HLO
             (all-gather, reduce-scatter, all-reduce), inside the scan's
             while body (paid every step) and outside it (once per program)

Settings: "replicated", "fsdp" (on XLA:CPU: the parameters gathered before the loss and
the whole gradients all-reduced, then sliced: parallel/collectives.py
`reduces_whole_gradients`), and "fsdp-rs": "fsdp" in the form the other backends
compile (gathered inside the loss, each gradient reduce-scattered), forced here on
XLA:CPU as tests/parallel/test_fsdp.py forces it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

STEPS = 4
BATCH_PER_DEVICE = 8
WIDTHS = (512, 1024, 2048, 1024, 16)
COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")


def model_fn(features, labels, mode, params):
    import flax.linen as nn
    import optax

    import tpu_estimator as te

    h = features
    for width in WIDTHS[1:-1]:
        h = nn.relu(nn.Dense(width)(h))
    logits = nn.Dense(WIDTHS[-1])(h)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    return te.TPUEstimatorSpec(mode, loss=loss, train_op=optax.adam(1e-3))


_DTYPE_BYTES = {"f32": 4, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u8": 1, "s8": 1, "pred": 1}


def _shape_bytes(text: str) -> int:
    total = 0
    for dtype, dims in re.findall(r"\b(f32|f16|bf16|s32|u32|f64|s64|u8|s8|pred)\[([\d,]*)\]", text):
        n = 1
        for d in filter(None, dims.split(",")):
            n *= int(d)
        total += n * _DTYPE_BYTES[dtype]
    return total


def collective_bytes(hlo: str) -> dict[str, dict[str, int]]:
    """{"loop"|"once": {op: result bytes}} of the collectives in an HLO module's text; "loop"
    counts those in computations reached from a while loop's body."""
    computations: dict[str, list[str]] = {}
    current = None
    for line in hlo.splitlines():
        head = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$", line)
        if head:
            current = head.group(1)
            computations[current] = []
        elif current is not None:
            computations[current].append(line)
    calls = {}
    for name, lines in computations.items():
        text = "\n".join(lines)
        called = set(re.findall(r"(?:calls|body|condition|to_apply)=%?([\w.\-]+)", text))
        for group in re.findall(r"branch_computations=\{([^}]*)\}", text):
            called |= {c.strip().lstrip("%") for c in group.split(",")}
        calls[name] = called
    bodies = {b for lines in computations.values() for line in lines for b in re.findall(r"body=%?([\w.\-]+)", line)}
    in_loop, todo = set(), list(bodies)
    while todo:
        name = todo.pop()
        if name in in_loop or name not in computations:
            continue
        in_loop.add(name)
        todo.extend(calls.get(name, ()))
    out: dict[str, dict[str, int]] = {"loop": {}, "once": {}}
    for name, lines in computations.items():
        where = "loop" if name in in_loop else "once"
        for line in lines:
            m = re.search(r"=\s*(.*?)\s+(" + "|".join(COLLECTIVES) + r")(?:-start)?\(", line)
            if m:
                out[where][m.group(2)] = out[where].get(m.group(2), 0) + _shape_bytes(m.group(1))
    return out


def measure(sharding: str) -> dict:
    """One run in this process (its device count set by XLA_FLAGS)."""
    import tempfile

    import jax
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    import tpu_estimator as te
    from tpu_estimator.loops import train as train_loops

    if sharding == "fsdp-rs":  # the reduce-scatter form of the accelerators, on XLA:CPU
        train_loops.reduces_whole_gradients = lambda: False
    n = jax.device_count()
    batch = BATCH_PER_DEVICE * n
    rng = np.random.RandomState(0)
    x = rng.randn(STEPS * batch, WIDTHS[0]).astype(np.float32)
    y = rng.randint(0, WIDTHS[-1], STEPS * batch).astype(np.int32)

    def input_fn(params):
        b = params["batch_size"]
        for i in range(0, len(x), b):
            yield x[i : i + b], y[i : i + b]

    class Probe(te.SessionRunHook):
        def before_run(self, run_context):
            return te.SessionRunArgs({"state": "state"})

        def after_run(self, run_context, run_values):
            self.state = run_values.results["state"]

        def end(self, session):
            self.program = session.runtime(te.ModeKeys.TRAIN).program("scan")

    cfg = te.RunConfig(
        model_dir=tempfile.mkdtemp(), log_step_count_steps=None, save_checkpoints_steps=None,
        tpu_config=te.TPUConfig(iterations_per_loop=STEPS, loop_strategy="scan",
                                  parameter_sharding=sharding.split("-")[0]),
    )
    est = te.TPUEstimator(model_fn, config=cfg, train_batch_size=batch)
    probe = Probe()
    est.train(input_fn, steps=STEPS, hooks=[probe])
    state = probe.state
    leaves = jax.tree.leaves((state.params, state.opt_state))
    live = sum(a.addressable_shards[0].data.nbytes for a in leaves)
    whole = sum(a.nbytes for a in leaves)
    mesh = state.step.sharding.mesh
    blocks = jax.device_put(
        (x.reshape(STEPS, batch, -1), y.reshape(STEPS, batch)), NamedSharding(mesh, P(None, "data"))
    )
    compiled = probe.program.lower(state, blocks).compile()
    mem = compiled.memory_analysis()
    return {
        "devices": n,
        "sharding": sharding,
        "params": sum(a.size for a in jax.tree.leaves(state.params)),
        "whole_bytes": whole,
        "live_bytes": live,
        "argument_bytes": mem.argument_size_in_bytes,
        "output_bytes": mem.output_size_in_bytes,
        "temp_bytes": mem.temp_size_in_bytes,
        "collectives": collective_bytes(compiled.as_text()),
    }


def _child(devices: int, sharding: str) -> dict:
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu")
    out = subprocess.run(
        [sys.executable, __file__, "--child", sharding], env=env, check=True, capture_output=True, text=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _mb(b: int) -> str:
    return f"{b / 2**20:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child)))
        return
    rows = [_child(n, s) for n in args.devices for s in ("replicated", "fsdp", "fsdp-rs")]
    if args.json:
        print(json.dumps(rows, indent=1))
    print(f"MLP {'-'.join(map(str, WIDTHS))}, {rows[0]['params']:,} params, Adam; "
          f"params + opt_state whole: {_mb(rows[0]['whole_bytes'])} MiB; a scan loop of {STEPS} steps")
    print("| devices | parameter_sharding | live params+opt / device (MiB) | share of whole | compiled argument "
          "(MiB) | output (MiB) | temp (MiB) | collectives in the loop body, per step (MiB) | "
          "collectives once per program (MiB) |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | --- | --- |")
    for r in rows:
        def ops(d):
            return ", ".join(f"{k} {_mb(v)}" for k, v in sorted(d.items())) or "none"

        print(f"| {r['devices']} | {r['sharding']} | {_mb(r['live_bytes'])} | {r['live_bytes'] / r['whole_bytes']:.3f} "
              f"| {_mb(r['argument_bytes'])} | {_mb(r['output_bytes'])} | {_mb(r['temp_bytes'])} "
              f"| {ops(r['collectives']['loop'])} | {ops(r['collectives']['once'])} |")


if __name__ == "__main__":
    main()
