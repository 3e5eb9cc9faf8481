"""A staged save (checkpoint/staging.py) of several processes: each stages its own part.

Orbax's multi-process save writes one step directory that all processes share: each
writes the chunks of its replica-0 shards into `<item>/ocdbt.process_<i>/`, process 0
also the metadata files (`_METADATA`, `_sharding`, each array's zarr metadata, the
step's `_CHECKPOINT_METADATA`), and process 0 merges the per-process OCDBT trees into
the item's root tree at the end. Hosts share no local disk, so a staged save of several
processes goes:

1. each process saves alone into its own local directory, with Orbax's options for
   per-host saves (`primary_host=None`, `active_processes={this process}`, as its
   emergency checkpointer's local saves) and the registered `jax.Array` handler, which
   still writes each array's metadata from process 0 only; Orbax's check of the local
   merge is off (a process other than 0 has the chunks of its arrays, not their
   metadata): the merge on the store is checked instead (4.);
2. each process uploads its part, one request per file: process 0 every file but each
   item's local root tree (the merge of its own tree alone) and the commit marker,
   another process only its `ocdbt.process_<i>/` and `array_metadatas/process_<i>`;
3. a barrier of all processes (JAX's coordination service: no request to the store);
   each process's outcome goes through the service's key-value store, so that a part
   that failed ends every process's save with an error naming it (nothing committed);
4. process 0 merges the per-process trees on the store with Orbax's public
   `merge_ocdbt_per_process_files` (it reads each tree's manifest and nodes, writes the
   root's, and checks that every array has its metadata and chunks), records the digests
   from one listing of the step (the store's CRC-32Cs, nothing read back) and writes the
   commit marker, last;
5. a second barrier: every process's save ends once the step is committed.

A process whose local save cannot start (its staging directory cannot be written)
still takes part in both barriers, its failure as its outcome (staging.py): every
process raises it at its next wait. A process that dies before 3. leaves the others
waiting at the barrier until JAX's heartbeat ends them (`lost_host_timeout_s`; Orbax's
save timeout otherwise) and no commit marker: no step a reader takes.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any, Callable

import jax
from etils import epath

from tpu_estimator.checkpoint import client_retries, integrity, listing

_OCDBT_PROCESS = "ocdbt.process_"  # Orbax's per-process OCDBT tree: <item>/ocdbt.process_<i>/
_ARRAY_METADATAS = "array_metadatas"  # Orbax's per-process array metadata: <item>/array_metadatas/process_<i>
_saves = itertools.count()  # this process's staged saves of several processes (barrier names)


def several() -> bool:
    """Whether saves are made by several processes."""
    return jax.process_count() > 1


def checkpointer() -> Any:
    """An Orbax `AsyncCheckpointer` that saves this process's part alone (1. above)."""
    import orbax.checkpoint as ocp  # (imported here: see checkpoint/manager.py)

    me = jax.process_index()
    alone = ocp.options.MultiprocessingOptions(
        primary_host=None, active_processes={me}, barrier_sync_key_prefix=f"tpu_estimator_staged_{me}"
    )
    state = ocp.PyTreeCheckpointHandler(
        multiprocessing_options=alone,
        handler_impl=ocp.BasePyTreeCheckpointHandler(
            multiprocessing_options=alone, enable_post_merge_validation=False
        ),
    )
    # Directories made in the caller's thread: made in the background, they raced with
    # the items' own (an item's directory removed as a leftover).
    in_caller = ocp.AsyncOptions(create_directories_asynchronously=False)
    handler = ocp.CompositeCheckpointHandler(
        composite_options=ocp.CompositeOptions(multiprocessing_options=alone, async_options=in_caller),
        state=state,
        input=ocp.JsonCheckpointHandler(multiprocessing_options=alone),
    )
    return ocp.AsyncCheckpointer(handler, multiprocessing_options=alone, async_options=in_caller)


def save_args(args: Any) -> Any:
    """`args` (an `ocp.args.Composite`) for `checkpointer()`'s handlers: a `StandardSave`
    as the `PyTreeSave` it stands for (the same files)."""
    import orbax.checkpoint as ocp

    return ocp.args.Composite(**{
        name: ocp.args.PyTreeSave(arg.item, save_args=arg.save_args)
        if isinstance(arg, ocp.args.StandardSave) else arg
        for name, arg in args.items()
    })


