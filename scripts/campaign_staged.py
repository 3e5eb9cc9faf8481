"""The failure campaign's staged gs:// save cases (scripts/failure_campaign.py runs each in its own process).

N processes (2 CPU devices each) of tests/cloud/staged_faults_job.py train the small cloud
model on fake-gcs-server (tests/cloud's emulator) to 16 steps, a checkpoint every 4,
`lost_host_timeout_s=10`, `storage_timeout_s=10`; each process talks to the store through
its own counting proxy (tests/cloud/store_proxy.py), through which the fault is injected
at checkpoint 8's save. Each case reports how every process ended, the time from the
fault to the last exit, the requests that reached the proxies meanwhile (503s and held
ones included), what the store holds then (the steps a reader takes, whether step 8 has
its commit marker), and the restart of all processes with healthy proxies: whether it
resumes from the newest committed step and ends bit-identical to a clean run.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

ROOT = pathlib.Path(__file__).resolve().parent.parent
JOB = ROOT / "tests" / "cloud" / "staged_faults_job.py"
STEPS, FAULT_STEP = 16, 8


class Store:
    """The emulator (its URL in this process's environment, for the checks) and one proxy per process."""

    def __init__(self, d: str, nproc: int) -> None:
        sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "cloud")]
        from tests.cloud import conftest

        self.server, self.url = conftest.start_emulator(os.path.join(d, "server.log"))
        os.environ.update(conftest.client_env(self.url), JAX_PLATFORMS="cpu")
        self.bucket = conftest.BUCKET
        self.nproc = nproc
        self.proxies: list = []

    def fresh_proxies(self) -> list:
        from store_proxy import StoreProxy

        for p in self.proxies:
            p.close()
        self.proxies = [StoreProxy(self.url) for _ in range(self.nproc)]
        return self.proxies

    def arrived(self) -> int:
        return sum(p.arrived for p in self.proxies)

    def close(self) -> None:
        for p in self.proxies:
            p.close()
        self.server.terminate()
        self.server.wait(timeout=10)


