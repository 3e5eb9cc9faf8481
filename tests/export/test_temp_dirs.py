"""What interrupted local exports left (`.temp-*`) is removed by the next export into the
same base when its writer is gone, and kept while it may still be writing."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import export_test_model as tm

from tpu_estimator.export import temp_dirs


def test_the_next_export_removes_abandoned_temporary_directories(trained_est, tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        host, now = temp_dirs.host_tag(), int(time.time())
        names = {
            "dead writer": f".temp-{now}-{host}-{dead.pid}-0a1b2c3d",
            "running writer": f".temp-{now}-{host}-{alive.pid}-0a1b2c3d",
            "other host, fresh": f".temp-{now}-elsewhere-123-0a1b2c3d",
            "other host, stale": f".temp-{now - 2 * int(temp_dirs.STALE_S)}-elsewhere-123-0a1b2c3d",
            "older name, stale": f".temp-{now - 2 * int(temp_dirs.STALE_S)}-0a1b2c3d",
            "older name, fresh": f".temp-{now}-0a1b2c3d",
        }
        for name in names.values():
            (tmp_path / name / "variables").mkdir(parents=True)
            (tmp_path / name / "variables" / "part").write_bytes(b"x" * 10)
        path = os.fsdecode(trained_est.export_saved_model(str(tmp_path), tm.receiver_fn))
    finally:
        alive.kill()
        alive.wait()
    left = {n for n in os.listdir(tmp_path) if n.startswith(".temp")}
    assert left == {names["running writer"], names["other host, fresh"], names["older name, fresh"]}, left
    assert os.path.basename(path).isdigit()

