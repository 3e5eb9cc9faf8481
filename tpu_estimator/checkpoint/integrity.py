"""Checkpoint integrity: a digest of every file of a step, recorded at save, checked before use.

Writing: when Orbax has written a step and before it commits it (the rename
of `<step>.orbax-checkpoint-tmp`, or `commit_success.txt` on object stores),
`Checkpointer`'s post-finalization callback calls `commit_digests`, which
writes `<step>/tpu_estimator_digests.json`: the size and CRC-32C of every file
of the step, whether an input position was saved, and a sha256 of the record
itself. A committed step written by this version therefore always has it.
The sizes and CRC-32Cs come from one listing of the step (checkpoint/listing.py):
on an object store the CRC-32C is the one the store computed from the bytes as
they were written, so a save reads nothing back; locally the just-written files
are read from the page cache. (Steps of format 1 recorded sha256s; they are
still checked.)
Orbax rewrites two top-level files after that moment: `_CHECKPOINT_METADATA`
(its commit time; it is recorded as the digest of its JSON without
`commit_timestamp_nsecs`) and `commit_success.txt` (a marker, not recorded).

Checking (`verify`, cached while no file of the step changes): every recorded
file must be there with its size and CRC-32C, else the step is damaged and
each problem is named (missing, empty, truncated, changed). On an object store
that is one listing and two small reads (the digests and `_CHECKPOINT_METADATA`),
whatever the checkpoint's size; locally every file is read once (at several GB/s). A step directory
without the digests file is:

* damaged when it is empty or has no `state`, or when an older step of the
  same directory has digests (this version wrote it: the file was lost, or
  the step was copied in partly);
* otherwise a checkpoint of a version before digests: it is read in full once
  through Orbax (a failure makes it damaged) and used with a warning that its
  values cannot be verified.

Choosing (`newest_intact`, `check_chosen`): a damaged checkpoint raises
`DamagedCheckpointError` naming the step directory, its problems and the
newest intact step; with `fall_back=True` the newest intact step is used
instead, with a warning naming the skipped ones.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import logging
import os
import threading
import time
from typing import Any, Sequence

from etils import epath

from tpu_estimator.api.checks import message
from tpu_estimator.checkpoint.listing import Entry, crc32c_of, list_files, read_bytes, write_bytes
from tpu_estimator.checkpoint.full_read import read_state_in_full
from tpu_estimator.errors import CheckpointStorageError, DamagedCheckpointError
from tpu_estimator.paths import is_local
from tpu_estimator.storage import bounded

log = logging.getLogger("tpu_estimator")

DIGESTS_FILE = "tpu_estimator_digests.json"
FALL_BACK_FIELD = "fall_back_to_intact_checkpoint"  # the RunConfig field (named in messages)
_FORMAT = 2  # 1: sha256 per file (read back); 2: CRC-32C per file (from the listing)
_STEP_METADATA = "_CHECKPOINT_METADATA"  # Orbax updates its commit time after the digests
_COMMIT_MARKER = "commit_success.txt"  # written by Orbax's commit, after the digests
_NOT_RECORDED = frozenset({DIGESTS_FILE, _COMMIT_MARKER})  # top-level files not digested
_CHUNK = 8 << 20
_DAMAGED_SUFFIX = ".damaged"


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What `verify` found in one step directory.

    Attributes:
      path: The step directory.
      problems: One line per problem ("state/d/ab12: truncated (600 of 1242
        bytes)"); empty when intact.
      has_digests: False for a checkpoint of a version before digests.
      input_saved: Whether an input position was saved (None: unknown).
      record: The digests file's own sha256 (`record_sha256`): it names one save of the
        step (a step saved again has another); None without digests.
    """

    path: str
    problems: tuple[str, ...] = ()
    has_digests: bool = True
    input_saved: bool | None = None
    record: str | None = None

    @property
    def intact(self) -> bool:
        return not self.problems


# --- writing -------------------------------------------------------------------------


