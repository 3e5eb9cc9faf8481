"""One deadline for an object store that stays away: `storage_timeout_s`.

The writers of a run reach the store through several clients, each with its own
retries: gcsfs (metadata, Orbax's small files, event files, our digests: 6 tries
over ~31-36 s, fixed in its code), TensorStore (Orbax's array data: by default up to
32 tries with backoff up to 32 s, ~15 min). Every place where the caller waits on the
store (a checkpoint save, the wait for a background save, closing the manager, a
summary flush, the writable check; the reads: listing and checking checkpoints,
restores, variable reads, the eval-results log; the writes of an export) waits
through `wait_for`/`bounded`: while it waits longer than a probe interval, it asks the
store for its bucket (one small request) every interval; once the store has not
answered for `timeout_s()` seconds in a row it raises `CheckpointStorageError`
naming the path. A store that answers (a slow but healthy save, transient errors the
clients retry) never trips it. Local paths are not probed.

The clients' own calls are bounded by the same deadline, so that none of them holds
the process long after that error (Orbax waits for some on executor threads that
Python joins at exit): TensorStore's retries come from `client_retries(timeout_s())`
(checkpoint/client_retries.py passes them to Orbax), and gcsfs requests that fail once
the store has answered none for `timeout_s()` raise `StoreAwayError`, which gcsfs does
not retry (`bound_clients`: an aiohttp middleware added through fsspec's config).

The setting, in order: `RunConfig(storage_timeout_s=...)` (the newest estimator
built with one sets it for the process: the clients are per process), the
environment variable `TPU_ESTIMATOR_STORAGE_TIMEOUT_S`, else 120 s (the total
retry deadline of Google's own storage client, `google.cloud.storage.retry`).
"""

from __future__ import annotations

import os
import re
import threading
import time
from typing import Any, Callable

from tpu_estimator.api.checks import message
from tpu_estimator.errors import CheckpointStorageError

__all__ = ["ENV", "DEFAULT_S", "check_timeout", "set_timeout_s", "timeout_s", "probe_interval",
           "client_deadline", "client_retries", "wait_for", "bounded", "bound_clients",
           "StoreAwayError"]

ENV = "TPU_ESTIMATOR_STORAGE_TIMEOUT_S"
DEFAULT_S = 120.0
_MAX_INTERVAL = 5.0
_MIN_UNANSWERED_S = 1.0  # a probe running this long (or an interval, if longer) is unanswered
_chosen: float | None = None
# store root (scheme://bucket) -> [since when it has not answered, when that was last seen]
_away: dict[str, list[float]] = {}
_STORE = re.compile(r"^(?!file://)[A-Za-z][A-Za-z0-9+.-]*://")  # a URI other than file://


def _local(uri: str) -> bool:
    # (paths.is_local's rule; paths sits beside this module, so it is not imported)
    return _STORE.match(str(uri)) is None


def check_timeout(value: Any, *, arg: str = "storage_timeout_s") -> float | None:
    """`value` as seconds (None stays None).

    Raises:
      ValueError: not a number of seconds >= 1.
    """
    if value is None:
        return None
    try:
        seconds = float(value)
        ok = not isinstance(value, bool) and seconds >= 1 and seconds != float("inf")
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(
            message(
                f"`{arg}` must be a number of seconds >= 1 (how long an object store may stay "
                "away before a write fails), or None for the default.",
                f"{arg}={value!r}",
                f"Pass e.g. {arg}=120.",
            )
        )
    return seconds


def set_timeout_s(value: float | None) -> None:
    """Sets the process's deadline (None: back to the environment / the default)."""
    global _chosen
    _chosen = check_timeout(value)


def timeout_s() -> float:
    """The deadline in seconds: the one set, else TPU_ESTIMATOR_STORAGE_TIMEOUT_S, else 120."""
    if _chosen is not None:
        return _chosen
    env = os.environ.get(ENV)
    return check_timeout(env, arg=ENV) if env else DEFAULT_S


def probe_interval(timeout: float) -> float:
    """Seconds between probes (and before the first): a tenth of the deadline, 0.2-5 s."""
    return min(max(timeout / 10, 0.2), _MAX_INTERVAL)


