"""Requests per save to the object store when several processes save one checkpoint.

Starts fake-gcs-server (as tests/cloud does) behind one counting proxy per process
(tests/cloud/store_proxy.py), runs N processes of tests/cloud/processes_job.py (the
small model of tests/cloud on gs://, 8 steps, a checkpoint every 4; each process with
its own TMPDIR; then evaluate with the state in memory, a new estimator's
latest_checkpoint(), its evaluate (checkpoint 8 restored) and its training on to step 12
(restored again, checkpoint 12 saved)) and prints, per checkpoint, the requests naming
its step directory during the training, by kind, and the number of files of the step;
and the requests of each phase of the job, all processes together (the job marks the
phases with one existence check of `_phase/<name>`, left out of the counts). The same for any
checkout: `--root` names the tpu_estimator checkout to import (e.g. main's, for the
manager's saves); the job and proxy are this checkout's.

    python benchmarks/store_requests_processes.py [--processes 2] [--root PATH] [--log FILE]
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
    parser.add_argument("--log", help="also write every request (process, phase, kind, path) to this file")
    args = parser.parse_args()

    from tests.cloud import conftest
    from store_proxy import StoreProxy

    tmp = tempfile.mkdtemp()
    server, upstream = conftest.start_emulator(os.path.join(tmp, "server.log"))
    proxies = [StoreProxy(upstream) for _ in range(args.processes)]  # one per process: its requests apart
    os.environ.update(conftest.client_env(upstream))  # (the listing)
    model_dir = f"gs://{conftest.BUCKET}/{uuid.uuid4().hex[:8]}"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update({
        "PHASE_MARKERS": "1",
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
                                   os.path.join(tmp, "out")], env={**env, **conftest.client_env(proxies[i].url)},
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for i in range(args.processes)]
        logs = [p.communicate(timeout=1200)[0] for p in procs]
        for p, log in zip(procs, logs):
            if p.returncode != 0:
                raise SystemExit(log[-3000:])
        seconds = round(time.perf_counter() - t, 1)
        root = model_dir.split("/", 3)[3]
        from tpu_estimator.checkpoint.listing import list_files

        out = {"processes": args.processes, "root": args.root, "seconds": seconds, "saves": {}, "phases": {}}
        windows = [_phases([(kind, urllib.parse.unquote(path)) for kind, _, path in proxy.log]) for proxy in proxies]
        for step in (0, 4, 8):  # the requests naming the step directory, during the training
            kinds = collections.Counter(k for w in windows for k, p in w["train"] if f"{root}/{step}/" in p)
            out["saves"][step] = {"total": sum(kinds.values()), **kinds,
                                  "files": len(list_files(f"{model_dir}/{step}"))}
        for name in windows[0]:
            kinds = collections.Counter(k for w in windows for k, _ in w[name])
            out["phases"][name] = {"total": sum(kinds.values()), **kinds}
        if args.log:
            with open(args.log, "w") as f:
                for i, w in enumerate(windows):
                    for name, requests in w.items():
                        f.writelines(f"{i}\t{name}\t{k}\t{p}\n" for k, p in requests)
        outside = collections.Counter(k for w in windows for k, p in w["train"]
                                      if not any(f"{root}/{step}/" in p for step in (0, 4, 8)))
        out["phases"]["train: outside the step directories"] = {"total": sum(outside.values()), **outside}
        print(json.dumps(out, indent=1, sort_keys=True))
    finally:
        for proxy in proxies:
            proxy.close()
        server.terminate()
        server.wait(timeout=10)


# each marker of the job opens the phase named here (None: no phase)
_OPENS = {"train.start": "train", "train.end": "evaluate_in_memory", "evaluate_in_memory.end": "new_estimator",
          "latest_checkpoint.start": "latest_checkpoint", "latest_checkpoint.end": "evaluate_restored",
          "evaluate_restored.end": "resumed_train", "resumed_train.end": None}


def _phases(log: list[tuple[str, str]]) -> dict[str, list[tuple[str, str]]]:
    """One process's requests by phase of the job (the markers left out)."""
    out: dict[str, list[tuple[str, str]]] = {name: [] for name in _OPENS.values() if name}
    current: str | None = None
    for kind, path in log:
        if "/_phase/" in path:
            current = _OPENS[path.split("/_phase/", 1)[1].split("/", 1)[0]]
        elif current is not None:
            out[current].append((kind, path))
    return out


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
