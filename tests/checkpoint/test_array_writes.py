"""Saves of one process write each replicated array once (checkpoint/array_writes.py), keep
Orbax's array metadata (write shapes, typed PRNG keys), and restore exactly, as do the
replica-parallel checkpoints written before, onto other shardings too."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from tpu_estimator.checkpoint import array_writes
from tpu_estimator.checkpoint.manager import Checkpointer


@pytest.fixture(scope="module")
def mesh():
    return Mesh(np.array(jax.devices()).reshape(-1, 1), ("data", "model"))


def _state(mesh):
    replicated = NamedSharding(mesh, P())
    return {
        "w": jax.device_put(np.arange(64 * 16, dtype=np.float32).reshape(64, 16), replicated),
        "rows": jax.device_put(np.arange(64 * 8, dtype=np.float32).reshape(64, 8), NamedSharding(mesh, P("data"))),
        "step": jax.device_put(np.int32(7), replicated),
    }


def _abstract(tree, sharding=None):
    """`tree`'s shapes, laid out by `sharding` (scalars replicated on its mesh), else as saved."""
    def one(a):
        if sharding is None:
            return jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding)
        return jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding if a.ndim else NamedSharding(sharding.mesh, P()))
    return jax.tree.map(one, tree)


def _write_shapes(directory):
    import orbax.checkpoint as ocp

    meta = ocp.StandardCheckpointer().metadata(directory).item_metadata
    return {name: tuple(m.storage.write_shape) for name, m in meta.items()}


def test_the_single_writer_handler_is_available_with_this_orbax():
    # Orbax 0.12.8 (the lower bound) has the public store: saves are single-writer here.
    assert array_writes.single_writer_available()


def test_a_replicated_array_is_written_whole_once_and_restores_exactly(tmp_path, mesh):
    state = _state(mesh)
    ckpt = Checkpointer(str(tmp_path / "model"))
    assert ckpt.save(1, state)
    ckpt.wait()
    shapes = _write_shapes(tmp_path / "model" / "1" / "state")
    # Orbax's replica-parallel save cuts the replicated (64, 16) array into 8 slices of
    # (8, 16), one per device (the next test's old checkpoint shows it); written once, its
    # write shape is the whole array. The sharded
    # array is written per shard either way.
    assert shapes["w"] == (64, 16)
    assert shapes["rows"] == (8, 8)
    back = ckpt.restore(1, _abstract(state))
    for name in state:
        np.testing.assert_array_equal(np.asarray(back[name]), np.asarray(state[name]))
        assert back[name].sharding == state[name].sharding
    # Onto another layout: the replicated array sharded, the sharded one replicated, and
    # both onto 2 of the 8 devices.
    other = {"w": NamedSharding(mesh, P("data")), "rows": NamedSharding(mesh, P()),
             "step": NamedSharding(mesh, P())}
    two = NamedSharding(Mesh(np.array(jax.devices()[:2]).reshape(2, 1), ("data", "model")), P("data"))
    for layout in (other, {"w": two, "rows": two, "step": NamedSharding(two.mesh, P())}):
        abstract = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=layout[k]) for k, v in state.items()}
        back = ckpt.restore(1, abstract)
        for name in state:
            np.testing.assert_array_equal(np.asarray(back[name]), np.asarray(state[name]))
            assert back[name].sharding == layout[name]
    ckpt.close()


def test_checkpoints_written_replica_parallel_before_still_restore(tmp_path, mesh):
    # A step as the library wrote it before: Orbax's own handler (replica-parallel), through
    # Orbax's CheckpointManager with the same items and chunking, in a process where the
    # library registered nothing (no digests: a checkpoint of a version before them).
    model_dir = tmp_path / "model"
    script = textwrap.dedent(
        f"""
        import os
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
        import jax, numpy as np
        import orbax.checkpoint as ocp
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        from tpu_estimator.checkpoint.row_reads import chunked_save_args
        mesh = Mesh(np.array(jax.devices()).reshape(-1, 1), ("data", "model"))
        state = {{
            "w": jax.device_put(np.arange(64 * 16, dtype=np.float32).reshape(64, 16), NamedSharding(mesh, P())),
            "rows": jax.device_put(np.arange(64 * 8, dtype=np.float32).reshape(64, 8), NamedSharding(mesh, P("data"))),
            "step": jax.device_put(np.int32(7), NamedSharding(mesh, P())),
        }}
        with ocp.CheckpointManager({str(model_dir)!r}) as manager:
            manager.save(3, args=ocp.args.Composite(state=ocp.args.StandardSave(
                state, save_args=chunked_save_args(state, chunk_bytes=2 << 20))))
            manager.wait_until_finished()
        print("handler", type(ocp.type_handlers.get_type_handler(jax.Array)).__name__)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "handler ArrayHandler" in out.stdout
    assert _write_shapes(model_dir / "3" / "state")["w"] == (8, 16)  # sliced per device
    state = _state(mesh)
    ckpt = Checkpointer(str(model_dir))
    two = Mesh(np.array(jax.devices()[:2]).reshape(2, 1), ("data", "model"))
    for sharding in (None, NamedSharding(mesh, P("data")), NamedSharding(two, P())):
        back = ckpt.restore(3, _abstract(state, sharding))
        for name in state:
            np.testing.assert_array_equal(np.asarray(back[name]), np.asarray(state[name]))
            if sharding is not None and state[name].ndim:
                assert back[name].sharding == sharding
    ckpt.close()


def test_typed_prng_keys_come_back_as_keys(tmp_path, mesh):
    # The array-metadata store records a typed key's implementation; without one a key
    # would come back as its raw uint32 data. (The training state holds its own key as
    # uint32 data; a model's collections may hold typed ones.)
    replicated = NamedSharding(mesh, P())
    state = {"key": jax.device_put(jax.random.key(3), replicated),
             "w": jax.device_put(jnp.ones((16, 4)), replicated)}
    ckpt = Checkpointer(str(tmp_path / "model"))
    assert ckpt.save(1, state)
    ckpt.wait()
    back = ckpt.restore(1, _abstract(state))
    ckpt.close()
    assert _write_shapes(tmp_path / "model" / "1" / "state")["w"] == (16, 4)  # the single writer saved it
    assert jax.dtypes.issubdtype(back["key"].dtype, jax.dtypes.prng_key)
    np.testing.assert_array_equal(jax.random.key_data(back["key"]), jax.random.key_data(state["key"]))
