"""Every saved array of a checkpoint's state read in full, each read waited for.

The integrity check of a checkpoint saved before digests reads it in full once.
Orbax's restore runs its reads on an event loop of its own and closes that loop
as soon as one read fails, while TensorStore still completes the others: their
completions then hit the closed loop, and Python prints "Event loop is closed"
tracebacks from TensorStore's threads. Here each array is opened and read with
TensorStore directly, with Orbax's own read spec (`get_json_tspec_read`, as in
row_reads), on no event loop: every read of a group is waited for before the
first failure is raised, so no read outlives the check.
"""

from __future__ import annotations

import json
from typing import Any

from etils import epath

from tpu_estimator.checkpoint import row_reads
from tpu_estimator.storage import bounded

_STATE = "state"  # the item of a checkpoint holding the TrainState (see Checkpointer.save)
_GROUP = 16  # arrays read at once (their values are held until the group is read)
_ARRAY_TYPES = frozenset({"np.ndarray", "jax.Array", "scalar"})  # Orbax's value types stored as arrays


def read_state_in_full(checkpoint_path: str) -> None:
    """Reads every array of the state saved in checkpoint `checkpoint_path` in full and
    drops it: `_GROUP` arrays at a time, every read of a group finished before the next.

    The arrays are those named in Orbax's `_METADATA` (not Orbax's `metadata()`, which
    opens every array on its event loop too).

    Raises:
      Exception: TensorStore's error for the first array of a group that did not read
        (e.g. `ValueError: NOT_FOUND: ...` for a deleted data file), once the group's
        other reads have finished; `FileNotFoundError`/`ValueError` for a missing or
        unreadable `_METADATA`.
      CheckpointStorageError: the store did not answer for `storage_timeout_s`.
    """
    state = epath.Path(checkpoint_path) / _STATE

    def read() -> None:
        saved = json.loads((state / "_METADATA").read_text())
        names = _array_names(saved)
        open_array = _opener(state, saved)
        for start in range(0, len(names), _GROUP):
            _read_group([open_array(name) for name in names[start : start + _GROUP]])

    bounded(read, uri=checkpoint_path, what="reading the checkpoint in full")


def _array_names(saved: dict[str, Any]) -> list[str]:
    """The names Orbax stored the arrays of a pytree under (its keys joined by "."), from
    its `_METADATA` `saved`."""
    tree = saved.get("tree_metadata")
    if not isinstance(tree, dict):
        raise ValueError(f"_METADATA has no `tree_metadata` (keys: {sorted(saved)})")
    names = []
    for entry in tree.values():
        value = entry.get("value_metadata", {})
        if value.get("skip_deserialize") or value.get("value_type") not in _ARRAY_TYPES:
            continue
        names.append(".".join(str(k["key"]) for k in entry["key_metadata"]))
    return names


def _opener(state: epath.Path, saved: dict[str, Any]) -> Any:
    """`open_array(name)`: TensorStore's future of array `name` opened as Orbax reads it."""
    import orbax.checkpoint as ocp
    import tensorstore as ts

    # Orbax records the format; older _METADATA without it: look for the OCDBT manifest
    use_ocdbt = bool(saved["use_ocdbt"] if "use_ocdbt" in saved else ocp.type_handlers.is_ocdbt_checkpoint(state))
    use_zarr3 = bool(saved.get("use_zarr3", False))
    context = row_reads.read_context()

    def open_array(name: str) -> Any:
        info = ocp.type_handlers.ParamInfo(
            name=name, parent_dir=state, is_ocdbt_checkpoint=use_ocdbt, use_zarr3=use_zarr3,
            ts_context=context,
        )
        spec = ocp.type_handlers.get_json_tspec_read(info, use_ocdbt=use_ocdbt)
        return ts.open(spec, context=context, open=True, read=True)

    return open_array


def _read_group(opening: list[Any]) -> None:
    """Waits for every open in `opening` and every read of those that opened; then raises
    the first failure."""
    errors: list[BaseException] = []
    reading = []
    for future in opening:
        try:
            reading.append(future.result().read())
        except Exception as e:  # noqa: BLE001 - raised once every read has finished
            errors.append(e)
    for future in reading:
        try:
            future.result()
        except Exception as e:  # noqa: BLE001 - as above
            errors.append(e)
    if errors:
        raise errors[0]
