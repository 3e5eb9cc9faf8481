"""The benchmark workloads: the models, their host batches and the data-parallel placement.

Shared by `benchmarks/loops.py` (the estimator and the hand-written loops see
the same networks and the same host numpy batches) and `benchmarks/xla_cpu_flags.py`.
Importing this module imports JAX: set XLA_FLAGS first (`set_device_count`).
"""

from __future__ import annotations

import os
import re

import flax.linen as nn
import jax
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from batches import make_batches  # noqa: F401  (re-exported: the benchmarks import it from here)


def set_device_count(n: int) -> None:
    """XLA_FLAGS with `n` host devices (kept: any other flag the caller set); before JAX loads."""
    flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "", os.environ.get("XLA_FLAGS", ""))
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


def mlp(x):
    x = x.reshape(x.shape[0], -1)
    x = nn.relu(nn.Dense(512)(x))
    x = nn.relu(nn.Dense(512)(x))
    return nn.Dense(10)(x)


def cnn(x):
    x = nn.relu(nn.Conv(32, (3, 3))(x))
    x = nn.relu(nn.Conv(64, (3, 3), strides=(2, 2))(x))
    x = nn.relu(nn.Conv(64, (3, 3), strides=(2, 2))(x))
    x = x.mean(axis=(1, 2))
    return nn.Dense(10)(x)


# steps: batches per timed call of each mode (one train()/evaluate()/predict() call), long
# enough that a call's fixed costs stay small: train's final checkpoint (~110 ms on 8 fake
# devices, ~70 ms on 1), evaluate/predict's checkpoint lookup, the first batch's placing
# and the last one's fetch (~17 ms on 1 device). CNN training on 8 fake devices runs ~65
# ms a step: 32 steps (2 s) left the final save (+ waiting for it, ~0.18 s) at ~8% of the
# call and 96 steps at ~3% (ratio 0.961, against 0.996 at 192), so train() takes 192
# (~12 s there, as the MLP's 800; ~30 s on 1 device). Evaluate/predict take 192 too (at
# 96, 1.3 s a call on 1 device, the fixed part was ~1.3%).
# pool: distinct batches, reused in turn; ipl: iterations_per_loop and the scan block.
WORKLOADS = {
    "mlp": dict(net=mlp, shape=(28, 28), batch=256, pool=200, ipl=100,
                steps={"train": 800, "evaluate": 1200, "predict": 1200}),
    "cnn": dict(net=cnn, shape=(32, 32, 3), batch=128, pool=48, ipl=8,
                steps={"train": 192, "evaluate": 192, "predict": 192}),
}


class Net(nn.Module):
    """A workload's network as a Module, for the hand-written loops."""

    fn: object

    @nn.compact
    def __call__(self, x):
        return self.fn(x)


def xent(logits, labels):
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels)


class DataParallel:
    """How a user hand-writes data parallelism: a 1-D mesh of every device, each batch
    sharded on its leading axis, parameters and optimizer state replicated (XLA inserts
    the gradient all-reduce). On one device this is plain placement."""

    def __init__(self) -> None:
        # Auto axes: newer JAX (0.12) makes Explicit ones by default, under which the
        # plain per-example label gather of the loss needs an out_sharding.
        mesh = jax.make_mesh((jax.device_count(),), ("data",), (jax.sharding.AxisType.Auto,))
        self.mesh = mesh
        self.replicated = NamedSharding(mesh, P())
        self.batch = NamedSharding(mesh, P("data"))  # [B, ...]
        self.block = NamedSharding(mesh, P(None, "data"))  # [k, B, ...]: a scan block

    def put_batch(self, tree):
        return jax.device_put(tree, self.batch)

    def put_block(self, tree):
        return jax.device_put(tree, self.block)

    def put_replicated(self, tree):
        return jax.device_put(tree, self.replicated)
