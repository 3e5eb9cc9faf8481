"""Requests per save on gs:// of three save paths, with Orbax doing the writing in each.

Starts fake-gcs-server (as tests/cloud does) behind the counting proxy
(tests/cloud/store_proxy.py) and saves one small tree (5 leaves, and an input
position as JSON) 4 times per path; prints, per path, the requests of saves 2-4 and
those of the last save by kind, and whether Orbax's `CheckpointManager` on the
bucket (read-only, as readers open it) lists the last step and restores it:

* `manager`: Orbax's `CheckpointManager` saving to the bucket, as
  checkpoint/manager.py configured it before staging (async, directories made in
  the caller's thread);
* `(A) checkpointer`: Orbax's `AsyncCheckpointer` with the same handlers writing
  `<dir>/<step>` on the bucket directly (no manager);
* `(B) staged`: the same `AsyncCheckpointer` writing `<step>` in a local temporary
  directory (no request), then every file uploaded in one request each (files
  under 5 MiB; larger ones in 50 MiB parts), the step's `commit_success.txt` last.

    python benchmarks/save_paths_requests.py [--fail-every N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import uuid

_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, _ROOT)
sys.path.insert(0, os.path.join(_ROOT, "tests", "cloud"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fail-every", type=int, default=0)
    args = parser.parse_args()
    from tests.cloud import conftest
    from store_proxy import StoreProxy

    server, upstream = conftest.start_emulator(os.path.join(tempfile.mkdtemp(), "server.log"))
    proxy = StoreProxy(upstream, fail_every=args.fail_every)
    os.environ.update({
        "STORAGE_EMULATOR_HOST": proxy.url, "TENSORSTORE_GCS_HTTP_URL": proxy.url,
        "TENSORSTORE_GCS_HTTP_VERSION": "1", "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator",
        "EPATH_USE_TF": "false", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false", "NO_GCE_CHECK": "true",
    })
    import fsspec
    import jax.numpy as jnp
    import orbax.checkpoint as ocp

    tree = {"params": {"k": jnp.ones((4, 8)), "b": jnp.zeros((8,))},
            "opt": {"mu": jnp.ones((4, 8)), "nu": jnp.ones((8,))}, "step": jnp.int32(0)}

    def items():
        return ocp.args.Composite(state=ocp.args.StandardSave(tree), input=ocp.args.JsonSave({"pos": 3}))

    def manager_path(directory):
        manager = ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(
            max_to_keep=5, save_interval_steps=1, enable_async_checkpointing=True,
            async_options=ocp.AsyncOptions(create_directories_asynchronously=False)))

        def save(step):
            manager.save(step, args=items(), force=True)
            manager.wait_until_finished()
        return save, manager.close

    def checkpointer_path(directory):
        ckpt = ocp.AsyncCheckpointer(ocp.CompositeCheckpointHandler())

        def save(step):
            ckpt.save(f"{directory}/{step}", args=items(), force=True)
            ckpt.wait_until_finished()
        return save, ckpt.close

    def staged_path(directory):
        ckpt = ocp.AsyncCheckpointer(ocp.CompositeCheckpointHandler())
        local = tempfile.mkdtemp()
        fs, root = fsspec.core.url_to_fs(directory)

        def save(step):
            ckpt.save(os.path.join(local, str(step)), args=items(), force=True)
            ckpt.wait_until_finished()
            base = os.path.join(local, str(step))
            names = sorted(os.path.relpath(os.path.join(d, f), base)
                           for d, _, fs_ in os.walk(base) for f in fs_)
            marker = "commit_success.txt"
            rest = [n for n in names if n != marker]
            fs.put([os.path.join(base, n) for n in rest], [f"{root}/{step}/{n}" for n in rest])
            fs.put_file(os.path.join(base, marker), f"{root}/{step}/{marker}")
            shutil.rmtree(base)
        return save, ckpt.close

    paths = {"manager": manager_path, "(A) checkpointer": checkpointer_path, "(B) staged": staged_path}
    try:
        for name, make in paths.items():
            directory = f"gs://{conftest.BUCKET}/paths-{uuid.uuid4().hex[:8]}"
            save, close = make(directory)
            per_save, kinds = [], {}
            for step in range(4):
                before, snap = proxy.arrived, proxy.snapshot()
                save(step)
                per_save.append(proxy.arrived - before)
                kinds = dict(proxy.snapshot() - snap)
            close()
            reader = ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(
                read_only=True, save_interval_steps=0))
            restored = reader.restore(3, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(), input=ocp.args.JsonRestore()))
            ok = bool((restored["state"]["params"]["k"] == 1).all()) and restored["input"] == {"pos": 3}
            print(f"{name}: saves 2-4 {per_save[1:]} (arrived, 503s included); last by kind {kinds}; "
                  f"listed {reader.all_steps()}; restores: {ok}", flush=True)
    finally:
        proxy.close()
        server.terminate()
        server.wait(timeout=10)
        os._exit(0)  # (Orbax's executors need not be joined)


if __name__ == "__main__":
    main()