def client_deadline(timeout: float) -> float:
    """How long the clients themselves keep retrying a store that answers nothing: the
    deadline plus two probe intervals and 1 s, so that the waits (which raise within
    about two intervals of it) name the deadline first, and the clients stop soon after."""
    return timeout + 2 * probe_interval(timeout) + 1.0


def client_retries(timeout: float) -> dict[str, Any]:
    """TensorStore's `gcs_request_retries` for a deadline of `timeout` seconds.

    Backoff from min(1 s, timeout/20) doubling up to timeout/4, and as many retries as
    their delays take to add up to `client_deadline(timeout)`: a store that stays away
    ends the client's own requests about then (instead of after TensorStore's default
    32 retries, ~15 min), so nothing waits on them long after our error.
    E.g. 120 s: 9 retries (1, 2, 4, 8, 16, 30, 30, 30, 30 s); 3 s: 8 (0.15 ... 0.75 s).
    """
    initial = min(1.0, timeout / 20)
    longest = max(initial, timeout / 4)
    budget = client_deadline(timeout)
    retries, total = 0, 0.0
    while total < budget:
        total += min(initial * 2**retries, longest)
        retries += 1
    return {"max_retries": retries, "initial_delay": f"{initial:g}s", "max_delay": f"{longest:g}s"}


def _root(uri: str) -> str:
    scheme, _, rest = str(uri).partition("://")
    return f"{scheme}://{rest.split('/')[0]}"


