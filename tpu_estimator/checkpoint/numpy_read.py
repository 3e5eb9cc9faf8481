"""Reading a checkpoint's state without a model: its metadata, and chosen leaves as numpy.

Used by the variable reader and by the integrity check of checkpoints saved before
digests; of the package's checkpoint folder it imports only client_retries.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from etils import epath

from tpu_estimator.checkpoint import client_retries
from tpu_estimator.storage import bounded

_STATE = "state"  # the item of a checkpoint holding the TrainState (see Checkpointer.save)


def state_metadata(checkpoint_path: str) -> dict[str, Any]:
    """The state saved in checkpoint `<model_dir>/<step>` as nested dicts of Orbax
    `ArrayMetadata` (shape, dtype); reads no array.

    Raises:
      CheckpointStorageError: the store did not answer for `storage_timeout_s`.
    """
    import orbax.checkpoint as ocp

    def read() -> Any:
        handler = ocp.StandardCheckpointHandler()
        try:
            return handler.metadata(epath.Path(checkpoint_path) / _STATE)
        finally:
            handler.close()

    tree = bounded(read, uri=checkpoint_path, what="reading the checkpoint's metadata")
    return dict(getattr(tree, "tree", tree))


def this_process_alone() -> Any:
    """Orbax options for reading on whichever process calls (list_variables, load_variable
    on host 0 only): no barrier with the other processes, which may never join it."""
    import orbax.checkpoint as ocp

    return ocp.options.MultiprocessingOptions(
        primary_host=jax.process_index(), active_processes={jax.process_index()}
    )


def restore_state_numpy(checkpoint_path: str, subtree: Any) -> Any:
    """The leaves of `subtree` (a part of `state_metadata(checkpoint_path)`) read as numpy arrays.

    Reads nothing else (e.g. no optimizer state for the variables alone) and
    needs no mesh: it works on any device count, whatever topology saved it.

    Raises:
      CheckpointStorageError: the store did not answer for `storage_timeout_s`.
    """
    import orbax.checkpoint as ocp

    item = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), subtree)
    restore_args = jax.tree.map(lambda m: ocp.RestoreArgs(restore_type=np.ndarray), subtree)
    args = ocp.args.PyTreeRestore(item=item, restore_args=restore_args, partial_restore=True)
    alone = this_process_alone()

    client_retries.install()  # TensorStore's retries within storage_timeout_s

    def read() -> Any:
        handler = ocp.PyTreeCheckpointHandler(multiprocessing_options=alone)
        with ocp.Checkpointer(handler, multiprocessing_options=alone) as checkpointer:
            return checkpointer.restore(epath.Path(checkpoint_path) / _STATE, args=args)

    return bounded(read, uri=checkpoint_path, what="reading the checkpoint's variables")