def commit_digests(directory: str, step: int, *, input_saved: bool) -> None:
    """Writes the digests of step `step` of `directory` before Orbax commits it: into the
    temporary directory where there is one, else into the step directory itself."""
    import orbax.checkpoint as ocp  # (imported here: see checkpoint/manager.py)

    final = epath.Path(directory) / str(step)
    tmp = final.parent / (final.name + ocp.path.atomicity_types.TMP_DIR_SUFFIX)
    if is_local(directory):  # renamed into place by Orbax's commit
        write_digests(tmp if os.path.isdir(str(tmp)) else final, input_saved=input_saved)
        return
    listing = list_files(str(final))  # object stores: a commit_success.txt marker, no rename
    root = final if listing else tmp
    write_digests(root, input_saved=input_saved, listing=listing or None)


def write_digests(step_dir: Any, *, input_saved: bool, listing: dict[str, Entry] | None = None) -> None:
    """Records the size and CRC-32C of every file of `step_dir` (`listing`: its files, if
    already listed) in its digests file."""
    root = epath.Path(step_dir)
    listing = list_files(str(root)) if listing is None else listing
    names = [n for n in listing if n not in _NOT_RECORDED]
    files = dict(zip(names, _parallel(lambda n: _record(root, n, listing[n]), names)))
    record: dict[str, Any] = {"format": _FORMAT, "input_saved": bool(input_saved), "files": files}
    record["record_sha256"] = _sha256_json(record)
    write_bytes(str(root), DIGESTS_FILE, json.dumps(record, indent=1, sort_keys=True).encode())


def _record(root: epath.Path, name: str, entry: Entry) -> dict[str, Any]:
    if name == _STEP_METADATA:
        return {"json_sha256": _settled_step_metadata_digest(root / name)}
    return {"size": entry.size, "crc32c": crc32c_of(str(root), name, entry)}


# --- checking ------------------------------------------------------------------------

_cache: dict[str, tuple[Any, Verdict]] = {}
_cache_lock = threading.Lock()


def forget() -> None:
    """Drops the cached verdicts (the next `verify` of each step checks it again)."""
    with _cache_lock:
        _cache.clear()


def verify(directory: str, step: int, steps: Sequence[int]) -> Verdict:
    """The integrity of step `step` of `directory` (`steps`: all its steps, for the rule
    on steps without digests). Cached while no file of the step changes.

    Raises:
      CheckpointStorageError: the store did not answer for `storage_timeout_s`.
    """
    return bounded(lambda: _verify_step(directory, step, steps), uri=str(directory),
                   what=f"checking checkpoint {step}")


def _verify_step(directory: str, step: int, steps: Sequence[int]) -> Verdict:
    root = epath.Path(directory) / str(step)
    listing = list_files(str(root))  # one request on an object store
    older_with_digests = None
    if DIGESTS_FILE not in listing:  # (only this rule needs the older steps)
        older_with_digests = next(
            (s for s in sorted(steps, reverse=True)
             if s < step and (epath.Path(directory) / str(s) / DIGESTS_FILE).exists()),
            None,
        )
    key = (tuple((n, e.size, e.crc32c, e.stamp) for n, e in listing.items()), older_with_digests)
    with _cache_lock:
        hit = _cache.get(str(root))
    if hit is not None and hit[0] == key:
        return hit[1]
    verdict = _verify(root, listing, older_with_digests)
    with _cache_lock:
        _cache[str(root)] = (key, verdict)
    return verdict