def part(names: list[str], process: int) -> list[str]:
    """The files of a local step (relative names) that `process` uploads (2. above)."""
    if process != 0:
        tree, metadata = f"{_OCDBT_PROCESS}{process}", f"{_ARRAY_METADATAS}/process_{process}"
        return [n for n in names if n.split("/")[1:2] == [tree] or n.split("/", 1)[1:] == [metadata]]
    items = _items_with_trees(names)
    return [n for n in names if not _local_root_tree(n, items)]


def _items_with_trees(names: list[str]) -> list[str]:
    """The items (`state`) whose arrays are in per-process OCDBT trees."""
    split = [n.split("/") for n in names]
    return sorted({p[0] for p in split if len(p) > 2 and p[1].startswith(_OCDBT_PROCESS)})


def _local_root_tree(name: str, items: list[str]) -> bool:
    """Whether `name` is a file of an item's root tree (`<item>/manifest.ocdbt`, `<item>/d/*`)."""
    parts = name.split("/")
    return parts[0] in items and (parts[1:] == ["manifest.ocdbt"] or parts[1:2] == ["d"])


def finish(local: str, remote: str, *, input_saved: bool, written: Callable[[], None],
           upload: Callable[[str, str, list[str]], None], commit: Callable[[str], None]) -> None:
    """2. to 5. above for this process, once `written()` returns (Orbax has written the
    local copy): `upload(local, remote, names)` sends files, `commit(remote)` writes the
    commit marker. Every process takes part in both barriers, whatever failed, so that
    none waits for another that gave up.

    Raises:
      RuntimeError: another process's part failed (this process's own failure is raised as is).
    """
    me, n = jax.process_index(), next(_saves)
    names: list[str] = []

    def send() -> None:
        written()
        names.extend(listing.list_files(local))
        upload(local, remote, part(names, me))

    own, others = _agree("uploaded", n, remote, send)
    complete = lambda: _complete(remote, _items_with_trees(names), input_saved=input_saved, commit=commit)
    own_commit, others_commit = _agree(
        "committed", n, remote, complete if me == 0 and own is None and not others else None)
    if own is not None or own_commit is not None:
        raise own or own_commit  # type: ignore[misc]
    if others or others_commit:
        raise RuntimeError(f"The save of {remote} by several processes failed, no step committed: "
                           + "; ".join(others + others_commit))


def _complete(remote: str, items: list[str], *, input_saved: bool, commit: Callable[[str], None]) -> None:
    """Process 0, once every part is on the store: 4. above."""
    import orbax.checkpoint as ocp

    for item in items:
        context = client_retries.bounded_context(ocp.type_handlers.get_ts_context(use_ocdbt=True))
        asyncio.run(ocp.type_handlers.merge_ocdbt_per_process_files(
            epath.Path(remote) / item, ts_context=context, use_zarr3=False, enable_validation=True,
        ))
    integrity.write_digests(remote, input_saved=input_saved, listing=listing.list_files(remote))
    commit(remote)


def _agree(phase: str, n: int, remote: str, work: Callable[[], None] | None
           ) -> tuple[Exception | None, list[str]]:
    """Runs `work` (if any), then waits until every process has reached `phase` of save `n`
    (Orbax's barrier over JAX's coordination service, its save timeout: no request to the
    store); returns this process's failure and the other processes' (one line each)."""
    import orbax.checkpoint as ocp

    error: Exception | None = None
    try:
        if work is not None:
            work()
    except Exception as e:  # noqa: BLE001 - returned, raised once every process knows
        error = e
    key = f"tpu_estimator_staged.{remote}.{n}.{phase}"
    me = jax.process_index()
    client = ocp.multihost.get_jax_distributed_client()
    client.key_value_set(f"{key}.{me}", "" if error is None else f"{type(error).__name__}: {error}"[:2000])
    timeout_ms = int(ocp.AsyncOptions().timeout_secs) * 1000
    ocp.multihost.get_barrier_sync_fn()(key=key, timeout_ms=timeout_ms)
    others = [(i, client.blocking_key_value_get(f"{key}.{i}", timeout_ms))
              for i in range(jax.process_count()) if i != me]
    return error, [f"process {i}: {status}" for i, status in others if status]