def _launch(store: Store, model_dir: str, out: str, env_of: dict | None = None) -> list[subprocess.Popen]:
    from tests.cloud import conftest  # on the path since Store()

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for i, proxy in enumerate(store.fresh_proxies()):
        env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
        env.update(conftest.client_env(proxy.url), PYTHONPATH=str(ROOT), **(env_of or {}).get(i, {}))
        procs.append(subprocess.Popen([sys.executable, str(JOB), model_dir, str(i), str(store.nproc), str(port),
                                       out, str(STEPS)], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    return procs


def _finish(procs: list[subprocess.Popen], timeout: float) -> tuple[list[int], list[str]]:
    """Waits for every process (reading their logs meanwhile); kills those past `timeout`."""
    logs = [""] * len(procs)

    def read(i: int) -> None:
        logs[i] = procs[i].stdout.read()

    readers = [threading.Thread(target=read, args=(i,), daemon=True) for i in range(len(procs))]
    for r in readers:
        r.start()
    deadline, hung = time.monotonic() + timeout, set()
    for i, p in enumerate(procs):
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            hung.add(i)
    for r in readers:
        r.join(timeout=10)
    return [p.returncode for p in procs], [log + ("\n<HANG>" if i in hung else "") for i, log in enumerate(logs)]


def _params(out: str) -> dict | None:
    import numpy as np

    return dict(np.load(f"{out}.npz")) if os.path.exists(f"{out}.npz") else None


def _identical(a: dict | None, b: dict | None) -> bool:
    import numpy as np

    return a is not None and b is not None and a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def _clean(store: Store, d: str) -> dict | None:
    """The parameters of an undisturbed run (cached per process count for the campaign's run)."""
    cache = os.environ.get("CAMPAIGN_CACHE")
    if cache and os.path.exists(f"{cache}/staged_clean{store.nproc}.npz"):
        return _params(f"{cache}/staged_clean{store.nproc}")
    out = f"{d}/clean.out"
    procs = _launch(store, f"gs://{store.bucket}/{uuid.uuid4().hex[:8]}", out)
    rcs, logs = _finish(procs, 900)
    if any(rcs):
        raise RuntimeError(f"the clean run failed: {rcs}: {logs[0][-2000:]}")
    if cache:
        import shutil

        shutil.copy(f"{out}.npz", f"{cache}/staged_clean{store.nproc}.npz")
    return _params(out)


def _ending(i: int, rc: int, out: str, log: str, lost: int | None) -> str:
    """How process i ended, in a few words."""
    if i == lost:
        return "killed"
    if "<HANG>" in log:
        return "HANG"
    record = json.load(open(f"{out}.{i}.json")) if os.path.exists(f"{out}.{i}.json") else None
    if record and record["error"]:
        return record["error"]
    if rc == 0:
        return "completed"
    named = lost is not None and f"Process {lost} of" in log and "stopped" in log
    return f"exit {rc}" + (" after naming the lost process (HostLostError's message)" if named else "")


def _summary(rcs: list[int], logs: list[str], out: str, lost: int | None, fault_wall: float) -> str:
    """Each process's ending, and when the errors were raised (seconds after the fault)."""
    endings = [_ending(i, rc, out, log, lost) for i, (rc, log) in enumerate(zip(rcs, logs))]
    records = [json.load(open(f"{out}.{i}.json")) for i in range(len(rcs)) if os.path.exists(f"{out}.{i}.json")]
    raised = sorted(r["end"] - fault_wall for r in records if r["error"])
    when = f" (raised {raised[0]:.1f}-{raised[-1]:.1f} s after the fault)" if raised else ""
    return "; ".join(f"p{i}: {e}" for i, e in enumerate(endings)) + when


def _store_state(store: Store, model_dir: str) -> tuple[str, str | None]:
    """What a reader finds: (a line on the steps, latest_checkpoint())."""
    import cloud_model as cm
    from tpu_estimator.checkpoint import listing

    try:
        files = listing.list_files(f"{model_dir}/{FAULT_STEP}")
    except FileNotFoundError:
        files = {}
    latest = cm.estimator(model_dir).latest_checkpoint()
    marker = "commit_success.txt" in files
    return (f"step {FAULT_STEP}: {len(files)} file(s) on the store, commit marker {'PRESENT' if marker else 'absent'}; "
            f"latest_checkpoint() = {latest.rsplit('/', 1)[-1] if latest else None}"), latest


def _restart(store: Store, d: str, model_dir: str, clean: dict | None, latest: str | None) -> str:
    out = f"{d}/restart.out"
    procs = _launch(store, model_dir, out)
    rcs, logs = _finish(procs, 900)
    resumed = _params(out)
    if any(rcs):
        return f"restart FAILED (exit codes {rcs}): {logs[0].strip().splitlines()[-1:]}"
    committed = latest is not None and int(latest.rsplit("/", 1)[-1]) >= FAULT_STEP - 4
    same = _identical(clean, resumed)
    return (f"restart of all {store.nproc} to step {STEPS}: {'bit-identical' if same else 'DIFFERENT'} to the clean "
            f"run; {'0 commits lost' if committed and same else 'COMMITS LOST'}")


def _case(nproc: int, d: str, arm, *, kill: int | None = None, env_of: dict | None = None) -> tuple:
    """One staged case: `arm(store, model_dir)` sets the fault on the proxies (or None: the
    fault is in `env_of`); `kill`: the process SIGKILLed once a proxy holds a request."""
    store = Store(d, nproc)
    try:
        clean = _clean(store, d)
        model_dir, out = f"gs://{store.bucket}/{uuid.uuid4().hex[:8]}", f"{d}/run.out"
        procs = _launch(store, model_dir, out, env_of)
        root = model_dir.split("/", 3)[3]
        held = arm(store.proxies, root) if arm else None
        t_fault, before = None, 0
        deadline = time.monotonic() + 600
        while t_fault is None and time.monotonic() < deadline and all(p.poll() is None for p in procs):
            if kill is not None and held is not None and held.held:
                procs[kill].send_signal(signal.SIGKILL)
                t_fault, before = time.monotonic(), store.arrived()
            elif kill is None and any(p.went_at for p in store.proxies):
                t_fault = min(p.went_at for p in store.proxies if p.went_at)
                before = store.arrived()
            time.sleep(0.02)
            if env_of and t_fault is None:
                t_fault, before = _fault_in_job(out), store.arrived()
        if t_fault is None and env_of:
            t_fault, before = _fault_in_job(out), store.arrived()
        if t_fault is None:
            for p in procs:
                p.kill()
            return "RAW (the fault never happened)", 0.0, "?", [p.poll() for p in procs]
        rcs, logs = _finish(procs, 600)
        secs = time.monotonic() - t_fault
        sent = store.arrived() - before
        for p in store.proxies:
            p.back()
        outcome = _summary(rcs, logs, out, kill, time.time() - (time.monotonic() - t_fault))
        state, latest = _store_state(store, model_dir)
        lost = f"{state}; " + _restart(store, d, model_dir, clean, latest)
        return outcome, secs, str(sent), lost
    finally:
        store.close()


def _fault_in_job(out: str) -> float | None:
    """The fault injected inside the job (`env_of`), on this process's monotonic clock: the
    job writes its wall time to `out`.fault; None before it has."""
    try:
        wall = float(open(f"{out}.fault").read())
    except (OSError, ValueError):  # not written yet, or half-written
        return None
    return time.monotonic() - (time.time() - wall)


def _hold(proxies: list, who: int, target) -> object:
    proxies[who].go_away(lambda kind, method, path: kind == "upload" and target(path), "hold")
    return proxies[who]


def case_kill_one_mid_upload(d: str) -> tuple:
    """4 processes: SIGKILL process 1 while its part of checkpoint 8 is being uploaded."""
    return _case(4, d, lambda proxies, root: _hold(
        proxies, 1, lambda path: f"{root}/{FAULT_STEP}/state/ocdbt.process_1/" in path), kill=1)


def case_kill_zero_before_commit(d: str) -> tuple:
    """4 processes: SIGKILL process 0 once the parts are merged, before the commit marker."""
    return _case(4, d, lambda proxies, root: _hold(
        proxies, 0, lambda path: path.endswith(f"{root}/{FAULT_STEP}/commit_success.txt")), kill=0)


def case_store_away(d: str) -> tuple:
    """4 processes: 503 to every request of every process from checkpoint 8's first upload on."""
    def arm(proxies, root):
        went = threading.Event()

        def when(kind, method, path):
            if kind == "upload" and f"{root}/{FAULT_STEP}/" in path:
                went.set()
            return went.is_set()

        for p in proxies:
            p.go_away(when, "503")

    return _case(4, d, arm)


def case_one_part_fails(d: str) -> tuple:
    """4 processes: process 2's store answers 503 from its first upload of checkpoint 8 on
    (its network to the store lost; the others' store healthy)."""
    def arm(proxies, root):
        proxies[2].go_away(lambda kind, method, path: kind == "upload" and f"{root}/{FAULT_STEP}/" in path, "503")

    return _case(4, d, arm)


def case_one_local_disk_fails(d: str) -> tuple:
    """4 processes: process 2's local staging directory cannot be written at checkpoint 8."""
    return _case(4, d, None, env_of={2: {"STAGED_FAULT_LOCAL_AT": str(FAULT_STEP)}})


def case_one_process_kill_mid_upload(d: str) -> tuple:
    """1 process: SIGKILL during the upload of checkpoint 8's data files."""
    return _case(1, d, lambda proxies, root: _hold(
        proxies, 0, lambda path: f"{root}/{FAULT_STEP}/state/" in path and "/d/" in path), kill=0)


STAGED_CASES = {
    "gs:// staged, 4 processes: SIGKILL process 1 mid-upload of its part, restart all": case_kill_one_mid_upload,
    "gs:// staged, 4 processes: SIGKILL process 0 before the commit marker (parts merged), restart all":
        case_kill_zero_before_commit,
    "gs:// staged, 4 processes: store answers 503 to everything mid-save, restart all": case_store_away,
    "gs:// staged, 4 processes: process 2's uploads answered 503 (its store lost), restart all": case_one_part_fails,
    "gs:// staged, 4 processes: process 2's local staging directory unwritable, restart all":
        case_one_local_disk_fails,
    "gs:// staged, 1 process: SIGKILL mid-upload of the data, restart": case_one_process_kill_mid_upload,
}