def _verify(root: epath.Path, listing: dict[str, Entry], older_with_digests: int | None) -> Verdict:
    path = str(root)
    if DIGESTS_FILE not in listing:
        return _verify_without_digests(root, listing, older_with_digests)
    try:
        record = json.loads(read_bytes(str(root), DIGESTS_FILE))
        files = record["files"]
        own = record.pop("record_sha256")
        ok = isinstance(files, dict) and own == _sha256_json(record)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        why = "empty" if listing[DIGESTS_FILE].size == 0 else f"truncated or changed ({type(e).__name__})"
        return Verdict(path, (f"{DIGESTS_FILE}: {why}",))
    if not ok:
        return Verdict(path, (f"{DIGESTS_FILE}: changed (its own digest does not match)",))
    names = sorted(files)
    problems = [p for p in _parallel(lambda n: _check(root, n, listing.get(n), files[n]), names) if p]
    return Verdict(path, tuple(problems), input_saved=bool(record.get("input_saved")), record=own)


def _check(root: epath.Path, name: str, entry: Entry | None, want: dict[str, Any]) -> str | None:
    if entry is None:
        return f"{name}: missing"
    size = entry.size
    if "json_sha256" in want:
        if size == 0:
            return f"{name}: empty"
        try:
            digest = _step_metadata_digest(root / name)
        except ValueError:
            return f"{name}: changed or truncated (no longer valid JSON)"
        return None if digest == want["json_sha256"] else f"{name}: changed"
    if size != want["size"]:
        if size == 0:
            return f"{name}: empty (0 of {want['size']} bytes)"
        if size < want["size"]:
            return f"{name}: truncated ({size} of {want['size']} bytes)"
        return f"{name}: changed ({size} bytes, {want['size']} when saved)"
    if "crc32c" in want:
        if crc32c_of(str(root), name, entry) != want["crc32c"]:
            return f"{name}: changed (its CRC-32C differs from the one recorded when it was saved)"
    elif _file_digest(root / name)[1] != want["sha256"]:  # format 1
        return f"{name}: changed (its sha256 differs from the one recorded when it was saved)"
    return None


def _verify_without_digests(root: epath.Path, listing: dict[str, Entry], older_with_digests: int | None) -> Verdict:
    path = str(root)
    names = list(listing)
    if not names:
        return Verdict(path, ("the step directory is empty (an interrupted copy or save?)",), False)
    if not any(n.startswith("state/") for n in names):
        return Verdict(path, ("no `state` item (a partial copy?)",), False)
    if older_with_digests is not None:
        return Verdict(
            path,
            (
                f"{DIGESTS_FILE}: missing, though the older step {older_with_digests} has one (this "
                "step was copied in partly, or the file was deleted)",
            ),
            False,
        )
    try:  # a checkpoint of a version before digests: it must at least read
        _read_all(root)
    except Exception as e:  # noqa: BLE001 - any failure to read means damaged
        first = (str(e).strip().splitlines() or [""])[0][:300]
        return Verdict(path, (f"no {DIGESTS_FILE} and Orbax cannot read it: {type(e).__name__}: {first}",), False)
    log.warning(
        "Checkpoint %s has no %s (saved by a version before digests): it reads, but its values "
        "cannot be verified.", path, DIGESTS_FILE,
    )
    return Verdict(path, (), has_digests=False, input_saved=(root / "input").is_dir() or None)


def _read_all(root: epath.Path) -> None:
    """Reads a step's state and input position in full (what a restore reads), every read
    finished before a failure is raised (full_read.py)."""
    read_state_in_full(str(root))
    item = root / "input"
    if item.is_dir():
        for name in list_files(str(item)):
            if not name.endswith(".txt"):
                json.loads((item / name).read_text())


def last_verdict(directory: str, step: int) -> Verdict | None:
    """The verdict of the last `verify` of step `step` in this process (no I/O; None if
    it was not verified). `newest_intact` and `check_chosen` verify the step they return."""
    with _cache_lock:
        hit = _cache.get(str(epath.Path(directory) / str(step)))
    return None if hit is None else hit[1]


