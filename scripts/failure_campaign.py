"""A failure campaign: bad inputs, damaged storage, kills. Each case runs in its own process.

    .venv/bin/python scripts/failure_campaign.py [--timeout 120] [-k substring]

The "gs://" cases train on fake-gcs-server (tests/cloud's emulator) behind a proxy
that, mid-run, answers 503 to everything or drops every connection; they report the
time from the fault to train()'s CheckpointStorageError and the requests sent to the
store meanwhile. The others use local disk (no requests to count).

The "4 processes" cases start 4 processes of 2 CPU devices each (lost host
deadline `lost_host_timeout_s=10`), each case in its own process with a hard
timeout (900 s); they report the time from the fault to the last process's exit.

The "gs:// staged" cases (scripts/campaign_staged.py) run 4 processes (or 1) of
tests/cloud/staged_faults_job.py on the emulator, each behind its own counting proxy:
a kill mid-upload of a part, a kill of process 0 before the commit marker, the store
answering 503 mid-save, one process's uploads failing, one process's local staging
directory unwritable; each reports every process's ending, the time from the fault to
the last exit, the requests sent meanwhile, and whether restarting all processes
resumes from the newest committed step bit-identically to a clean run.

For every case it prints how the process ended: our error (its class and first
line), a clean exit, a HANG (killed after --timeout seconds), or RAW (a
traceback whose exception is not one of ours, or was raised inside a
dependency rather than by tpu_estimator's own code). The tests cover the same ground case by case
(tests/estimator/test_storage_failures.py, test_preemption.py,
tests/checkpoint/test_damage.py, tests/cloud/test_paths.py); this script is the
quick look across all of them that the issue notes quote.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap

from campaign_staged import STAGED_CASES

ROOT = pathlib.Path(__file__).resolve().parent.parent

PRELUDE = """
import os, sys, signal, time, shutil, glob
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
import numpy as np, optax, flax.linen as nn
import tpu_estimator as te
X = np.random.RandomState(0).randn(64, 4).astype(np.float32)
Y = (X[:, 0] > 0).astype(np.int32)
D = sys.argv[1]

def model_fn(features, labels, mode, params):
    if isinstance(features, dict):  # as a serving receiver gives them
        features = features["x"]
    logits = nn.Dense(2)(features)
    if mode == te.ModeKeys.PREDICT:
        return te.TPUEstimatorSpec(mode, predictions={"logits": logits})
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    if mode == te.ModeKeys.EVAL:
        return te.TPUEstimatorSpec(mode, loss=loss)
    return te.TPUEstimatorSpec(mode, loss=loss, train_op=optax.sgd(0.1))

def input_fn(params):
    b = params["batch_size"]
    for i in range(0, 64, b):
        yield X[i:i + b], Y[i:i + b]

def est(model_dir=None, **kw):
    kw.setdefault("train_batch_size", 8); kw.setdefault("eval_batch_size", 8); kw.setdefault("predict_batch_size", 8)
    cfg = te.RunConfig(model_dir=model_dir or os.path.join(D, "m"), log_step_count_steps=None,
                       tpu_config=te.TPUConfig(iterations_per_loop=2), **kw.pop("run", {}))
    return te.TPUEstimator(kw.pop("model_fn", model_fn), config=cfg, **kw)

def newest(model_dir):
    return max((p for p in glob.glob(model_dir + "/*") if os.path.basename(p).isdigit()), key=lambda p: int(os.path.basename(p)))

RECEIVER = te.build_raw_serving_input_receiver_fn({'x': te.TensorSpec((None, 4), 'float32')})

def biggest_file(step_dir):
    files = [p for p in glob.glob(step_dir + "/**/*", recursive=True) if os.path.isfile(p)]
    return max(files, key=os.path.getsize)
