"""The "fsdp" step's gradient collectives alone on 8 fake XLA:CPU devices.

    .venv/bin/python benchmarks/cpu_collectives.py [--rounds 15]

The 26 gradients that `benchmarks/transformer.py --size cpu` splits over the
devices (approximately: the 4096x256 embedding, 16 attention matrices 256x256,
4 MLP pairs 256x1024 / 1024x256, the 256x4096 output), whole on every device,
reduced in a `shard_map` over "data" in each form; 5 program calls per timed
call, the forms interleaved per round; printed per call, median [min-max]:

  26 reduce-scatters        one `psum_scatter` per leaf (the gather's transpose)
  1 all-reduce + slices     `pmean` of all leaves (XLA combines them) and each
                            replica's slice (collectives.slice_mean)
  1 reduce-scatter (flat)   the leaves concatenated shard-major, one `psum_scatter`
  26 all-gathers            one `all_gather` per leaf of its 1/8 shard

What the collectives cost with nothing else running between them: no waiting
for device threads that are still computing, as inside a training step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15)
    args = p.parse_args(argv)
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax
    from jax.sharding import NamedSharding, PartitionSpec as P

    n = 8
    mesh = jax.make_mesh((n,), ("data",))
    shapes = [(4096, 256)] + [(256, 256)] * 16 + [(256, 1024), (1024, 256)] * 4 + [(256, 4096)]

    def scatters(gs):
        return [lax.psum_scatter(g, "data", scatter_dimension=0, tiled=True) for g in gs]

    def all_reduce(gs):
        i = lax.axis_index("data")
        return [lax.dynamic_slice_in_dim(g, i * (g.shape[0] // n), g.shape[0] // n, 0) for g in lax.pmean(gs, "data")]

    def flat(gs):
        return lax.psum_scatter(jnp.concatenate([g.reshape(n, -1) for g in gs], axis=1), "data", tiled=True)

    def gathers(gs):
        return [lax.all_gather(g[: g.shape[0] // n], "data", axis=0, tiled=True) for g in gs]

    forms = {"26 reduce-scatters": scatters, "1 all-reduce + slices": all_reduce,
             "1 reduce-scatter (flat)": flat, "26 all-gathers": gathers}
    rng = np.random.default_rng(0)
    xs = [jax.device_put(rng.random((n * s[0], *s[1:]), np.float32), NamedSharding(mesh, P("data"))) for s in shapes]
    programs = {}
    for name, f in forms.items():
        programs[name] = jax.jit(jax.shard_map(lambda *gs, f=f: f(list(gs)), mesh=mesh, in_specs=P("data"),
                                               out_specs=P("data"), check_vma=False))
        jax.block_until_ready(programs[name](*xs))
    wall, cpu = {k: [] for k in forms}, {k: [] for k in forms}
    for r in range(args.rounds):
        for name in list(forms) if r % 2 == 0 else list(reversed(forms)):
            c, t = time.process_time(), time.perf_counter()
            for _ in range(5):
                out = programs[name](*xs)
            jax.block_until_ready(out)
            wall[name].append((time.perf_counter() - t) / 5 * 1e3)
            cpu[name].append((time.process_time() - c) / 5 * 1e3)
    total = sum(int(np.prod(s)) for s in shapes)
    print(f"8 CPU devices, {len(shapes)} leaves, {total / 1e6:.2f}M float32 per device (whole gradients), "
          f"{args.rounds} rounds, load average {os.getloadavg()[0]:.1f}")
    for name in forms:
        w, c = wall[name], cpu[name]
        print(f"  {name:26s} wall ms {statistics.median(w):7.1f} [{min(w):.1f}-{max(w):.1f}]  "
              f"cpu ms {statistics.median(c):7.1f} [{min(c):.1f}-{max(c):.1f}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