def recorded(directory: str, step: int) -> str | None:
    """The `record_sha256` of step `step`'s digests file as it is now (one small read; None
    without a readable one): read right after a save committed, it names that save.

    Raises:
      CheckpointStorageError: the store did not answer for `storage_timeout_s`.
    """
    def read() -> str | None:
        try:
            record = json.loads(read_bytes(str(epath.Path(directory) / str(step)), DIGESTS_FILE))
        except (OSError, ValueError):
            return None
        own = record.get("record_sha256") if isinstance(record, dict) else None
        return own if isinstance(own, str) else None

    return bounded(read, uri=str(directory), what=f"reading the digests of checkpoint {step}")


# --- choosing ------------------------------------------------------------------------


def newest_intact(
    directory: str, steps: Sequence[int], *, fall_back: bool, configurable: bool = True
) -> int | None:
    """The newest step of `directory` to restore from (None: no checkpoint at all).

    Args:
      directory: A model_dir.
      steps: Its steps (as Orbax lists them).
      fall_back: Use the newest intact step, with a warning, when newer ones are damaged.
      configurable: Whether the error may suggest the RunConfig field (a reader has none).

    Raises:
      DamagedCheckpointError: the newest step is damaged (and `fall_back` is False), or
        no step is intact.
    """
    ordered = sorted(steps, reverse=True)
    if not ordered:
        return None
    skipped: list[Verdict] = []
    for step in ordered:
        verdict = verify(directory, step, ordered)
        if verdict.intact:
            break
        skipped.append(verdict)
        if not fall_back:
            previous = _newest_intact_below(directory, step, ordered)
            raise DamagedCheckpointError(_damaged_message(verdict, directory, previous, configurable))
    else:
        raise DamagedCheckpointError(
            message(
                "Expected an intact checkpoint in model_dir to restore from.",
                f"every checkpoint of {directory} is damaged: {_describe(skipped)}",
                "Restore the step directories from a backup, or delete them to start from scratch.",
            )
        )
    if skipped:
        log.warning(
            "Skipped damaged checkpoint(s) (%s=True): %s. Using %s, the newest intact checkpoint.",
            FALL_BACK_FIELD, _describe(skipped), verdict.path,
        )
    return step


def check_chosen(directory: str, step: int, steps: Sequence[int]) -> Verdict:
    """Verifies a checkpoint that was named explicitly (never replaced by another).

    Raises:
      DamagedCheckpointError: it is damaged (the message names the newest intact step
        before it).
    """
    verdict = verify(directory, step, steps)
    if not verdict.intact:
        previous = _newest_intact_below(directory, step, steps)
        fix = (
            f"Use {previous}, the newest intact checkpoint before it (e.g. checkpoint_path="
            f"{previous!r}), or restore it from a backup."
            if previous
            else "No older checkpoint of that directory is intact: restore it from a backup."
        )
        raise DamagedCheckpointError(
            message(_EXPECTED, f"{verdict.path} is damaged: {_problems(verdict)}", fix)
        )
    return verdict


def move_aside_if_damaged(directory: str, step: int, steps: Sequence[int], *, rename: bool) -> bool:
    """Before saving over an existing step: a damaged one is renamed (by the process with
    `rename`) to `<step>.damaged`, kept for inspection and invisible to Orbax, and True
    returned; an intact one stays (False)."""
    verdict = verify(directory, step, steps)
    if verdict.intact:
        return False
    if not rename:
        return True
    target = epath.Path(directory) / f"{step}{_DAMAGED_SUFFIX}"
    n = 1
    while target.exists():
        n += 1
        target = epath.Path(directory) / f"{step}{_DAMAGED_SUFFIX}-{n}"
    (epath.Path(directory) / str(step)).rename(target)
    log.warning("Moved the damaged checkpoint %s to %s before saving step %d again.", verdict.path, target, step)
    return True


