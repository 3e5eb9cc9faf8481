"""Orbax's jax.Array handler wrapped so TensorStore retries within storage_timeout_s
(checkpoint/client_retries.py): installed quietly, once, keeping saves and restores exact."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_installing_the_bounded_handler_logs_nothing_and_saves_and_restores_exactly(tmp_path):
    # A fresh process: the registry is process-wide, and the override warning comes once.
    script = textwrap.dedent(
        f"""
        import logging, sys
        import jax, jax.numpy as jnp, numpy as np
        import orbax.checkpoint as ocp
        logging.basicConfig(stream=sys.stdout, level=logging.INFO)
        from tpu_estimator.checkpoint import client_retries
        client_retries.install()
        client_retries.install()
        handler = ocp.type_handlers.get_type_handler(jax.Array)
        print("handler", type(handler).__name__)
        tree = {{"w": jnp.arange(12.0).reshape(3, 4)}}
        with ocp.StandardCheckpointer() as ckpt:
            ckpt.save({str(tmp_path / "c")!r}, tree)
            ckpt.wait_until_finished()
            back = ckpt.restore({str(tmp_path / "c")!r}, jax.tree.map(ocp.utils.to_shape_dtype_struct, tree))
        print("equal", bool(np.array_equal(back["w"], tree["w"])))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "handler BoundedRetries" in out.stdout
    assert "equal True" in out.stdout
    assert "overriding" not in out.stdout + out.stderr
