"""Requests per save of Orbax alone, under the CheckpointManager options this library could set.

Starts fake-gcs-server (as tests/cloud does) behind the counting proxy
(tests/cloud/store_proxy.py) and saves one small tree (5 leaves) 4 times through an
Orbax `CheckpointManager` configured as checkpoint/manager.py configures it (async,
directories made in the caller's thread), once per variant of its public options;
prints, per variant, the requests of saves 2-4 (the first also writes the root
metadata) and those of the last save by kind, and checks that the last step restores.

    python benchmarks/orbax_save_requests.py
"""

from __future__ import annotations

import os
import sys
import tempfile
import uuid

_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, _ROOT)
sys.path.insert(0, os.path.join(_ROOT, "tests", "cloud"))


def main() -> None:
    from tests.cloud import conftest
    from store_proxy import StoreProxy

    server, upstream = conftest.start_emulator(os.path.join(tempfile.mkdtemp(), "server.log"))
    proxy = StoreProxy(upstream)
    os.environ.update({
        "STORAGE_EMULATOR_HOST": proxy.url, "TENSORSTORE_GCS_HTTP_URL": proxy.url,
        "TENSORSTORE_GCS_HTTP_VERSION": "1", "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator",
        "EPATH_USE_TF": "false",
    })
    import jax.numpy as jnp
    import orbax.checkpoint as ocp

    tree = {"params": {"k": jnp.ones((4, 8)), "b": jnp.zeros((8,))},
            "opt": {"mu": jnp.ones((4, 8)), "nu": jnp.ones((8,))}, "step": jnp.int32(0)}
    skip = ocp.options.FileOptions(skip_sync_file_validations=True)
    variants = {
        "as configured": {},
        "skip_sync_file_validations=True": {"file_options": skip},
        "save_root_metadata=False": {"save_root_metadata": False},
        "both": {"file_options": skip, "save_root_metadata": False},
    }
    try:
        for name, extra in variants.items():
            directory = f"gs://{conftest.BUCKET}/orbax-{uuid.uuid4().hex[:8]}"
            manager = ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(
                max_to_keep=5, save_interval_steps=1, enable_async_checkpointing=True,
                async_options=ocp.AsyncOptions(create_directories_asynchronously=False), **extra))
            per_save, kinds = [], {}
            for step in range(4):
                before, snap = proxy.arrived, proxy.snapshot()
                manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(tree)), force=True)
                manager.wait_until_finished()
                per_save.append(proxy.arrived - before)
                kinds = dict(proxy.snapshot() - snap)
            manager.close()
            reader = ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(read_only=True))
            restored = reader.restore(3, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
            ok = bool((restored["state"]["params"]["k"] == 1).all())
            print(f"{name}: saves 2-4 {per_save[1:]}; last by kind {kinds}; restores: {ok}", flush=True)
    finally:
        proxy.close()
        server.terminate()
        server.wait(timeout=10)
        os._exit(0)  # (Orbax's executors need not be joined)


if __name__ == "__main__":
    main()
