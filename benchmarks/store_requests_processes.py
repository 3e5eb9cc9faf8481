"""Requests per save to the object store when several processes save one checkpoint.

Starts fake-gcs-server (as tests/cloud does) behind one counting proxy
(tests/cloud/store_proxy.py) for all processes, runs N processes of
tests/cloud/processes_job.py (the small model of tests/cloud on gs://, 8 steps, a
checkpoint every 4; each process with its own TMPDIR) and prints, per checkpoint, the
requests naming its step directory up to checkpoint 8's commit marker (after it the
job evaluates), by kind, and the number of files of the step. The same for any
checkout: `--root` names the tpu_estimator checkout to import (e.g. main's, for the
manager's saves); the job and proxy are this checkout's.

    python benchmarks/store_requests_processes.py [--processes 2] [--root PATH]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import uuid

_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, _ROOT)
sys.path.insert(0, os.path.join(_ROOT, "tests", "cloud"))
JOB = os.path.join(_ROOT, "tests", "cloud", "processes_job.py")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--root", default=_ROOT, help="the checkout whose tpu_estimator the job imports")
    args = parser.parse_args()

    from tests.cloud import conftest
    from store_proxy import StoreProxy

    tmp = tempfile.mkdtemp()
    server, upstream = conftest._start(os.path.join(tmp, "server.log"))
    proxy = StoreProxy(upstream)
    os.environ.update({"STORAGE_EMULATOR_HOST": upstream, "TENSORSTORE_GCS_HTTP_URL": upstream})  # (the listing)
    model_dir = f"gs://{conftest.BUCKET}/{uuid.uuid4().hex[:8]}"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update({
        "STORAGE_EMULATOR_HOST": proxy.url, "TENSORSTORE_GCS_HTTP_URL": proxy.url,
        "TENSORSTORE_GCS_HTTP_VERSION": "1", "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator",
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false", "NO_GCE_CHECK": "true",
        # the job's own folder first (cloud_model), then the checkout measured, then this
        # one (tests/final_state.py, for a checkout from before it)
        "PYTHONPATH": os.pathsep.join([os.path.abspath(args.root), _ROOT, env.get("PYTHONPATH", "")]),
    })
    try:
        t = time.perf_counter()
        # (the job imports cloud_model from its folder, which puts this checkout first on
        # sys.path: for --root the job is run from a copy beside the measured checkout's)
        job = JOB if os.path.abspath(args.root) == _ROOT else _copy_job(args.root, tmp)
        procs = [subprocess.Popen([sys.executable, job, model_dir, str(i), str(args.processes), str(port),
                                   os.path.join(tmp, "out")], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True) for i in range(args.processes)]
        logs = [p.communicate(timeout=1200)[0] for p in procs]
        for p, log in zip(procs, logs):
            if p.returncode != 0:
                raise SystemExit(log[-3000:])
        seconds = round(time.perf_counter() - t, 1)
        root = model_dir.split("/", 3)[3]
        log = [(kind, urllib.parse.unquote(path)) for kind, _, path in proxy.log]
        end = min(i for i, (kind, path) in enumerate(log)
                  if kind == "upload" and f"{root}/8/commit_success.txt" in path)
        from tpu_estimator.checkpoint.listing import list_files

        out = {"processes": args.processes, "root": args.root, "seconds": seconds, "saves": {}}
        for step in (0, 4, 8):
            kinds = collections.Counter(k for k, p in log[:end + 1] if f"{root}/{step}/" in p)
            out["saves"][step] = {"total": sum(kinds.values()), **kinds,
                                  "files": len(list_files(f"{model_dir}/{step}"))}
        print(json.dumps(out, indent=1, sort_keys=True))
    finally:
        proxy.close()
        server.terminate()
        server.wait(timeout=10)


def _copy_job(root: str, tmp: str) -> str:
    """The job and the cloud model in a folder of their own, importing `root`'s package."""
    import shutil

    folder = os.path.join(tmp, "job")
    os.makedirs(folder)
    shutil.copy(JOB, folder)
    shutil.copy(os.path.join(root, "tests", "cloud", "cloud_model.py"), folder)
    return os.path.join(folder, os.path.basename(JOB))


if __name__ == "__main__":
    main()
