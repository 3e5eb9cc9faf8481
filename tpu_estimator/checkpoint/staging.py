"""Staged saves on gs://: Orbax writes the step on local disk, then its files are uploaded.

Orbax's `CheckpointManager` writing to gs:// directly sends ~110 requests per save
of a small model, most of them existence checks and resumable uploads of its small
metadata files (docs/cluster.md, "Object-store traffic"); no public option removes
them. A staged save sends only the step's files:

1. in the caller's thread, Orbax's `AsyncCheckpointer` (the same handlers and
   layout as the manager's saves) starts writing `<staging>/<step>` on local disk
   (the device-to-host copy, as before; no request);
2. on one background thread: once Orbax has finished it locally, the digests are
   recorded (checkpoint/integrity.py, from the local files), every file except
   the step's `commit_success.txt` is uploaded to `<model_dir>/<step>/` in one
   request each (files of 5 MiB or more: 1 + one per 50 MiB part; gcsfs, in
   parallel), then `commit_success.txt`: the marker by which Orbax's readers take
   a step on gs:// as complete, so an interrupted save leaves no step a reader
   uses; the local copy is removed; steps that `keep_checkpoint_max` /
   `keep_checkpoint_every_n_hours` no longer keep are deleted, marker first
   (checkpoint/retention.py).

Only on gs:// (where Orbax's readers go by that marker). With several processes each
stages and uploads its own part, and process 0 merges their OCDBT trees on the store
before the marker (checkpoint/process_parts.py). The local disk (`TMPDIR`) needs room
for this host's part of one checkpoint.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import json
import os
import shutil
import tempfile
import threading
import time
import weakref
from typing import Any, Iterable

import jax

from tpu_estimator.api.checks import message
from tpu_estimator.checkpoint import integrity, listing, process_parts, retention
from tpu_estimator.errors import CheckpointStorageError
from tpu_estimator.paths import process_running

COMMIT_MARKER = "commit_success.txt"  # Orbax's: CommitFileTemporaryPath, gs:// steps
_PREFIX = "tpu_estimator_staging_"


def stages(directory: str, *, read_only: bool) -> bool:
    """Whether saves to `directory` are staged: a writable gs:// directory."""
    return not read_only and str(directory).startswith("gs://")


