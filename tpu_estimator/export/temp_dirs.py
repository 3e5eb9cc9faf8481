"""The hidden temporary directories of local exports: named for their writer, and those
whose writer is gone removed by the next export into the same base.

A local export is written under `<base>/.temp-<unix s>-<host>-<pid>-<random>` and renamed
when complete; an export interrupted (SIGKILL, a machine lost) leaves it behind. Readers
never take it for an export (it has no timestamp name), and the next export in that base
removes it when its writer is known to be gone: same host and its process no longer runs,
or older than `STALE_S` (another host's, or one named before writers were recorded).
"""

from __future__ import annotations

import logging
import os
import re
import socket
import time
import uuid

from etils import epath

from tpu_estimator.paths import join, process_running

log = logging.getLogger("tpu_estimator")

PREFIX = ".temp-"
STALE_S = 24 * 3600.0  # an export that may still be running on another host: kept this long
_NAME = re.compile(r"^\.temp-(\d+)-(?:(.+)-(\d+)-)?[0-9a-f]+$")


def host_tag() -> str:
    """This host's name as it appears in a temporary directory's name."""
    return re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname())[:64] or "host"


def new_temp(base: str) -> str:
    """A fresh temporary directory name under local `base` (not created)."""
    return join(base, f"{PREFIX}{int(time.time())}-{host_tag()}-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def abandoned(name: str, *, now: float | None = None) -> bool:
    """True if the temporary directory `name` (a basename) belongs to a writer that is gone."""
    match = _NAME.match(name)
    if match is None:
        return False
    started, host, pid = int(match[1]), match[2], match[3]
    if host == host_tag() and pid is not None and int(pid) != os.getpid():
        return not process_running(int(pid))
    return (time.time() if now is None else now) - started > STALE_S


def remove_abandoned(base: str) -> list[str]:
    """Removes the abandoned temporary directories of local `base`; returns their paths."""
    removed = []
    root = epath.Path(base)
    if not root.is_dir():
        return removed
    for child in root.iterdir():
        if child.name.startswith(PREFIX) and abandoned(child.name):
            try:
                child.rmtree()
                removed.append(str(child))
            except OSError as e:  # best effort: another export may be removing it too
                log.debug("Could not remove the abandoned export %s: %s", child, e)
    if removed:
        log.info("Removed %d interrupted export(s) in %s: %s", len(removed), base, removed)
    return removed