class _Probe:
    """Asks the store for `uri`'s bucket on a daemon thread, one request at a time."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.root = _root(uri)
        self.started: float | None = None  # when the running probe was sent
        self.answered: bool | None = None  # the last finished probe's outcome
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._client: tuple[Any, str] | None = None  # (filesystem, bucket)
        try:  # made here, in the waiting thread: making the client (its imports, credentials:
            # seconds on a loaded machine) is not time the store stayed silent
            self._client = self._make_client()
        except Exception:  # noqa: BLE001 - tried again, and reported, by the probe
            pass

    def _make_client(self) -> tuple[Any, str]:
        import fsspec

        fs, path = fsspec.core.url_to_fs(self.uri)
        return fs, path.split("/")[0]

    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        self.started = time.monotonic()
        self._thread = threading.Thread(target=self._ask, name=f"store-probe:{self.uri}", daemon=True)
        self._thread.start()

    def _ask(self) -> None:
        try:
            if self._client is None:
                self._client = self._make_client()
            fs, bucket = self._client
            fs.invalidate_cache(bucket)  # asked of the store, never answered from a cache
            fs.info(bucket)  # one small request
            self.answered, self.error = True, None
        except FileNotFoundError:
            self.answered, self.error = True, None  # the store answered
        except Exception as e:  # noqa: BLE001 - any failure is "no answer"
            self.answered, self.error = False, e


class StoreAwayError(RuntimeError):
    """A request failed after the store answered none for `storage_timeout_s` (raised
    inside gcsfs, which retries OSErrors and aiohttp's errors but not this)."""


class _ClientDeadline:
    """An aiohttp client middleware for gcsfs: a request that fails (no answer, or 429/5xx)
    once the store has answered none for `client_deadline(timeout_s())` in a row raises
    StoreAwayError, which gcsfs does not retry.

    gcsfs retries each call 6 times over ~31-36 s (fixed in its code); Orbax waits for
    some of these calls (existence checks, metadata writes) on asyncio executor workers,
    which Python joins at exit. This ends them at their next try once the deadline has
    passed. Every try is still sent: a store that is back answers it (and resets this).
    """

    def __init__(self) -> None:
        self.failing_since: float | None = None  # when the first unanswered request was sent

    async def __call__(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        sent = time.monotonic()
        try:
            response = await handler(request)
        except Exception as e:
            self._unanswered(sent, request)
            raise
        if response.status == 429 or response.status >= 500:
            response.release()
            self._unanswered(sent, request)
        else:
            self.failing_since = None
        return response

    def _unanswered(self, sent: float, request: Any) -> None:
        if self.failing_since is None or sent < self.failing_since:
            self.failing_since = sent
        timeout = timeout_s()
        if time.monotonic() - self.failing_since >= client_deadline(timeout):
            raise StoreAwayError(
                message(
                    f"The object store did not answer for {timeout:g} s (storage_timeout_s).",
                    f"path={str(request.url)!r}",
                    "Check that the store is reachable, then run again (training resumes from "
                    "the newest checkpoint). To wait longer for a store that comes back, raise "
                    f"RunConfig(storage_timeout_s=...) or {ENV}.",
                )
            )


_client_deadline: _ClientDeadline | None = None


def bound_clients() -> None:
    """Adds `_ClientDeadline` to the gcsfs instances fsspec creates from now on (through
    `fsspec.config.conf`: epath's too, which it makes at its first gs:// path), once."""
    global _client_deadline
    if _client_deadline is not None:
        return
    import fsspec.config

    _client_deadline = _ClientDeadline()
    conf = fsspec.config.conf.setdefault("gs", {})
    session = dict(conf.get("session_kwargs") or {})
    session["middlewares"] = (*session.get("middlewares", ()), _client_deadline)
    conf["session_kwargs"] = session


def wait_for(done: threading.Event, *, uri: str, what: str,
             alive: Callable[[], bool] | None = None) -> None:
    """Blocks until `done` is set (or `alive()` turns False), probing `uri`'s store meanwhile.

    Raises:
      CheckpointStorageError: the store did not answer for `timeout_s()` seconds in a row.
    """
    if _local(uri):
        while not done.wait(0.1):
            if alive is not None and not alive():
                return
        return
    bound_clients()
    timeout = timeout_s()
    interval = probe_interval(timeout)
    probe = _Probe(uri)
    # Shared by the waits of this process: a store found away by an earlier wait (that
    # recently) is probed at once, and the deadline counts from when it stopped answering.
    seen = _away.get(probe.root)
    if seen is not None and time.monotonic() - seen[1] > timeout:
        _away.pop(probe.root, None)  # stale: not seen away for a whole deadline
    known_away = probe.root in _away
    unanswered = False  # a probe of this wait failed or went unanswered for an interval

    def away(since: float, now: float) -> None:
        _away.setdefault(probe.root, [since, now])[1] = now

    while not done.wait(0 if known_away and probe.started is None else interval):
        if alive is not None and not alive():
            return
        now = time.monotonic()
        if probe.running():
            # unanswered for an interval (at least 1 s: a loaded machine's answer may take
            # longer than a short deadline's tenth): away since sent
            if now - probe.started >= max(interval, _MIN_UNANSWERED_S):
                away(probe.started, now)
                unanswered = True
        else:
            if probe.started is not None:
                if probe.answered:
                    _away.pop(probe.root, None)
                    unanswered = False
                else:
                    away(probe.started, now)
                    unanswered = True
            probe.start()
        since = _away.get(probe.root, [None])[0]
        if unanswered and since is not None and now - since >= timeout:
            cause = f"; last error: {type(probe.error).__name__}: {probe.error}" if probe.error else ""
            raise CheckpointStorageError(
                message(
                    f"The object store did not answer for {timeout:g} s (storage_timeout_s) while "
                    f"{what}.",
                    f"path={uri!r}{cause}",
                    "Check that the store is reachable and the bucket exists, then run again "
                    "(training resumes from the newest checkpoint). To wait longer for a store "
                    f"that comes back, raise RunConfig(storage_timeout_s=...) or {ENV}.",
                )
            )


def bounded(fn: Callable[[], Any], *, uri: str, what: str) -> Any:
    """`fn()`, run on a daemon thread when `uri` is on an object store, and waited for with
    `wait_for`: its result, or its exception re-raised.

    Raises:
      CheckpointStorageError: the store did not answer for `timeout_s()` seconds in a row
        (`fn` is left running on its thread).
    """
    if _local(uri):
        return fn()
    bound_clients()
    done = threading.Event()
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            out["error"] = e
        finally:
            done.set()

    threading.Thread(target=run, name=f"store-write:{uri}", daemon=True).start()
    wait_for(done, uri=uri, what=what)
    if "error" in out:
        raise out["error"]
    return out.get("value")
