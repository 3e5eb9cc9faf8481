"""The files of a checkpoint step with their sizes and CRC-32C, in one listing.

Also whole-file reads and writes that send one request each on an object store
(epath's `read_text` asks whether the path exists and is a directory first).

On an object store (`gs://` through gcsfs) one recursive listing (one request per
1,000 files) gives every object's size and the CRC-32C the store computed from
the bytes it received when the object was written: no file is read. Objects
cannot be changed in place, so a changed or replaced file has another CRC-32C in
the next listing. Elsewhere (local files, stores whose listing has no CRC-32C)
the CRC-32C is computed by reading the file (google-crc32c: several GB/s).
"""

from __future__ import annotations

import base64
import dataclasses
import os
from typing import Any

import google_crc32c

from tpu_estimator.paths import is_local

_CHUNK = 8 << 20


@dataclasses.dataclass(frozen=True)
class Entry:
    """One file: its size, the store's CRC-32C (base64 of the big-endian 4 bytes, as GCS
    writes it; None where the listing has none) and a stamp that changes when it is
    rewritten (mtime/ctime/inode locally, generation on GCS)."""

    size: int
    crc32c: str | None
    stamp: Any


def list_files(root: str) -> dict[str, Entry]:
    """Relative (slash-separated) file names under `root` -> Entry; {} when there is none."""
    if is_local(root):
        return _list_local(_local_path(root))
    import fsspec

    fs, path = fsspec.core.url_to_fs(root)
    path = path.rstrip("/")
    try:
        found = fs.find(path, detail=True)
    except FileNotFoundError:
        return {}
    out = {}
    for full, info in found.items():
        if info.get("type") != "file":
            continue
        name = full[len(path):].lstrip("/") if full.startswith(path) else full
        stamp = (info.get("generation"), info.get("mtime") or info.get("updated"))
        out[name] = Entry(int(info.get("size") or 0), info.get("crc32c"), stamp)
    return out


def crc32c_of(root: str, name: str, entry: Entry) -> str:
    """The CRC-32C of file `name` under `root`: the listing's where it has one, else read."""
    if entry.crc32c is not None:
        return entry.crc32c
    checksum = google_crc32c.Checksum()
    if is_local(root):
        with open(os.path.join(_local_path(root), name), "rb") as f:
            while chunk := f.read(_CHUNK):
                checksum.update(chunk)
    else:
        import fsspec

        with fsspec.open(f"{root.rstrip('/')}/{name}", "rb") as f:
            while chunk := f.read(_CHUNK):
                checksum.update(chunk)
    return base64.b64encode(checksum.digest()).decode()


def read_bytes(root: str, name: str) -> bytes:
    """File `name` under `root` (one request on an object store: no existence checks first)."""
    if is_local(root):
        with open(os.path.join(_local_path(root), name), "rb") as f:
            return f.read()
    import fsspec

    fs, path = fsspec.core.url_to_fs(root)
    return fs.cat_file(f"{path.rstrip('/')}/{name}")


def write_bytes(root: str, name: str, data: bytes) -> None:
    """Writes file `name` under `root` whole (one upload on an object store). Locally the
    file and its directory entry are on disk (fsync) when it returns, so that a rename
    that follows (Orbax's commit of a step) never publishes it unwritten after a crash."""
    if is_local(root):
        path = os.path.join(_local_path(root), name)
        with open(path, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        folder = os.open(os.path.dirname(path), os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
        return
    import fsspec

    fs, path = fsspec.core.url_to_fs(root)
    fs.pipe_file(f"{path.rstrip('/')}/{name}", data)


def _local_path(root: str) -> str:
    return root[len("file://"):] if root.startswith("file://") else root


def _list_local(root: str) -> dict[str, Entry]:
    out = {}
    for folder, _, files in os.walk(root):
        rel = os.path.relpath(folder, root)
        for f in files:
            name = f if rel == "." else f"{rel.replace(os.sep, '/')}/{f}"
            st = os.stat(os.path.join(folder, f))
            out[name] = Entry(st.st_size, None, (st.st_mtime_ns, st.st_ctime_ns, st.st_ino))
    return dict(sorted(out.items()))
