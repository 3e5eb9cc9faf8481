"""A `jax.export.Exported` as TensorFlow's `XlaCallModule` op, its StableHLO at a version TensorFlow reads.

`jax.export` serializes StableHLO at its 4-week compatibility target (1.18.0
with JAX 0.12.0.1). TensorFlow deserializes it with the StableHLO it was built
with (1.13.7 in TF 2.21) and fails on any op newer than that ("unregistered
operation 'vhlo.custom_call_v2'": the shape assertion of a polymorphic batch).
StableHLO's portable artifacts are forward compatible when serialized at a
target no newer than the reader's version, so the SavedModel's programs are
re-serialized (jaxlib's portable-artifact API, `jax.extend.mlir.dialects.stablehlo`)
at the target `probe()` finds, once per process:

- the candidates, newest first: jax.export's own target, TensorFlow's
  StableHLO version (where TensorFlow reports it, its
  `tensorflow.compiler.mlir.stablehlo` module), the 12-week target and the
  minimum, none newer than TensorFlow's version;
- the first at which a small batch-polymorphic program runs in TensorFlow and
  computes JAX's values.

A program using an op newer than the target cannot be written at it
(`TargetTooOld`: the exporter then writes no SavedModel and says why).

jax2tf's `convert` builds the same op but serializes at jax.export's target,
with no way to choose another; `call` builds it from the `Exported` the export
already made (its calling convention, platforms and disabled checks), with
`Graph.create_op`. One device only: the export's programs are unsharded.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import tensorflow as tf
from jax.extend.mlir.dialects import stablehlo

_Attr = tf.compat.v1.AttrValue


class TargetTooOld(ValueError):
    """A program uses StableHLO newer than the target TensorFlow reads."""


@dataclasses.dataclass(frozen=True)
class Probe:
    """`target`: the newest StableHLO version at which TensorFlow ran the probe (None: none).

    `failures` maps each newer candidate tried to why it failed.
    """

    target: str | None
    failures: dict[str, str]

    @property
    def reason(self) -> str | None:
        """Why TensorFlow cannot run this JAX's programs (None when a target works)."""
        if self.target is not None:
            return None
        return "; ".join(f"at StableHLO {v}: {why}" for v, why in self.failures.items()) or "no candidate target"


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def tensorflow_stablehlo_version() -> str | None:
    """The StableHLO version TensorFlow was built with, where it reports it (TF 2.21: '1.13.7')."""
    try:
        from tensorflow.compiler.mlir.stablehlo import stablehlo as tf_stablehlo
    except ImportError:
        return None
    get = getattr(tf_stablehlo, "get_current_version", None)
    return None if get is None else str(get())


def candidates(tensorflow_version: str | None) -> list[str]:
    """StableHLO targets to try, newest first, none newer than jax.export's or TensorFlow's version."""
    req = stablehlo.StablehloCompatibilityRequirement
    jax_target = stablehlo.get_version_from_compatibility_requirement(req.WEEK_4)  # (what jax.export writes)
    found = {
        jax_target,
        stablehlo.get_version_from_compatibility_requirement(req.WEEK_12),
        stablehlo.get_minimum_version(),
    }
    ceiling = jax_target
    if tensorflow_version is not None:
        found.add(tensorflow_version)
        ceiling = min(jax_target, tensorflow_version, key=_key)
    return sorted((v for v in found if _key(v) <= _key(ceiling)), key=_key, reverse=True)


def reserialize(module: bytes, target: str) -> bytes:
    """A serialized StableHLO module (any version jaxlib reads) serialized again at `target`."""
    try:
        return stablehlo.serialize_portable_artifact_str(stablehlo.deserialize_portable_artifact_str(module), target)
    except Exception as e:  # noqa: BLE001 - jaxlib raises a bare Exception; MLIR's diagnostics go to stderr
        raise TargetTooOld(
            f"The program uses StableHLO newer than {target}, the version this TensorFlow reads "
            f"(jaxlib: {str(e).splitlines()[0] if str(e) else type(e).__name__}; the op is named on stderr)."
        ) from e