class StagedWriter:
    """Saves steps of one gs:// `directory` through local disk, one save in flight.

    Args:
      directory: The model_dir (gs://).
      steps: Its steps now (as Orbax lists them), for the retention rules.
      max_to_keep: Keep the newest this many steps (None: every step).
      keep_time: Also keep one step per this interval (Orbax's `EveryNSeconds`).
    """

    def __init__(
        self, directory: str, *, steps: Iterable[int], max_to_keep: int | None,
        keep_time: datetime.timedelta | None,
    ) -> None:
        import orbax.checkpoint as ocp  # (imported here: see checkpoint/manager.py)

        self.directory = directory.rstrip("/")
        self._max_to_keep = max_to_keep
        self._keep_time = keep_time
        self._saved: dict[int, float | None] = {s: None for s in steps}  # step -> commit time
        self._lock = threading.Lock()  # _saved: changed on the upload thread
        _remove_stale_roots()
        try:
            self._root = tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}_")
        except OSError as e:
            raise _local_error(os.path.join(tempfile.gettempdir(), f"{_PREFIX}..."), e) from e
        self._cleanup = weakref.finalize(self, shutil.rmtree, self._root, True)
        self._several = process_parts.several()
        self._checkpointer = (process_parts.checkpointer() if self._several
                              else ocp.AsyncCheckpointer(ocp.CompositeCheckpointHandler()))
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="checkpoint-upload")
        self._pending: concurrent.futures.Future[None] | None = None

    @property
    def steps(self) -> list[int]:
        """The steps of the directory as this writer knows them (its own saves and deletes)."""
        with self._lock:
            return sorted(self._saved)

    def forget(self, step: int) -> None:
        """`step` is no longer in the directory (moved aside by the caller)."""
        with self._lock:
            self._saved.pop(step, None)

    def save(self, step: int, args: Any, *, input_saved: bool) -> None:
        """Starts saving `args` (an `ocp.args.Composite`) as `step`; waits for the previous save.

        Raises:
          CheckpointStorageError: the local staging directory cannot be written (with
            several processes: raised by the next `wait()` of every process, naming the
            process and its directory).
        """
        self.wait()
        local = os.path.join(self._root, str(step))
        if self._several:
            # Orbax's array-metadata store is one object shared by every handler of
            # jax.Array, and each PyTree handler made sets which process creates its
            # directory: a reader's handler made since (a restore) sets process 0, and the
            # other processes then wait 600 s for a directory that only process 0 would
            # make, on its own disk. A checkpointer made for each save sets it back.
            self._checkpointer.close()
            self._checkpointer = process_parts.checkpointer()
        try:
            self._checkpointer.save(local, args=process_parts.save_args(args) if self._several else args,
                                    force=True)
        except OSError as e:
            if not self._several:
                raise _local_error(local, e) from e
            # The other processes are saving this step and wait for this part at the
            # barrier: the failure goes there (process_parts.finish), so that every process
            # raises it at its next wait, at the same step, and nothing is committed.
            failed = _local_error(local, e)
            failed.__cause__ = e
            self._pending = self._pool.submit(self._finish, step, local, input_saved, failed)
            return
        self._pending = self._pool.submit(self._finish, step, local, input_saved)

    def wait(self) -> None:
        """Blocks until the save in flight is committed on the store (or raises its error)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        """Waits for the save in flight, then ends the threads and removes the local copies."""
        try:
            self.wait()
        finally:
            self._pool.shutdown(wait=False)
            self._checkpointer.close()
            self._cleanup()

    def _finish(self, step: int, local: str, input_saved: bool,
                failed: CheckpointStorageError | None = None) -> None:
        remote = f"{self.directory}/{step}"
        if self._several:  # each process its part; process 0 merges, records, commits
            process_parts.finish(local, remote, input_saved=input_saved,
                                 written=lambda: self._written(local, failed), upload=_put, commit=_commit)
        else:
            self._written(local)
            try:
                integrity.write_digests(local, input_saved=input_saved)
            except OSError as e:
                raise _local_error(local, e) from e
            _put(local, remote, list(listing.list_files(local)))
            _commit(remote)
        shutil.rmtree(local, ignore_errors=True)
        with self._lock:
            self._saved[step] = time.time()
        self._delete_old()

    def _written(self, local: str, failed: CheckpointStorageError | None = None) -> None:
        """Waits until Orbax has written the local copy `local` (raises `failed`: its save
        could not start)."""
        if failed is not None:
            raise failed
        try:
            self._checkpointer.wait_until_finished()
        except OSError as e:
            raise _local_error(local, e) from e

    def _delete_old(self) -> None:
        with self._lock:
            saved = dict(self._saved)
        if self._keep_time is not None:  # the commit times of steps saved before this writer
            saved = {s: _commit_time(f"{self.directory}/{s}") if t is None else t for s, t in saved.items()}
            with self._lock:
                self._saved.update({s: t for s, t in saved.items() if s in self._saved})
        for s in retention.to_delete(saved, max_to_keep=self._max_to_keep, keep_time=self._keep_time):
            if jax.process_index() == 0:  # (the others follow in their own list)
                delete_step(f"{self.directory}/{s}")
            with self._lock:
                self._saved.pop(s, None)


def _put(local: str, remote: str, names: list[str]) -> None:
    """Uploads the files `names` of `local` under `remote`, one request each (not the
    local commit marker: `_commit` writes the step's, last)."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(remote)
    names = [n for n in names if n != COMMIT_MARKER]
    if names:
        fs.put([os.path.join(local, *n.split("/")) for n in names], [f"{root}/{n}" for n in names])


def _commit(remote: str) -> None:
    """Writes the commit marker of step directory `remote`: the step is complete."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(remote)
    fs.pipe_file(f"{root}/{COMMIT_MARKER}", f"Checkpoint commit was successful to {remote}".encode())


def delete_step(remote: str) -> None:
    """Deletes step directory `remote`: its commit marker first, so that a deletion cut
    short leaves no step a reader takes as complete."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(remote)
    try:
        fs.rm_file(f"{root}/{COMMIT_MARKER}")
    except FileNotFoundError:
        pass
    try:
        fs.rm(root, recursive=True)
    except FileNotFoundError:
        pass


def _commit_time(remote: str) -> float | None:
    """Orbax's commit time of step directory `remote` (seconds), None if unreadable."""
    try:
        meta = json.loads(listing.read_bytes(remote, "_CHECKPOINT_METADATA"))
        return int(meta["commit_timestamp_nsecs"]) / 1e9
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _remove_stale_roots() -> None:
    """Removes the staging directories of processes that no longer run (killed mid-save)."""
    base = tempfile.gettempdir()
    try:
        names = os.listdir(base)
    except OSError:
        return
    for name in names:
        pid = name[len(_PREFIX):].split("_", 1)[0] if name.startswith(_PREFIX) else ""
        if pid.isdigit() and int(pid) != os.getpid() and not process_running(int(pid)):
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)


def _local_error(path: str, error: BaseException) -> CheckpointStorageError:
    return CheckpointStorageError(
        message(
            "A save to gs:// is first written to a local staging directory, which must have "
            "room for this host's part of one checkpoint.",
            f"staging directory {path!r} ({type(error).__name__}: {error})",
            "Set the TMPDIR environment variable to a local directory with that much free space.",
        )
    )
