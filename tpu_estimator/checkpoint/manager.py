"""`Checkpointer`: saves and restores the training state (and input position) with Orbax.

A checkpoint is the directory `model_dir/<step>/` holding `state` (params,
other collections, optimizer state, step, RNG key) and, when the input
pipeline is checkpointable, `input` (its position, as JSON), and
`tpu_estimator_digests.json` (every file's size and CRC-32C, written before
the step is committed; see checkpoint/integrity.py).

On gs:// with one process a save is staged (checkpoint/staging.py: Orbax writes
it on local disk, then its files are uploaded, the commit marker last) and
Orbax's manager only lists and restores; elsewhere the manager saves.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import logging
import os
import uuid
from typing import Any

import jax
from etils import epath

from tpu_estimator.api.checks import message
from tpu_estimator.errors import CheckpointStorageError
from tpu_estimator.checkpoint import client_retries, integrity
from tpu_estimator.checkpoint.staging import StagedWriter, stages
from tpu_estimator.checkpoint.numpy_read import restore_state_numpy, state_metadata, this_process_alone
from tpu_estimator.checkpoint.row_reads import CHUNK_BYTES, chunked_save_args
from tpu_estimator.paths import as_uri, join
from tpu_estimator.storage import bounded

# Orbax (with tensorstore: ~0.2 s and ~230 modules) is imported by the functions that
# use it, so `import tpu_estimator` does not pay for it before a checkpoint is touched.

STORAGE_FIX = (
    "Pass a model_dir that is a directory (or does not exist yet) on storage this process "
    "can write to, with free space and no file in the way of its `<step>` directories."
)


def check_writable(directory: str) -> None:
    """Creates `directory` if needed, then writes and deletes a probe file in it.

    Raises:
      CheckpointStorageError: naming `directory`, when either fails.
    """
    path = epath.Path(directory)
    probe = path / f".tpu_estimator_probe_{os.getpid()}_{uuid.uuid4().hex}"

    def write_and_delete() -> None:
        path.mkdir(parents=True, exist_ok=True)
        probe.write_text("probe")
        probe.unlink()

    try:
        bounded(write_and_delete, uri=str(directory), what="checking that model_dir is writable")
    except CheckpointStorageError:
        raise
    except Exception as e:  # OSError locally; object stores raise their own
        raise CheckpointStorageError(
            message(
                "train() writes checkpoints and summaries in model_dir, which must be a writable "
                "directory.",
                f"model_dir={directory!r} ({type(e).__name__}: {e})",
                STORAGE_FIX,
            )
        ) from e


def split_checkpoint_path(path: str | os.PathLike[str]) -> tuple[str, int]:
    """`model_dir/<step>` -> (model_dir, step)."""
    path = as_uri(path, arg="checkpoint_path")
    base, name = str(epath.Path(path).parent), epath.Path(path).name
    if not name.isdigit() or not bounded(epath.Path(path).is_dir, uri=path, what="reading checkpoint_path"):
        raise ValueError(
            message(
                "`checkpoint_path` must be a checkpoint directory `<model_dir>/<step>`, as "
                "returned by latest_checkpoint().",
                f"checkpoint_path={path!r}",
            )
        )
    return base, int(name)


class Checkpointer:
    """Orbax `CheckpointManager` for one directory, saving asynchronously (staged on gs://:
    checkpoint/staging.py); an array's saved chunks are at most `chunk_bytes` (a restore
    reading chosen rows decodes one at a time, whatever device count saved it:
    checkpoint/row_reads.py)."""

    def __init__(
        self,
        directory: str,
        *,
        max_to_keep: int | None = None,
        keep_every_n_hours: float | None = None,
        read_only: bool = False,
        chunk_bytes: int = CHUNK_BYTES,
    ) -> None:
        self.directory = as_uri(directory, arg="model_dir")
        self._chunk_bytes = chunk_bytes  # the largest saved chunk of an array (row_reads.py)
        self._uncommitted: collections.deque[tuple[int, bool]] = collections.deque()  # (step, input?)
        self._saving: int | None = None  # the step of the background save not yet waited for
        self.committed_step: int | None = None  # the step of this manager's last save, once on disk
        self._store_away = False  # the store stopped answering: Orbax's threads are stuck in it
        keep_time = (
            datetime.timedelta(hours=keep_every_n_hours)
            if keep_every_n_hours and keep_every_n_hours < 10000
            else None
        )
        import orbax.checkpoint as ocp

        client_retries.install()  # TensorStore's retries within storage_timeout_s
        staged = stages(self.directory, read_only=read_only)
        if staged:  # the manager only lists and restores: opened as readers open it
            read_only = True
        # Orbax lists the steps (and creates the directory) here: bounded like every read.
        # (Its warning that the directory is read-only is dropped for a staged model_dir.)
        self._manager = self._bounded(lambda: _quiet_read_only(staged, lambda: ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                multiprocessing_options=this_process_alone() if read_only else ocp.options.MultiprocessingOptions(),
                max_to_keep=max_to_keep or None,
                keep_time_interval=None if read_only else keep_time,  # (Orbax warns)
                create=not read_only,
                read_only=read_only,
                # Reading: no step's metadata is read when the steps are listed (a request or
                # more per step on an object store; its commit time matters only to deletions).
                lightweight_initialize=read_only,
                save_interval_steps=0 if read_only else 1,  # (read-only: Orbax warns unless 0)
                enable_async_checkpointing=not read_only,
                async_options=None if read_only else ocp.AsyncOptions(
                    post_finalization_callback=self._write_digests,
                    # In the caller's thread: a directory that cannot be made is an error from
                    # save(); made in the background, Orbax's other threads wait for it forever.
                    create_directories_asynchronously=False,
                ),
            ),
        )), "opening the checkpoints of model_dir")
        self._staged = StagedWriter(
            self.directory, steps=self._manager.all_steps(), max_to_keep=max_to_keep or None,
            keep_time=keep_time,
        ) if staged else None

    def latest_step(self) -> int | None:
        self._reload()
        return self._manager.latest_step()

    def all_steps(self, *, reload: bool = True) -> list[int]:
        """The saved steps; `reload=False` trusts the last directory scan (plus own saves)."""
        if reload:
            self._reload()
        elif self._staged is not None:  # the manager does not see staged saves until reloaded
            return self._staged.steps
        return list(self._manager.all_steps())

    def _reload(self) -> None:
        self._bounded(self._manager.reload, "listing the checkpoints")

    def path(self, step: int) -> str:
        return join(self.directory, str(step))

    def save(self, step: int, state: Any, input_state: Any = None) -> bool:
        """Starts saving `state` at `step` in the background; False if that step exists.

        Raises:
          CheckpointStorageError: the previous save failed, or `<step>` cannot be created.
        """
        import orbax.checkpoint as ocp

        self.wait()  # (Orbax waits too): the previous save's failure is raised as ours
        if step in self.all_steps(reload=False):
            if not integrity.move_aside_if_damaged(
                self.directory, step, self.all_steps(reload=False), rename=jax.process_index() == 0
            ):
                return False
            self._reload()
            if self._staged is not None:
                self._staged.forget(step)
        save_args = chunked_save_args(state, chunk_bytes=self._chunk_bytes)
        items = {"state": ocp.args.StandardSave(state, save_args=save_args)}
        if input_state is not None:
            items["input"] = ocp.args.JsonSave(input_state)
        if self._staged is not None:
            staged = self._staged
            self._bounded(lambda: staged.save(step, ocp.args.Composite(**items),
                                              input_saved=input_state is not None),
                          f"saving checkpoint {step}")
            self._saving = step
            return True
        primary = jax.process_index() == 0  # where Orbax runs the post-finalization callback
        if primary:
            self._uncommitted.append((step, input_state is not None))
        try:
            started = bool(self._bounded(
                lambda: self._manager.save(step, args=ocp.args.Composite(**items), force=True),
                f"saving checkpoint {step}",
            ))
        except BaseException as e:
            if primary:
                self._uncommitted.pop()
            if isinstance(e, CheckpointStorageError):
                raise
            if isinstance(e, OSError):  # e.g. a file where the step's directory goes
                raise self._storage_error(e, step) from e
            raise
        if not started:
            if primary:
                self._uncommitted.pop()
        else:
            self._saving = step
        return started

    def _write_digests(self) -> None:
        """Orbax's post-finalization callback (process 0, saves in order): the digests of the
        step it is about to commit."""
        if not self._uncommitted:  # a save given up on (the store stayed away) commits late
            return
        step, input_saved = self._uncommitted.popleft()
        integrity.commit_digests(self.directory, step, input_saved=input_saved)

    def restore(self, step: int, abstract: Any) -> Any:
        """The state restored into `abstract`'s structure (ShapeDtypeStructs with shardings).

        Raises:
          CheckpointStorageError: the store did not answer for `storage_timeout_s`.
        """
        import orbax.checkpoint as ocp

        out = self._bounded(lambda: self._manager.restore(
            step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract))
        ), f"restoring checkpoint {step}")
        return out["state"]

    def restore_input(self, step: int) -> Any:
        """The input position saved with `step`, or None.

        Raises:
          CheckpointStorageError: the store did not answer for `storage_timeout_s`.
        """
        import orbax.checkpoint as ocp

        def read() -> Any:
            if not epath.Path(self.path(step), "input").is_dir():
                return None
            return self._manager.restore(step, args=ocp.args.Composite(input=ocp.args.JsonRestore()))["input"]

        return self._bounded(read, f"restoring the input position of checkpoint {step}")

    def restore_raw(self, step: int, *, leave_out: tuple[str, ...] = ()) -> dict[str, Any]:
        """The saved state as nested dicts of numpy arrays (no model needed), but for its
        top-level fields `leave_out` (e.g. "opt_state", which inference never reads).

        Read as numpy, whatever topology saved it (Orbax's restore without a target would
        place each array as saved, and refuses another process or device count).

        Raises:
          CheckpointStorageError: the store did not answer for `storage_timeout_s`.
        """
        tree = {k: v for k, v in state_metadata(self.path(step)).items() if k not in leave_out}
        return restore_state_numpy(self.path(step), tree)

    def wait(self) -> None:
        """Blocks until background saves are on disk.

        Raises:
          CheckpointStorageError: a background save failed (the storage refused it).
        """
        wait = self._manager.wait_until_finished if self._staged is None else self._staged.wait
        try:
            self._bounded(wait, f"waiting for checkpoint {self._saving}")
        except CheckpointStorageError:
            raise
        except Exception as e:
            raise self._storage_error(e, self._saving) from e
        if self._saving is not None:
            self.committed_step = self._saving
        self._saving = None

    def close(self) -> None:
        """Waits for background saves, then ends Orbax's threads.

        Once the store has stayed away past the deadline (an error raised already) it does
        not wait: Orbax's threads are left to end with their clients' own retries.

        Raises:
          CheckpointStorageError: a background save failed.
        """
        if self._store_away:
            return
        staged = self._staged

        def close() -> None:
            try:
                if staged is not None:
                    staged.close()
            finally:
                self._manager.close()

        try:
            self._bounded(close, "closing the checkpoint manager")
        except CheckpointStorageError:
            raise
        except Exception as e:
            raise self._storage_error(e, self._saving) from e

    def _bounded(self, fn: Any, what: str) -> Any:
        """`fn()`, failing with CheckpointStorageError once the store stays away past
        `storage_timeout_s` (tpu_estimator/storage.py)."""
        try:
            return bounded(fn, uri=self.directory, what=what)
        except CheckpointStorageError:
            self._store_away = True
            raise

    def _storage_error(self, error: BaseException, step: int | None = None) -> CheckpointStorageError:
        what = "a checkpoint" if step is None else f"checkpoint {step}"
        return CheckpointStorageError(
            message(
                f"Saving {what} in model_dir failed: its storage refused the write.",
                f"model_dir={self.directory!r} ({type(error).__name__}: {error})",
                STORAGE_FIX,
            )
        )


def _quiet_read_only(quiet: bool, make: Any) -> Any:
    """`make()`, without Orbax's "Given directory is read only" warning when `quiet`."""
    if not quiet:
        return make()
    logger = logging.getLogger("absl")

    def drop(record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Given directory is read only")

    logger.addFilter(drop)
    try:
        return make()
    finally:
        logger.removeFilter(drop)


@dataclasses.dataclass(frozen=True)
class CheckpointRef:
    """One checkpoint: the manager of its directory and its step."""

    checkpointer: Checkpointer
    step: int

    @property
    def path(self) -> str:
        return self.checkpointer.path(self.step)
