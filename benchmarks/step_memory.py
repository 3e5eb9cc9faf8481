"""Activation memory of one train step: gradient accumulation, rematerialization, precision.

    .venv/bin/python benchmarks/step_memory.py [--layers 16] [--width 512] [--batch 1024]

A deep MLP whose activations dominate (`--layers` tanh Dense layers of
`--width`, batch `--batch`, Adam), the estimator's own train step
(loops/train.py `step_program`, one device), compiled once per setting; the
numbers are XLA's `compiled.memory_analysis()` of that program, not a
measurement of this machine: `temp` is the scratch memory the step needs
beyond its arguments and outputs (activations kept for the backward pass,
gradients, the optimizer's temporaries). Settings: gradient_accumulation_steps
k, remat_policy, precision_policy, as `TPUConfig` takes them; and, for
comparison, the model_fn wrapping each layer in Flax's `nn.remat` itself.
"""

from __future__ import annotations

import argparse
import dataclasses
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import tpu_estimator as te  # noqa: E402
from tpu_estimator.loops.train import init_program, step_program  # noqa: E402
from tpu_estimator.model.call import check_model_fn  # noqa: E402
from tpu_estimator.model.module import bind_model  # noqa: E402
from tpu_estimator.model.precision import Precision  # noqa: E402
from tpu_estimator.model.spec_view import view_spec  # noqa: E402
from tpu_estimator.parallel.mesh import Topology  # noqa: E402

SETTINGS = [  # (k, remat_policy, precision_policy, nn.remat around each layer in model_fn)
    (1, None, "float32", False),
    (2, None, "float32", False),
    (4, None, "float32", False),
    (8, None, "float32", False),
    (1, "full", "float32", False),
    (1, "dots_with_no_batch_dims_saveable", "float32", False),
    (1, "dots_saveable", "float32", False),
    (1, "nothing_saveable", "float32", False),
    (4, "full", "float32", False),
    (1, None, "mixed_bfloat16", False),
    (4, "full", "mixed_bfloat16", False),
    (1, None, "float32", True),
    (4, None, "float32", True),
]


class Block(nn.Module):
    """One layer: Dense + tanh ("tanh"), or LayerNorm(gelu(Dense)) + residual ("ln_gelu": more
    elementwise intermediates per matmul, as in a transformer's MLP)."""

    width: int
    kind: str

    @nn.compact
    def __call__(self, x):
        if self.kind == "tanh":
            return jnp.tanh(nn.Dense(self.width)(x))
        return x + nn.LayerNorm()(nn.gelu(nn.Dense(self.width)(x)))


def deep_mlp_model_fn(features, labels, mode, params):
    x = features["x"]
    block = nn.remat(Block) if params["layer_remat"] else Block  # the user's own per-layer remat
    for _ in range(params["layers"]):
        x = block(params["width"], params["block"])(x)
    loss = jnp.mean((nn.Dense(1)(x)[:, 0] - labels) ** 2)
    return te.TPUEstimatorSpec(mode, loss=loss, train_op=optax.adam(1e-3))


def memory(args: argparse.Namespace, k: int, remat: str | None, policy: str, layer_remat: bool) -> dict[str, int]:
    params = {"layers": args.layers, "width": args.width, "block": args.block, "layer_remat": layer_remat}
    model = bind_model(deep_mlp_model_fn, check_model_fn(deep_mlp_model_fn), te.ModeKeys.TRAIN, params, None,
                       args.batch // k)
    model = dataclasses.replace(model, accumulation_steps=k, remat_policy=remat, precision=Precision(policy))
    view = lambda spec: view_spec(spec, te.ModeKeys.TRAIN, use_tpu=True, eval_on_tpu=True)  # noqa: E731
    topology = Topology.create(use_tpu=False)
    x = np.zeros((args.batch, args.width), np.float32)
    y = np.zeros((args.batch,), np.float32)
    state = jax.eval_shape(init_program(model, view, topology, 0, True), {"x": x[: args.batch // k]}, y[: args.batch // k])
    compiled = step_program(model, view, topology).lower(state, ({"x": x}, y)).compile()
    m = compiled.memory_analysis()
    return {"temp": m.temp_size_in_bytes, "arguments": m.argument_size_in_bytes, "outputs": m.output_size_in_bytes}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--block", choices=["tanh", "ln_gelu"], default="tanh")
    args = p.parse_args()
    n_params = args.layers * (args.width * args.width + args.width) + args.width + 1
    print(f"deep MLP: {args.layers} x {args.block} blocks of width {args.width}, batch {args.batch}, Adam, {n_params / 1e6:.1f}M "
          f"parameters ({n_params * 4 / 2**20:.0f} MiB float32); jax {jax.__version__}, {jax.devices()[0].platform}")
    print("| k | remat_policy | precision_policy | nn.remat per layer | temp MiB | vs first row | arguments MiB |")
    print("| --- | --- | --- | --- | ---: | ---: | ---: |")
    base = None
    for k, remat, policy, layer_remat in SETTINGS:
        m = memory(args, k, remat, policy, layer_remat)
        base = base or m["temp"]
        print(f"| {k} | {remat} | {policy} | {'yes' if layer_remat else 'no'} | {m['temp'] / 2**20:.1f} | "
              f"{m['temp'] / base:.2f}x | "
              f"{m['arguments'] / 2**20:.1f} |", flush=True)
    hand_written_reference(args)


def hand_written_reference(args: argparse.Namespace) -> None:
    """Plain JAX, no estimator: grad of the same depth of LayerNorm(gelu(x @ w)) + x layers, without
    remat, with `jax.checkpoint` around each layer, and around the whole forward pass."""

    def layer(w: jax.Array, x: jax.Array) -> jax.Array:
        h = jax.nn.gelu(x @ w)
        m = h.mean(-1, keepdims=True)
        return x + (h - m) * jax.lax.rsqrt(((h - m) ** 2).mean(-1, keepdims=True) + 1e-6)

    def loss(ws: list[jax.Array], x: jax.Array, per_layer: bool) -> jax.Array:
        f = jax.checkpoint(layer) if per_layer else layer
        for w in ws:
            x = f(w, x)
        return (x**2).mean()

    ws = [jnp.zeros((args.width, args.width))] * args.layers
    x = jnp.zeros((args.batch, args.width))
    fns = {
        "none": lambda ws, x: jax.grad(loss)(ws, x, False),
        "jax.checkpoint per layer": lambda ws, x: jax.grad(loss)(ws, x, True),
        "jax.checkpoint of the whole forward": lambda ws, x: jax.grad(jax.checkpoint(loss, static_argnums=2))(ws, x, False),
    }
    print("\nhand-written JAX reference (ln_gelu layers, no optimizer):")
    for name, fn in fns.items():
        temp = jax.jit(fn).lower(ws, x).compile().memory_analysis().temp_size_in_bytes
        print(f"  remat {name}: temp {temp / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