def input_position_error(path: str, error: BaseException, *, fall_back: bool) -> None:
    """An input position that cannot be restored: raises, or (`fall_back`) warns that the
    input starts from its beginning. A store that stayed away is no damage: its
    CheckpointStorageError is raised as it is."""
    if isinstance(error, CheckpointStorageError):
        raise error
    why = f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0][:300]}"
    if fall_back:
        log.warning(
            "The input position saved in %s cannot be restored (%s); %s=True: the input starts "
            "from its beginning.", path, why, FALL_BACK_FIELD,
        )
        return
    raise DamagedCheckpointError(
        message(
            "Expected the input position saved with the checkpoint to restore into input_fn's "
            "iterator.",
            f"{path}/input cannot be restored: {why}",
            "If input_fn now builds another pipeline, train in a new model_dir (or warm start); "
            f"to restart the input from its beginning instead, set RunConfig({FALL_BACK_FIELD}=True).",
        )
    ) from error


_EXPECTED = f"Expected an intact checkpoint (every file as recorded in {DIGESTS_FILE} when it was saved)."


def _damaged_message(verdict: Verdict, directory: str, previous: str | None, configurable: bool) -> str:
    if previous:
        fix = f"Delete {verdict.path} (or move it out of {directory}) to continue from {previous}, the newest intact checkpoint, "
        fix += (
            f"or pass checkpoint_path={previous!r} to evaluate/predict/export_saved_model; or set "
            f"RunConfig({FALL_BACK_FIELD}=True) to use the newest intact checkpoint with a warning."
            if configurable
            else f"or read {previous!r} itself."
        )
    else:
        fix = (
            f"No older checkpoint of {directory} is intact: restore {verdict.path} from a backup, "
            "or delete the damaged step directories to start from scratch."
        )
    return message(_EXPECTED, f"{verdict.path} is damaged: {_problems(verdict)}", fix)


def _newest_intact_below(directory: str, step: int, steps: Sequence[int]) -> str | None:
    for s in sorted(steps, reverse=True):
        if s < step and verify(directory, s, steps).intact:
            return str(epath.Path(directory) / str(s))
    return None


def _problems(verdict: Verdict, shown: int = 10) -> str:
    more = len(verdict.problems) - shown
    return "; ".join(verdict.problems[:shown]) + (f"; and {more} more" if more > 0 else "")


def _describe(verdicts: Sequence[Verdict]) -> str:
    return "; ".join(f"{v.path} ({_problems(v)})" for v in verdicts)


# --- files ---------------------------------------------------------------------------


def _file_digest(path: epath.Path) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            size += len(chunk)
            digest.update(chunk)
    return size, digest.hexdigest()


def _settled_step_metadata_digest(path: epath.Path, wait_secs: float = 10.0) -> str:
    """`_step_metadata_digest` once Orbax's update of the file has landed.

    Orbax's async checkpointer queues that update (the `item_handlers` of the step) on its
    non-blocking metadata store just before it calls our post-finalization callback: the
    file may still be being rewritten (empty) or lack the update. Read until it parses and
    has `item_handlers` (at most `wait_secs`; then whatever parses is recorded)."""
    deadline = time.monotonic() + wait_secs
    while True:
        try:
            meta = json.loads(read_bytes(str(path.parent), path.name))
            if (isinstance(meta, dict) and meta.get("item_handlers")) or time.monotonic() > deadline:
                return _step_metadata_digest(path, meta)
        except ValueError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.02)


def _step_metadata_digest(path: epath.Path, meta: Any = None) -> str:
    """Orbax's step metadata without the commit time it adds after the digests are written."""
    if meta is None:
        meta = json.loads(read_bytes(str(path.parent), path.name))
    if not isinstance(meta, dict):
        raise ValueError("not a JSON object")
    meta.pop("commit_timestamp_nsecs", None)
    return _sha256_json(meta)


def _sha256_json(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


_pool: concurrent.futures.ThreadPoolExecutor | None = None


def _parallel(fn: Any, items: Sequence[Any]) -> list[Any]:
    """`[fn(x) for x in items]` on a few shared threads (hashing releases the GIL)."""
    global _pool
    if len(items) < 4:
        return [fn(x) for x in items]
    with _cache_lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="digests")
    return list(_pool.map(fn, items))
