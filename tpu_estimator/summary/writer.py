"""TensorBoard event files, written by a background thread (summary/event_file.py; no TensorFlow).

`create_file_writer(logdir)` returns the process's one `FileWriter` for that
directory. Calls only enqueue; the thread encodes and writes. On processes
other than 0 the writer drops everything: one copy of each summary.

`logdir` may be on an object store (`gs://...`), which cannot append: there the
thread writes each event file in a local staging folder and uploads it whole
when it is closed (at every `flush()`, and every `UPLOAD_SECS` while
summaries keep coming), so each upload is a new event file object. TensorBoard
reads all the event files of a directory, in name order, as one run; the names
carry a per-process counter so that they sort in writing order.
"""

from __future__ import annotations

import atexit
import itertools
import os
import pathlib
import queue
import shutil
import tempfile
import threading
import time
from typing import Any, Callable, Mapping

import jax
import numpy as np
from etils import epath

from tpu_estimator.api.checks import message
from tpu_estimator.errors import CheckpointStorageError
from tpu_estimator.paths import as_uri, is_local
from tpu_estimator.storage import wait_for
from tpu_estimator.summary.event_file import EventFile

UPLOAD_SECS = 30.0  # an object-store logdir gets the events at least this often
_files = itertools.count()  # event file names: `events.out.tfevents.<time>.<host>.<pid>.<counter>`, in order
_writers: dict[str, "FileWriter"] = {}
_lock = threading.Lock()


class FileWriter:
    """Writes summaries to one directory from a background thread.

    Usable from a `host_call` function, a hook, or any host code.

    Example:
      >>> w = tpu_estimator.summary.create_file_writer('/tmp/m/extra')
      >>> w.scalar('my/value', 0.5, step=10)
      >>> w.flush()  # optional: waits until the event file holds it
    """

    def __init__(self, logdir: str, *, enabled: bool = True) -> None:
        self.logdir = as_uri(logdir, arg="logdir")
        self.enabled = enabled
        self._queue: queue.Queue[Any] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def scalar(self, name: str, value: Any, step: int) -> None:
        """Queues scalar `name` = `value` at `step`."""
        self._put(lambda w: w.add_scalar(name, float(np.asarray(value)), global_step=int(step)))

    def histogram(self, name: str, values: Any, step: int) -> None:
        """Queues a histogram of `values` at `step`."""
        arr = np.asarray(values, np.float64).ravel()
        self._put(lambda w: w.add_histogram(name, arr, global_step=int(step)))

    def image(self, name: str, images: Any, step: int) -> None:
        """Queues images `[N, H, W, C]` (floats in [0, 1] or uint8) at `step`, one tag per image."""
        arr = np.asarray(images)
        if arr.ndim == 3:
            arr = arr[None]
        for i, img in enumerate(arr):
            tag = name if len(arr) == 1 else f"{name}/image/{i}"
            self._put(lambda w, t=tag, x=img: w.add_image(t, x, global_step=int(step), dataformats="HWC"))

    def scalars(self, step: int, values: Mapping[str, Any]) -> None:
        """Queues every numeric scalar entry of `values` at `step` (others are skipped)."""
        for tag, value in values.items():
            arr = np.asarray(value)
            if arr.ndim == 0 and np.issubdtype(arr.dtype, np.number):
                self.scalar(tag, arr, step)

    def flush(self) -> None:
        """Blocks until everything queued so far is in the event file (which it closes; the
        next write starts a new one, which TensorBoard reads as the same run).

        Raises:
          CheckpointStorageError: naming the logdir, when a write since the last flush failed,
            or the object store did not answer for `storage_timeout_s` (RunConfig).
        """
        if self._thread is None:
            return
        done = threading.Event()
        self._put(done)
        wait_for(done, uri=self.logdir, what="writing summaries", alive=self._thread.is_alive)
        if self._error is not None:
            error, self._error = self._error, None
            raise CheckpointStorageError(
                message(
                    "Summaries are written in model_dir (or the logdir given), which must stay "
                    "writable.",
                    f"writing summaries to logdir={self.logdir!r} failed ({type(error).__name__}: {error})",
                    "Check that the storage is reachable and writable (the object store's "
                    "clients retry transient errors first: gcsfs 6 tries over ~31 s).",
                )
            ) from error

    def _put(self, op: Callable[[Any], Any] | threading.Event) -> None:
        if not self.enabled:
            return
        if self._thread is None:
            with _lock:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._run, name=f"summary-writer:{self.logdir}", daemon=True
                    )
                    self._thread.start()
        self._queue.put(op)

    def _run(self) -> None:
        local = is_local(self.logdir)
        writer, staging, opened = None, None, 0.0
        while True:
            try:
                timeout = None if local or writer is None else max(0.0, opened + UPLOAD_SECS - time.monotonic())
                op = self._queue.get(timeout=timeout)
            except queue.Empty:
                op = "upload"
            if op is None or op == "upload" or isinstance(op, threading.Event):
                if writer is not None:  # a flush point: the event file is closed (whole, for an upload)
                    try:
                        writer.close()
                        if staging is not None:
                            self._upload(staging)
                    except Exception as e:  # keep the thread alive; report on flush()
                        self._error = e
                    writer = None
                if op is None:
                    if staging is not None:
                        shutil.rmtree(staging, ignore_errors=True)
                    return
                if isinstance(op, threading.Event):
                    op.set()
                continue
            try:
                if writer is None:
                    if not local and staging is None:
                        staging = tempfile.mkdtemp(prefix="tpu_estimator_events_")
                    suffix = f".{os.getpid()}.{next(_files):06d}"
                    writer = EventFile(staging or self.logdir, suffix)
                    opened = time.monotonic()
                op(writer)
            except Exception as e:  # keep the thread alive; report on flush()
                self._error = e

    def _upload(self, staging: str) -> None:
        """Copies the closed event files of `staging` to the (object store) logdir, whole."""
        target = epath.Path(self.logdir)
        target.mkdir(parents=True, exist_ok=True)
        for local in sorted(pathlib.Path(staging).iterdir()):
            (target / local.name).write_bytes(local.read_bytes())
            local.unlink()

    def close(self) -> None:
        """Flushes and stops the thread (a later call starts a new one)."""
        if self._thread is not None:
            self.flush()
            self._queue.put(None)
            self._thread.join()
            self._thread = None


def create_file_writer(logdir: str) -> FileWriter:
    """The summary writer of `logdir` for this process (shared by all callers).

    On processes other than 0 it writes nothing.

    Args:
      logdir: Directory of the event files, e.g. `est.model_dir` or a subfolder.

    Returns:
      A `FileWriter` with `scalar/histogram/image(name, value, step)` and `flush()`.
    """
    key = as_uri(logdir, arg="logdir")
    with _lock:
        if key not in _writers:
            _writers[key] = FileWriter(key, enabled=jax.process_index() == 0)
        return _writers[key]


def write_scalars(logdir: str, step: int, values: Mapping[str, Any]) -> None:
    """Writes every scalar-valued entry of `values` at `step` into `logdir`, and flushes."""
    w = create_file_writer(logdir)
    w.scalars(step, values)
    w.flush()


def flush_all() -> None:
    """Flushes every writer of this process (train() calls it when it returns)."""
    for w in list(_writers.values()):
        w.flush()


@atexit.register
def _close_all() -> None:
    for w in list(_writers.values()):
        try:
            w.close()
        except Exception:  # pragma: no cover - best effort at exit
            pass
