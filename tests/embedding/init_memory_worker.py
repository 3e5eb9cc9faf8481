"""One process of the init-memory test (tests/embedding/test_initial.py): the peak host
memory of drawing one large embedding table (Adagrad: a slot as large) on the devices
XLA_FLAGS gives this process.

    python init_memory_worker.py ROWS DIM STRATEGY HOW ...

For each HOW in turn: `pinned`, the init program `ShardedTables.init` compiles (each
device draws and orders its own rows: embedding/initial.py); or `whole`, as tpu_estimator
0.2 built it, the logical table drawn and put in storage order with no constraint (XLA
computes it whole on every device). Both are compiled first; before each run freed memory
is handed back (malloc_trim) and the peak resident memory reset (/proc/self/clear_refs).
It prints one JSON line per run: the peak's growth during the init (VmHWM), the bytes this
process's devices hold after it, and the compiled program's per-device memory analysis.
"""

from __future__ import annotations

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from tpu_estimator.embedding import AdagradParameters, EmbeddingConfigSpec, FeatureConfig, TableConfig
from tpu_estimator.embedding.sharded import EmbeddingState, ShardedTables
from tpu_estimator.feeding.host_memory import trim
from restore_memory_worker import status_kib  # this folder: the script's sys.path[0]


def make_tables(rows: int, dim: int, strategy: str) -> ShardedTables:
    spec = EmbeddingConfigSpec(
        feature_to_config_dict={"ids": FeatureConfig("t")},
        table_to_config_dict={"t": TableConfig(rows, dim, sharding="row")},
        optimization_parameters=AdagradParameters(0.1),
        partition_strategy=strategy,
    )
    return ShardedTables(spec, Mesh(np.array(jax.devices()), ("data",)))


def whole_build(tables: ShardedTables, key: jax.Array) -> EmbeddingState:
    """The initial state as tpu_estimator 0.2 built it: the logical table, then storage order."""
    config, layout = tables.spec.tables["t"], tables.layouts["t"]
    logical = config.init_fn()(jax.random.fold_in(key, 0), (config.vocabulary_size, config.dimension), jnp.float32)
    storage = layout.to_storage(logical)
    slot = jnp.full(storage.shape, 0.1, jnp.float32)
    return EmbeddingState({"t": storage}, {"t": {"accumulator": slot}}, {"t": jnp.asarray(tables.layout_code()["t"])})


def main(argv: list[str]) -> None:
    rows, dim, strategy = int(argv[0]), int(argv[1]), argv[2]
    tables, key = make_tables(rows, dim, strategy), jax.random.PRNGKey(0)
    builds = {"pinned": tables.build, "whole": lambda k: whole_build(tables, k)}
    programs = {how: jax.jit(builds[how], out_shardings=tables.state_shardings()).lower(key).compile() for how in argv[3:]}
    for how, program in programs.items():
        trim()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM := VmRSS
        before = status_kib("VmRSS")
        state = jax.block_until_ready(program(key))
        peak = status_kib("VmHWM")
        own = sum(s.data.nbytes for leaf in jax.tree.leaves(state) for s in leaf.addressable_shards)
        del state
        analysis = program.memory_analysis()
        print(json.dumps({
            "devices": jax.device_count(), "strategy": strategy, "how": how,
            "peak_growth": (peak - before) * 1024, "own": own, "table": rows * dim * 4,
            "temp_per_device": analysis.temp_size_in_bytes, "output_per_device": analysis.output_size_in_bytes,
        }), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