"""

CASES = {
    # --- paths and storage ---
    "model_dir is a file": "open(D + '/f', 'w').close(); est(D + '/f').train(input_fn, max_steps=2)",
    "model_dir under a file": "open(D + '/f', 'w').close(); est(D + '/f/run').train(input_fn, max_steps=2)",
    "model_dir with an unknown scheme": "est('foo://bucket/run').train(input_fn, max_steps=2)",
    "model_dir gs:// without a bucket": "est('gs://').train(input_fn, max_steps=2)",
    "model_dir replaced by a file mid-run": textwrap.dedent("""
        class Swap(te.SessionRunHook):
            def before_run(self, ctx): return te.SessionRunArgs('global_step')
            def after_run(self, ctx, v):
                if int(v.results) == 4:
                    shutil.rmtree(D + '/m'); open(D + '/m', 'w').close()
        est().train(input_fn, max_steps=8, hooks=[Swap()])"""),
    "checkpoint_path that does not exist": "est().train(input_fn, max_steps=2); est().evaluate(input_fn, checkpoint_path=D + '/m/999')",
    "checkpoint_path that is a file": "open(D + '/f', 'w').close(); est().evaluate(input_fn, checkpoint_path=D + '/f')",
    "warm_start_from a missing directory": "est(warm_start_from=D + '/nope').train(input_fn, max_steps=2)",
    "warm_start_from of the wrong type": "est(warm_start_from=123).train(input_fn, max_steps=2)",
    "export_dir_base is a file": textwrap.dedent("""
        e = est(); e.train(input_fn, max_steps=2); open(D + '/f', 'w').close()
        e.export_saved_model(D + '/f', te.build_raw_serving_input_receiver_fn({'x': te.TensorSpec((None, 4), 'float32')}))"""),
    "load_exported of a missing directory": "te.load_exported(D + '/nope')",
    "load_exported of a directory without manifest": "os.makedirs(D + '/e'); te.load_exported(D + '/e')",
    # --- damaged checkpoints ---
    "newest checkpoint: biggest file deleted": "est().train(input_fn, max_steps=4); os.remove(biggest_file(newest(D + '/m'))); est().train(input_fn, max_steps=6)",
    "newest checkpoint: biggest file truncated": "est().train(input_fn, max_steps=4); p = biggest_file(newest(D + '/m')); open(p, 'r+b').truncate(os.path.getsize(p) // 2); est().evaluate(input_fn)",
    "newest checkpoint: a byte flipped": textwrap.dedent("""
        est().train(input_fn, max_steps=4); p = biggest_file(newest(D + '/m'))
        b = bytearray(open(p, 'rb').read()); b[len(b) // 2] ^= 0xFF; open(p, 'wb').write(bytes(b))
        list(est().predict(input_fn))"""),
    "empty newer step directory": "est().train(input_fn, max_steps=4); os.makedirs(D + '/m/100'); est().train(input_fn, max_steps=6)",
    "damaged newest, fallback opted in": textwrap.dedent("""
        e = est(run=dict(save_checkpoints_steps=2)); e.train(input_fn, max_steps=4)
        os.remove(biggest_file(newest(D + '/m')))
        r = est(run=dict(fall_back_to_intact_checkpoint=True)).evaluate(input_fn)
        print('fell back to step', r['global_step'])"""),
    # --- the user's functions and arguments ---
    "input_fn returns None": "est().train(lambda params: None, max_steps=2)",
    "input_fn yields a 3-tuple": "est().train(lambda params: iter([(X[:8], Y[:8], Y[:8])]), max_steps=2)",
    "input_fn raises": "def bad(params):\n    raise KeyError('no such file')\nest().train(bad, max_steps=2)",
    "model_fn returns a dict": "est(model_fn=lambda features, labels, mode: {'loss': 0.0}).train(input_fn, max_steps=2)",
    "train_batch_size not divisible": "est(train_batch_size=7).train(input_fn, max_steps=2)",
    "steps=0": "est().train(input_fn, steps=0)",
    "max_steps as a string": "est().train(input_fn, max_steps='10')",
    "reserved params key": "est(params={'batch_size': 3})",
    "a hook that is not a hook": "est().train(input_fn, max_steps=2, hooks=[object()])",
    "evaluate on an empty input": "est().train(input_fn, max_steps=2); est().evaluate(lambda params: iter([]))",
    "unknown predict_keys": "est().train(input_fn, max_steps=2); list(est().predict(input_fn, predict_keys=['nope']))",
    "NaN loss": textwrap.dedent("""
        def nan_fn(features, labels, mode, params):
            spec = model_fn(features, labels, mode, params)
            return spec._replace(loss=spec.loss * float('nan'))
        est(model_fn=nan_fn).train(input_fn, max_steps=4)"""),
    # --- kills ---
    "SIGTERM during train": textwrap.dedent("""
        class Term(te.SessionRunHook):
            def before_run(self, ctx): return te.SessionRunArgs('global_step')
            def after_run(self, ctx, v):
                if int(v.results) == 4: os.kill(os.getpid(), signal.SIGTERM)
        e = est(); e.train(input_fn, max_steps=8, hooks=[Term()])
        print('preempted', e.preempted, 'at', e.latest_checkpoint().rsplit('/', 1)[-1])"""),
    "SIGKILL during train, then resume": textwrap.dedent("""
        import subprocess
        code = "import sys; sys.argv = ['x', %r]\\n" % D + PRELUDE_TEXT + (
            "\\nclass Kill(te.SessionRunHook):\\n"
            "    def before_run(self, ctx): return te.SessionRunArgs('global_step')\\n"
            "    def after_run(self, ctx, v):\\n"
            "        if int(v.results) == 4: os.kill(os.getpid(), signal.SIGKILL)\\n"
            "est(run=dict(save_checkpoints_steps=2)).train(input_fn, max_steps=8, hooks=[Kill()])\\n")
        rc = subprocess.run([sys.executable, '-c', code]).returncode
        e = est(); e.train(input_fn, max_steps=8)
        print('killed with', rc, '; resumed to', e.latest_checkpoint().rsplit('/', 1)[-1])"""),
    # --- signals outside train() (one process) ---
    "SIGTERM during evaluate": textwrap.dedent("""
        class Term(te.SessionRunHook):
            def after_run(self, ctx, v): os.kill(os.getpid(), signal.SIGTERM)
        e = est(); e.train(input_fn, max_steps=2)
        def endless(params):
            while True: yield from input_fn(params)
        e.evaluate(endless, hooks=[Term()])"""),
    "SIGTERM during predict": textwrap.dedent("""
        class Term(te.SessionRunHook):
            def after_run(self, ctx, v): os.kill(os.getpid(), signal.SIGTERM)
        e = est(); e.train(input_fn, max_steps=2)
        def endless(params):
            while True: yield from input_fn(params)
        for p in e.predict(endless, hooks=[Term()]): pass"""),
    "SIGTERM during train_and_evaluate's evaluation": textwrap.dedent("""
        class Term(te.SessionRunHook):
            def after_run(self, ctx, v): os.kill(os.getpid(), signal.SIGTERM)
        def endless(params):
            while True: yield from input_fn(params)
        te.train_and_evaluate(est(), te.TrainSpec(endless, max_steps=4), te.EvalSpec(endless, steps=None, hooks=[Term()]))"""),
    "SIGKILL during export, then export again": textwrap.dedent("""
        import subprocess, threading
        est().train(input_fn, max_steps=2)
        code = "import sys; sys.argv = ['x', %r]\\n" % D + PRELUDE_TEXT + (
            "\\nimport threading\\n"
            "def kill_when_writing():\\n"
            "    while not glob.glob(D + '/exports/.temp-*'): time.sleep(0.001)\\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\\n"
            "threading.Thread(target=kill_when_writing, daemon=True).start()\\n"
            "est().export_saved_model(D + '/exports', RECEIVER)\\n")
        rc = subprocess.run([sys.executable, '-c', code]).returncode
        left = glob.glob(D + '/exports/.temp-*')
        est().export_saved_model(D + '/exports', RECEIVER)
        print('export killed with', rc, ';', len(left), 'temporary dir(s) left;',
              len(glob.glob(D + '/exports/.temp-*')), 'after the next export;',
              len([n for n in os.listdir(D + '/exports') if n.isdigit()]), 'export(s)')"""),
}

OURS = ("CheckpointStorageError", "DamagedCheckpointError", "NanLossDuringTrainingError", "PreemptedError",
        "HostLostError", "ValueError", "TypeError")


def run_case(name: str, body: str, timeout: float) -> tuple[str, str]:
    with tempfile.TemporaryDirectory() as d:
        code = PRELUDE + f"\nPRELUDE_TEXT = {PRELUDE!r}\n" + body + "\n"
        try:
            out = subprocess.run(
                [sys.executable, "-c", code, d], capture_output=True, text=True, timeout=timeout, cwd=ROOT
            )
        except subprocess.TimeoutExpired:
            return "HANG", f"killed after {timeout:.0f} s"
    err = [line for line in out.stderr.splitlines() if line.strip()]
    if out.returncode == 0:
        printed = out.stdout.strip().splitlines()
        return "ok (exit 0)", printed[-1] if printed else ""
    raised = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt)(:|$)")
    last = next((line for line in reversed(err) if raised.match(line)), err[-1] if err else "")
    kind = last.split(":", 1)[0].rsplit(".", 1)[-1]
    detail = last.split(":", 1)[1].strip() if ":" in last else last
    frames = [line for line in err if line.strip().startswith('File "')]
    raised_by_us = bool(frames) and "/tpu_estimator/" in frames[-1] and "site-packages" not in frames[-1]
    if frames and '"<string>"' in frames[-1]:  # the user's own code raised it: re-raised as itself
        return f"user's {kind}, as itself", detail[:160]
    ours = kind in OURS and raised_by_us
    return (f"error {kind}" if ours else f"RAW {kind}"), detail[:160]


# --- several processes (4 x 2 CPU devices): each case runs in its own process too ---------

LOST_WORKER = ROOT / "tests" / "multihost" / "lost_host_worker.py"
EVAL_WORKER = ROOT / "tests" / "multihost" / "preempt_eval_worker.py"
NPROC, DEADLINE_S, STEPS = 4, 10, 24


def _launch(worker, args_of, out, env_of=None):
    import socket
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for i in range(NPROC):
        env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
        env.update({"PYTHONPATH": str(ROOT), **((env_of or {}).get(i, {}))})
        procs.append(subprocess.Popen([sys.executable, str(worker), *args_of(i, port)], env=env, cwd=ROOT,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return procs, time.monotonic()


def _wait_started(procs, out, timeout=300):
    import time

    deadline = time.monotonic() + timeout
    while not all(os.path.exists(f"{out}.started{i}") for i in range(NPROC)):
        if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
            raise RuntimeError("the workers did not start")
        time.sleep(0.05)


def _finish(procs, timeout):
    import time

    t0, logs = time.monotonic(), []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=max(1.0, timeout - (time.monotonic() - t0)))[0])
        except subprocess.TimeoutExpired:
            p.kill()
            logs.append(p.communicate()[0] + "\n<HANG: killed>")
    return [p.returncode for p in procs], logs, time.monotonic() - t0


def _train(d, name, max_steps, env_of=None):
    """A 4-process training run to `max_steps` (resuming from `d/name`): (rcs, logs, params of process 0)."""
    import numpy as np

    out, model_dir = f"{d}/{name}.out", f"{d}/{name}"
    procs, _ = _launch(LOST_WORKER, lambda i, port: [str(i), str(NPROC), str(port), model_dir, "train",
                                                      str(DEADLINE_S), out, str(max_steps)], out, env_of)
    rcs, logs, _ = _finish(procs, 600)
    params = dict(np.load(f"{out}.0.npz")) if os.path.exists(f"{out}.0.npz") else None
    return rcs, logs, params


def _identical(a, b):
    import numpy as np

    return a is not None and b is not None and a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def _survivors(logs, rcs, lost):
    named = sum(f"Process {lost} of {NPROC} stopped" in log for i, log in enumerate(logs) if i != lost)
    codes = sorted({rc for i, rc in enumerate(rcs) if i != lost})
    return f"{named}/{NPROC - 1} survivors named process {lost} (HostLostError); exit codes {codes}"


def _kill_case(d, phase, lost, env_of=None, kill_after_s=2.0):
    """Kills process `lost` (unless it kills itself, env_of) and returns (survivor summary, seconds to exit)."""
    import time

    out, model_dir = f"{d}/k.out", f"{d}/run"
    procs, _ = _launch(LOST_WORKER, lambda i, port: [str(i), str(NPROC), str(port), model_dir, phase,
                                                      str(DEADLINE_S), out, str(STEPS if env_of else 0)], out, env_of)
    if env_of:  # it kills itself at a save
        procs[lost].wait(timeout=600)
    else:
        _wait_started(procs, out)
        time.sleep(kill_after_s)
        procs[lost].kill()
    t_kill = time.monotonic()
    rcs, logs, _ = _finish(procs, DEADLINE_S + 120)
    return _survivors(logs, rcs, lost), time.monotonic() - t_kill, logs


def case_lost_mid_training(d):
    clean = _train(d, "clean", STEPS)[2]
    summary, secs, _ = _kill_case(d, "train", lost=3)
    import glob

    steps = sorted(int(os.path.basename(p)) for p in glob.glob(f"{d}/run/*") if os.path.basename(p).isdigit())
    rcs, _, resumed = _train(d, "run", STEPS)
    same = _identical(clean, resumed)
    return summary, secs, (f"0 commits lost (kept steps {steps}); restart of all 4 to step {STEPS}: "
                           f"{'bit-identical' if same else 'DIFFERENT'} to the clean run, exit codes {sorted(set(rcs))}")


def case_lost_mid_save(d):
    clean = _train(d, "clean", STEPS)[2]
    summary, secs, _ = _kill_case(d, "train", lost=3, env_of={3: {"LOST_HOST_KILL_AT_SAVE": "8"}})
    import glob

    steps = sorted(int(os.path.basename(p)) for p in glob.glob(f"{d}/run/*") if os.path.basename(p).isdigit())
    rcs, _, resumed = _train(d, "run", STEPS)
    same = _identical(clean, resumed)
    return summary, secs, (f"killed as step 8's save began (step 4's commit in flight); steps on disk {steps}; restart of all 4: "
                           f"{'bit-identical' if same else 'DIFFERENT'} to the clean run, exit codes {sorted(set(rcs))}")


def case_lost_mid_evaluation(d):
    summary, secs, _ = _kill_case(d, "evaluate", lost=1)
    out = f"{d}/again.out"
    procs, _ = _launch(LOST_WORKER, lambda i, port: [str(i), str(NPROC), str(port), f"{d}/run", "evaluate",
                                                      str(DEADLINE_S), out, "8"], out)
    rcs, logs, _ = _finish(procs, 600)
    evals = {line for log in logs for line in log.splitlines() if line.startswith("eval ")}
    return summary, secs, f"no metrics recorded; restart of all 4: exit codes {sorted(set(rcs))}, {len(evals)} distinct result(s)"


def case_sigterm_one_of_four_training(d):
    import signal
    import time

    out, model_dir = f"{d}/t.out", f"{d}/run"
    procs, _ = _launch(LOST_WORKER, lambda i, port: [str(i), str(NPROC), str(port), model_dir, "train",
                                                      str(DEADLINE_S), out, "0"], out)
    _wait_started(procs, out)
    time.sleep(2.0)
    procs[2].send_signal(signal.SIGTERM)
    t = time.monotonic()
    rcs, logs, _ = _finish(procs, 300)
    saved = {line.split()[1] for log in logs for line in log.splitlines() if line.startswith("preempted ")}
    return (f"{sum(rc == 0 for rc in rcs)}/{NPROC} returned preempted=True, exit codes {sorted(set(rcs))}",
            time.monotonic() - t, f"all saved the same step: {len(saved) == 1} ({sorted(saved)}); 0 steps lost")


def _sigterm_inference(d, call):
    import json
    import signal
    import time

    out, model_dir = f"{d}/i.out", f"{d}/run"
    procs, _ = _launch(EVAL_WORKER, lambda i, port: [str(i), str(NPROC), str(port), model_dir, call, out], out)
    _wait_started(procs, out)
    procs[1].send_signal(signal.SIGTERM)
    t = time.monotonic()
    rcs, logs, _ = _finish(procs, 300)
    secs = time.monotonic() - t
    results = [json.load(open(f"{out}.{i}.json")) for i in range(NPROC) if os.path.exists(f"{out}.{i}.json")]
    errors = {r["error"] for r in results}
    same = len(errors) == 1 and None not in errors
    return (f"{sum(bool(r['error']) for r in results)}/{NPROC} raised PreemptedError, exit codes {sorted(set(rcs))}",
            secs, f"same batch on all: {same}; nothing written (eval dir: {any(r['eval_dir'] for r in results)})")


def case_sigterm_one_of_four_evaluate(d):
    return _sigterm_inference(d, "evaluate")


def case_sigterm_one_of_four_predict(d):
    return _sigterm_inference(d, "predict")


CLUSTER_CASES = {
    "4 processes: SIGKILL one mid-training, restart all": case_lost_mid_training,
    "4 processes: SIGKILL one as a save begins (the previous commit in flight), restart all": case_lost_mid_save,
    "4 processes: SIGKILL one mid-evaluation, restart all": case_lost_mid_evaluation,
    "4 processes: SIGTERM one mid-training": case_sigterm_one_of_four_training,
    "4 processes: SIGTERM one during evaluate": case_sigterm_one_of_four_evaluate,
    "4 processes: SIGTERM one during predict": case_sigterm_one_of_four_predict,
    **STAGED_CASES,  # gs://, staged saves of 1 and 4 processes (scripts/campaign_staged.py)
}


def run_cluster_case(name: str, timeout: float) -> tuple[str, str, str, str]:
    """Runs CLUSTER_CASES[name] in its own process: (outcome, seconds from the fault to the
    last exit, requests sent meanwhile, data lost)."""
    with tempfile.TemporaryDirectory() as d:
        try:
            out = subprocess.run([sys.executable, __file__, "--cluster-case", name, d], capture_output=True,
                                 text=True, timeout=timeout, cwd=ROOT)
        except subprocess.TimeoutExpired:
            return "HANG", f"killed after {timeout:.0f} s", "?", "?"
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        return "RAW (the case failed)", "", "?", (out.stderr.strip().splitlines() or [""])[-1][:160]
    outcome, secs, *requests, lost = lines[-1].split("\t")
    return outcome, f"{float(secs):.1f} s", requests[0] if requests else "- (local disk)", lost


# --- the object store (fake-gcs-server behind a proxy, tests/cloud): requests counted ----

STORE_TIMEOUT_S = 10.0  # RunConfig(storage_timeout_s) of these cases
STORE_CASES = {
    "gs:// store answers 503 to everything from a save on": "503",
    "gs:// store gone (connections dropped) mid-save": "gone",
}


def run_store_cases(names: list[str], timeout: float) -> dict[str, tuple[str, ...]]:
    """Runs tests/cloud/store_away_job.py (both cases in one process, hard timeout) against
    a fresh emulator: name -> (outcome, seconds from the fault to the raise, requests sent
    meanwhile, the newest checkpoint once the store is back, detail)."""
    import json
    import uuid

    sys.path.insert(0, str(ROOT))
    from tests.cloud import conftest

    cases = [STORE_CASES[n] for n in names]
    with tempfile.TemporaryDirectory() as d:
        server, url = conftest.start_emulator(os.path.join(d, "server.log"))
        env = {**os.environ, **conftest.client_env(url), "JAX_PLATFORMS": "cpu"}
        try:
            out = subprocess.run(
                [sys.executable, str(ROOT / "tests" / "cloud" / "store_away_job.py"), url,
                 f"gs://{conftest.BUCKET}/{uuid.uuid4().hex[:8]}", str(STORE_TIMEOUT_S), ",".join(cases)],
                capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
        except subprocess.TimeoutExpired:
            return {n: ("HANG", f"killed after {timeout:.0f} s", "?", "?", "") for n in names}
        finally:
            server.terminate()
            server.wait(timeout=10)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        tail = (out.stderr.strip().splitlines() or [""])[-1][:160]
        return {n: ("RAW (the case failed)", "", "?", "?", tail) for n in names}
    results = json.loads(lines[-1][len("RESULT "):])
    table = {}
    for name in names:
        r = results[STORE_CASES[name]]
        ours = r["error"] in OURS
        outcome = f"error {r['error']}" if ours else f"RAW {r['error']}"
        table[name] = (outcome, f"{r['seconds']} s", str(r["requests"]),
                       f"store back: newest checkpoint {r['latest_after']}", r["message"][:120])
    return table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=120)
    parser.add_argument("-k", default="")
    parser.add_argument("--cluster-case", nargs=2, metavar=("NAME", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cluster_case:
        print("\t".join(str(v) for v in CLUSTER_CASES[args.cluster_case[0]](args.cluster_case[1])))
        return 0
    bad = 0
    print("| case | outcome | time to exit | requests sent | data lost | detail |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, body in CASES.items():
        if args.k not in name:
            continue
        import time

        t0 = time.monotonic()
        outcome, detail = run_case(name, body, args.timeout)
        bad += outcome.startswith(("HANG", "RAW"))
        print(f"| {name} | {outcome} | {time.monotonic() - t0:.1f} s (whole case) | - (local disk) | - | "
              f"{detail.replace('|', '/')} |", flush=True)
    os.environ["CAMPAIGN_CACHE"] = cache = tempfile.mkdtemp(prefix="campaign_")  # the clean runs, once
    for name in CLUSTER_CASES:
        if args.k not in name:
            continue
        outcome, secs, requests, lost = run_cluster_case(name, max(args.timeout, 900))
        bad += outcome.startswith(("HANG", "RAW")) or "HANG" in outcome or "RAW" in outcome
        print(f"| {name} | {outcome} | {secs} after the fault | {requests} | {lost.replace('|', '/')} | |",
              flush=True)
    shutil.rmtree(cache, ignore_errors=True)
    store = [name for name in STORE_CASES if args.k in name]
    for name, (outcome, secs, requests, lost, detail) in (run_store_cases(store, 600) if store else {}).items():
        bad += outcome.startswith(("HANG", "RAW"))
        print(f"| {name} | {outcome} | {secs} after the fault (storage_timeout_s={STORE_TIMEOUT_S:g}) | "
              f"{requests} (503 or dropped) | {lost} | {detail.replace('|', '/')} |", flush=True)
    print(f"{bad} case(s) hung or ended in a raw traceback")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