def call(exported: Any, args: Sequence[Any], *, target: str, name: str = "XlaCallModule") -> Any:
    """`exported` applied to the TF tensors `args` in the default (TF1) graph; returns its output pytree.

    `args` has the structure of the exported function's positional arguments
    (dicts of tensors are flattened in sorted key order, as JAX flattens them).
    Inputs whose dtype differs from the program's (int64 features without
    jax_enable_x64) are cast, as jax2tf casts them.
    """
    if exported.nr_devices != 1:
        raise ValueError(
            f"A SavedModel holds one-device programs; received a program for {exported.nr_devices} devices. "
            "Export the function without shardings."
        )
    flat, tree = jax.tree.flatten((tuple(args), {}))
    if tree != exported.in_tree:
        raise ValueError(f"Arguments {tree} do not match the exported function's {exported.in_tree}.")
    flat = [_cast(t, aval.dtype) for t, aval in zip(flat, exported.in_avals)]
    kept = [flat[i] for i in exported.module_kept_var_idx]
    tout = [tf.as_dtype(np.dtype(a.dtype)) for a in exported.out_avals]
    sout = [[None if jax.export.is_symbolic_dim(d) else d for d in a.shape] for a in exported.out_avals]
    attrs = {
        "version": _Attr(i=exported.calling_convention_version),
        "module": _Attr(s=reserialize(exported.mlir_module_serialized, target)),
        "Tin": _Attr(list=_Attr.ListValue(type=[t.dtype.as_datatype_enum for t in kept])),
        "Tout": _Attr(list=_Attr.ListValue(type=[t.as_datatype_enum for t in tout])),
        "Sout": _Attr(list=_Attr.ListValue(shape=[tf.TensorShape(s).as_proto() for s in sout])),
        "platforms": _Attr(list=_Attr.ListValue(s=[p.upper().encode() for p in exported.platforms])),
        "disabled_checks": _Attr(list=_Attr.ListValue(s=[str(c).encode() for c in exported.disabled_safety_checks])),
        "has_token_input_output": _Attr(b=False),
        # as jax2tf sets it (calling convention 10 and later)
        "use_shardy_partitioner": _Attr(b=bool(jax.config.jax_use_shardy_partitioner)),
    }
    op = tf.compat.v1.get_default_graph().create_op("XlaCallModule", kept, tout, name=name, attrs=attrs)
    return jax.tree.unflatten(exported.out_tree, list(op.outputs))


def _cast(tensor: Any, dtype: Any) -> Any:
    want = tf.as_dtype(np.dtype(dtype))
    return tensor if tensor.dtype == want else tf.cast(tensor, want)


def _probe_fn(x: jax.Array) -> dict[str, jax.Array]:
    return {"double": x * 2.0, "argmax": jnp.argmax(x, -1)}


def run_in_tensorflow(exported: Any, target: str, *args: np.ndarray) -> Any:
    """`exported` run by TensorFlow on CPU (a graph, a session) at `target`; numpy outputs."""
    graph = tf.Graph()
    with graph.as_default():
        feeds = {tf.compat.v1.placeholder(tf.as_dtype(a.dtype), a.shape): a for a in args}
        outputs = call(exported, list(feeds), target=target)
        config = tf.compat.v1.ConfigProto(device_count={"GPU": 0})  # (JAX owns the accelerators)
        with tf.compat.v1.Session(graph=graph, config=config) as sess:
            return sess.run(outputs, feed_dict=feeds)


@functools.lru_cache(maxsize=None)
def probe() -> Probe:
    """The newest StableHLO target at which TensorFlow runs a batch-polymorphic program; once per process."""
    (batch,) = jax.export.symbolic_shape("batch")
    exported = jax.export.export(jax.jit(_probe_fn), platforms=("cpu",))(
        jax.ShapeDtypeStruct((batch, 3), np.float32)
    )
    x = (np.arange(12, dtype=np.float32).reshape(4, 3) % 5) / 4
    want = {"double": x * 2.0, "argmax": np.argmax(x, -1)}
    failures = {}
    for version in candidates(tensorflow_stablehlo_version()):
        try:
            got = run_in_tensorflow(exported, version, x)
        except Exception as e:  # noqa: BLE001 - any failure means TF cannot run it at this version
            failures[version] = _first_line(e)
            continue
        if all(np.array_equal(got[k], want[k]) for k in want):
            return Probe(version, failures)
        failures[version] = f"wrong values {got} (expected {want})"
    return Probe(None, failures)


def _first_line(e: Exception) -> str:
    lines = str(e).splitlines() or [""]
    first = next((line for line in lines if "unregistered" in line or "deserialize" in line), lines[0])
    return f"{type(e).__name__}: {first.strip()[:300]}"
