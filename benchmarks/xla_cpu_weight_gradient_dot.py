"""XLA:CPU runs a dense layer's weight gradient as Eigen's dot, at ~2x YNNPACK's time.

    .venv/bin/python benchmarks/xla_cpu_weight_gradient_dot.py [--rounds 7] [--calls 50]

JAX differentiates `x @ w` into `transpose(dot(g, x))`; XLA's algebraic simplifier folds
the transpose into the dot (both operands transposed), a form XLA:CPU's YNNPACK emitter
does not take, so it runs as Eigen's dot. GSPMD-partitioned programs escape it when the
partitioner puts the gradient's all-reduce between the dot and the transpose. Printed, on
one CPU device, for a two-layer MLP's gradient (one replica's shapes of the transformer
benchmark's MLP: 512 tokens, 256 -> 1024 -> 256):

  the dot alone        `dot_general` of [512,1024] and [256,512] contracting 0 and 1 (the
                       folded form) vs [256,512] @ [512,1024] (the canonical form)
  the MLP's gradient   `jax.grad` with `x @ w`, vs with `canonical_dense`'s matmul
                       (benchmarks/transformer.py: the weight gradient as a canonical dot,
                       an optimization barrier, then the transpose)

with the compiled HLO's plain (Eigen) dots and YNNPACK fusions, and the times (median
[min-max] over interleaved rounds, ms per call). See benchmarks/RESULTS.md, "fsdp on
XLA:CPU: the all-reduce form adopted".
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from transformer import canonical_dense  # noqa: E402  (imports no JAX)


def dots(hlo: str) -> tuple[int, int]:
    """(dots outside fusions, i.e. run by Eigen; YNNPACK fusions) of a compiled HLO text."""
    fused = set(re.findall(r"\bfusion\(.*?calls=%?([\w.\-]+)", hlo))
    plain, computation = 0, None
    for line in hlo.splitlines():
        header = re.match(r"^(?:ENTRY )?%?([\w.\-]+) \(", line)
        if header:
            computation = header.group(1)
        elif computation not in fused and re.match(r"^\s+(ROOT )?%\S+ = \S+ dot\(", line):
            plain += 1
    return plain, hlo.count('"kind":"__ynn_fusion"')


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=50)
    args = p.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax

    holder = types.SimpleNamespace(nn=nn)
    canonical_dense(holder)  # holder.nn.Dense: a Dense with the canonical weight gradient
    rng = np.random.RandomState(0)
    x = jnp.asarray(rng.randn(4, 128, 256), jnp.float32)

    def mlp(dense):
        class MLP(nn.Module):
            @nn.compact
            def __call__(self, x):
                return dense(256)(nn.gelu(dense(1024)(x)))

        model = MLP()
        params = model.init(jax.random.PRNGKey(0), x)
        grad = jax.jit(jax.grad(lambda p, x: jnp.mean(model.apply(p, x) ** 2)))
        return grad, (params, x)

    h, dyt = jnp.asarray(rng.randn(512, 1024), jnp.float32), jnp.asarray(rng.randn(256, 512), jnp.float32)
    programs = {
        "dot, folded form": (jax.jit(lambda a, b: lax.dot_general(a, b, (((0,), (1,)), ((), ())))), (h, dyt)),
        "dot, canonical form": (jax.jit(lambda b, a: b @ a), (dyt, h)),
        "MLP gradient, nn.Dense": mlp(nn.Dense),
        "MLP gradient, canonical_dense": mlp(holder.nn.Dense),
    }
    for name, (fn, fargs) in programs.items():
        plain, ynn = dots(fn.lower(*fargs).compile().as_text())
        print(f"{name:32s} plain (Eigen) dots {plain}, YNNPACK fusions {ynn}")
    a, b = (programs[k][0](*programs[k][1]) for k in ("MLP gradient, nn.Dense", "MLP gradient, canonical_dense"))
    same = all(np.allclose(u, v, rtol=1e-4, atol=1e-6) for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
    print(f"the two MLP gradients equal (rtol 1e-4): {same}")
    times = {k: [] for k in programs}
    for r in range(args.rounds):
        for name in list(programs) if r % 2 == 0 else list(reversed(programs)):
            fn, fargs = programs[name]
            jax.block_until_ready(fn(*fargs))
            t = time.perf_counter()
            for _ in range(args.calls):
                out = fn(*fargs)
            jax.block_until_ready(out)
            times[name].append(1e3 * (time.perf_counter() - t) / args.calls)
    print(f"ms per call, median [min-max] over {args.rounds} interleaved rounds of {args.calls} calls, "
          f"load average {os.getloadavg()[0]:.1f}")
    for name, ts in times.items():
        print(f"  {name:32s} {statistics.median(ts):.3f} [{min(ts):.3f}-{max(ts):.3f}]")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
