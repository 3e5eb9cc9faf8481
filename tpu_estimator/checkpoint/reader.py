"""Saved variables read without a model: `list_variables` and `load_variable`.

What `tf.train.list_variables` / `tf.train.load_variable` were to TF users. A
path is a model_dir (its latest checkpoint), one checkpoint `<model_dir>/<step>`
(`latest_checkpoint()`), or an export directory (what `export_saved_model`
returned). Names are those of `TPUEstimator.get_variable_names()`: params by
their path alone (`Dense_0/kernel`), other collections with theirs as a prefix
(`batch_stats/BatchNorm_0/mean`), and `global_step` (an export has it when it
was exported from a checkpoint). Warm start reads its source through here.

Example:
  >>> for name, shape in tpu_estimator.list_variables('runs/mnist'):
  ...     print(name, shape)
  Dense_0/bias (512,)
  Dense_0/kernel (784, 512)
  ...
  >>> kernel = tpu_estimator.load_variable('runs/mnist', 'Dense_0/kernel')
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable, Iterable

import numpy as np
from etils import epath

from tpu_estimator.api.checks import message
from tpu_estimator.checkpoint import flat_io, integrity
from tpu_estimator.checkpoint.manager import Checkpointer
from tpu_estimator.checkpoint.variables import (
    GLOBAL_STEP,
    Readers,
    checkpoint_rows,
    checkpoint_shapes,
    checkpoint_variables,
)
from tpu_estimator.paths import as_uri, join
from tpu_estimator.storage import bounded

_PARAMS_PREFIX = "params/"
_SHOWN_NAMES = 50  # names listed in an unknown-name error


def list_variables(
    ckpt_dir_or_file: str | os.PathLike[str], *, readers: Readers | None = None
) -> list[tuple[str, tuple[int, ...]]]:
    """The saved variables' names and shapes, sorted by name; no array is read.

    Args:
      ckpt_dir_or_file: A model_dir (its latest checkpoint), one checkpoint
        `<model_dir>/<step>`, or an export directory.
      readers: Readers of components' state (checkpoint/variables.py; the public
        `tpu_estimator.list_variables` passes the registered ones).

    Returns:
      `[(name, shape), ...]`, e.g. `[('Dense_0/bias', (16,)), ...,
      ('global_step', ())]`.

    Raises:
      ValueError: the path holds no checkpoint and is no export.
      DamagedCheckpointError: (a ValueError) the checkpoint read (a model_dir's newest) is
        damaged: its files differ from those recorded when it was saved.
      CheckpointStorageError: the path's object store did not answer for `storage_timeout_s`.
    """
    return _bounded(ckpt_dir_or_file, lambda: sorted(_open(ckpt_dir_or_file, readers).shapes().items()))


def load_variable(
    ckpt_dir_or_file: str | os.PathLike[str], name: str, *, readers: Readers | None = None
) -> np.ndarray:
    """The saved value of one variable (see `list_variables` for the names).

    Only that variable is read; the checkpoint may come from any device count.

    Args:
      ckpt_dir_or_file: A model_dir (its latest checkpoint), one checkpoint
        `<model_dir>/<step>`, or an export directory.
      name: A variable name, e.g. `'Dense_0/kernel'` or `'global_step'`.
      readers: As in `list_variables`.

    Returns:
      The value as a numpy array.

    Raises:
      ValueError: the path holds no checkpoint and is no export, or `name` is
        not saved there (the message lists the names that are).
      DamagedCheckpointError: (a ValueError) the checkpoint read is damaged.
      CheckpointStorageError: the path's object store did not answer for `storage_timeout_s`.
    """
    return _bounded(ckpt_dir_or_file, lambda: _load_variable(ckpt_dir_or_file, name, readers))


def _load_variable(ckpt_dir_or_file: Any, name: str, readers: Readers | None) -> np.ndarray:
    source = _open(ckpt_dir_or_file, readers)
    names = sorted(source.shapes())
    if name not in names:
        shown = names[:_SHOWN_NAMES]
        more = f" (and {len(names) - len(shown)} more)" if len(names) > len(shown) else ""
        raise ValueError(
            message(
                f"Expected the name of a variable saved at {source.path!r}.",
                f"name={name!r}",
                f"Use one of list_variables(): {shown}{more}.",
            )
        )
    return source.read([name])[name]


def load_variables(
    ckpt_dir_or_file: str | os.PathLike[str], *, readers: Readers | None = None
) -> dict[str, np.ndarray]:
    """Every saved variable by name (`global_step` included when saved)."""
    return _bounded(ckpt_dir_or_file, lambda: _open(ckpt_dir_or_file, readers).read(None))


@dataclasses.dataclass(frozen=True)
class VariableSource:
    """The variables saved at a path, for reading some of them (warm start): each call
    bounded by `storage_timeout_s` as `load_variables` is."""

    path: Any
    opened: Any  # _Export | _Checkpoint
    open_rows: Callable[[str], Callable[[Any], Any]] | None = None

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """name -> shape of every saved variable; no array is read."""
        return _bounded(self.path, self.opened.shapes)

    def read(self, names: Iterable[str]) -> dict[str, np.ndarray]:
        """The variables `names`, whole."""
        names = list(names)
        return _bounded(self.path, lambda: self.opened.read(names)) if names else {}

    def rows(self, names: Iterable[str]) -> dict[str, Any]:
        """name -> a source its component reads by rows, for those of `names` that a
        component's reader reads so (a checkpoint's embedding tables); {} for an export or
        without `open_rows` (`open_rows(checkpoint_path)(leaf)`: checkpoint/row_reads.py)."""
        names = list(names)
        if self.open_rows is None or not isinstance(self.opened, _Checkpoint) or not names:
            return {}
        opened, open_rows = self.opened, self.open_rows
        return _bounded(
            self.path, lambda: checkpoint_rows(opened.path, names, opened.readers, open_rows(opened.path))
        )


def variable_source(
    ckpt_dir_or_file: str | os.PathLike[str], *, readers: Readers | None = None,
    open_rows: Callable[[str], Callable[[Any], Any]] | None = None,
) -> VariableSource:
    """The model_dir, checkpoint or export at `ckpt_dir_or_file` opened for reading chosen
    variables: shapes first, then only the variables wanted (warm start); with `open_rows`,
    components' variables read by rows (`VariableSource.rows`).

    Raises:
      As `load_variables`.
    """
    return VariableSource(
        ckpt_dir_or_file, _bounded(ckpt_dir_or_file, lambda: _open(ckpt_dir_or_file, readers)), open_rows
    )


def _bounded(ckpt_dir_or_file: Any, read: Callable[[], Any]) -> Any:
    """`read()`, ended by CheckpointStorageError when the path's object store stays away
    for `storage_timeout_s` (tpu_estimator/storage.py); local paths are read directly."""
    path = os.fsdecode(ckpt_dir_or_file) if isinstance(ckpt_dir_or_file, bytes) else ckpt_dir_or_file
    if not isinstance(path, (str, os.PathLike)):
        return read()  # (`_open` raises the TypeError naming the argument)
    uri = as_uri(path, arg="ckpt_dir_or_file")
    return bounded(read, uri=uri, what=f"reading the variables saved at {uri}")


@dataclasses.dataclass(frozen=True)
class _Export:
    """An export directory: variables in its safetensors file, the step in its manifest."""

    path: str
    manifest: dict[str, Any]

    def _step(self) -> dict[str, np.ndarray]:
        step = self.manifest.get("global_step")
        return {} if step is None else {GLOBAL_STEP: np.asarray(step, np.int32)}

    def shapes(self) -> dict[str, tuple[int, ...]]:
        flat = flat_io.shapes(self.path, self.manifest["variables"]["file"])
        out = {_unprefixed(k): v for k, v in flat.items()}
        out.update({k: v.shape for k, v in self._step().items()})
        return out

    def read(self, names: Iterable[str] | None) -> dict[str, np.ndarray]:
        var = self.manifest["variables"]
        stored = {_unprefixed(k): k for k in flat_io.shapes(self.path, var["file"])}
        step = self._step()
        wanted = [*stored, *step] if names is None else list(names)
        keys = [stored[n] for n in wanted if n in stored]
        flat = flat_io.load(self.path, var["file"], var.get("dtypes"), names=keys)
        out = {_unprefixed(k): v for k, v in flat.items()}
        out.update({k: v for k, v in step.items() if k in wanted})
        return out


@dataclasses.dataclass(frozen=True)
class _Checkpoint:
    """One Orbax checkpoint `<model_dir>/<step>`."""

    path: str
    readers: Readers | None = None

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return checkpoint_shapes(self.path, self.readers)

    def read(self, names: Iterable[str] | None) -> dict[str, np.ndarray]:
        return checkpoint_variables(self.path, names, self.readers)


def _unprefixed(name: str) -> str:
    """An export's name (`params/Dense_0/kernel`) as a checkpoint's (`Dense_0/kernel`)."""
    return name[len(_PARAMS_PREFIX):] if name.startswith(_PARAMS_PREFIX) else name


def _with_checkpointer(directory: str, fn: Callable[[Checkpointer], Any]) -> Any:
    ckpt = Checkpointer(directory, read_only=True)
    try:
        return fn(ckpt)
    finally:
        ckpt.close()


def _open(ckpt_dir_or_file: Any, readers: Readers | None = None) -> _Export | _Checkpoint:
    """The export or checkpoint that `ckpt_dir_or_file` names (bytes too, as
    `export_saved_model` returns the export's path)."""
    if isinstance(ckpt_dir_or_file, bytes):
        ckpt_dir_or_file = os.fsdecode(ckpt_dir_or_file)
    if not isinstance(ckpt_dir_or_file, (str, os.PathLike)):
        raise TypeError(
            message(
                "Expected a path: a model_dir, a checkpoint `<model_dir>/<step>` or an export directory.",
                f"ckpt_dir_or_file={ckpt_dir_or_file!r}",
            )
        )
    path = as_uri(ckpt_dir_or_file, arg="ckpt_dir_or_file")
    manifest = epath.Path(path) / flat_io.MANIFEST_FILE
    if manifest.is_file():
        return _Export(path, json.loads(manifest.read_text()))
    fix = (
        "Pass a model_dir after train(), a checkpoint path from latest_checkpoint(), or the "
        "directory that export_saved_model returned."
    )
    if not epath.Path(path).is_dir():
        raise ValueError(
            message(
                "Expected a model_dir, a checkpoint `<model_dir>/<step>` or an export directory.",
                f"path={path!r}, which does not exist",
                fix,
            )
        )
    steps = _with_checkpointer(path, lambda c: c.all_steps())  # verified: see checkpoint/integrity.py
    step = integrity.newest_intact(path, steps, fall_back=False, configurable=False)
    if step is not None:
        return _Checkpoint(join(path, str(step)), readers)
    base, name = str(epath.Path(path).parent), epath.Path(path).name
    if name.isdigit():
        steps = _with_checkpointer(base, lambda c: c.all_steps())
        if int(name) in steps:
            integrity.check_chosen(base, int(name), steps)
            return _Checkpoint(path, readers)
    raise ValueError(
        message(
            "Expected a model_dir with checkpoints, a checkpoint `<model_dir>/<step>` or an export "
            f"directory (holding {flat_io.MANIFEST_FILE}).",
            f"path={path!r}, which holds no checkpoint",
            fix,
        )
    )
