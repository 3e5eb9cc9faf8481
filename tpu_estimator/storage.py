"""One deadline for an object store that stays away: `storage_timeout_s`.

The writers of a run reach the store through several clients, each with its own
retries: gcsfs (metadata, Orbax's small files, event files, our digests: 6 tries
over ~31-36 s, fixed in its code), TensorStore (Orbax's array data: by default up to
32 tries with backoff up to 32 s, ~15 min). Every place where the caller waits on the
store (a checkpoint save, the wait for a background save, closing the manager, a
summary flush, the writable check; the reads: listing and checking checkpoints,
restores, variable reads, the eval-results log; the writes of an export) waits
through `wait_for`/`bounded`: while it waits longer than a probe interval, it asks the
store for its bucket every interval (store_health.Probe: one request, one try, given
`probe_timeout` to answer, on the probes' own event loop); once the store has answered
nothing for `timeout_s()` seconds it raises `CheckpointStorageError` naming the path.

The deadline counts from evidence that the store is away, never from a request that was
merely slow: from the first failure (a dropped or refused connection, a 429/5xx, a probe
unanswered after `probe_timeout`) seen since the store's last answer, timed when it is
seen, in a run of failures no more than `_gap` apart, with one seen by this wait. Any
answer to any gcsfs request or probe (the uploads' included) ends it. So the error comes
no sooner than `timeout_s()` after the store went away (sooner only by what a failure
seen just before it counts: a false one, e.g. a healthy store's probe unanswered for
`probe_timeout` on an overloaded machine, less than an interval before the fault), and
at most about `timeout_s()` plus two intervals after its first failure is seen: at once
for dropped connections and 5xx, a `probe_timeout` after the fault for a store that
holds requests unanswered. A store that answers (slowly, within `probe_timeout`, or with
transient errors the clients retry), or is away for less than the deadline, never trips
it. Local paths are not probed.

The clients' own calls are bounded by the same deadline, so that none of them holds
the process long after that error (Orbax waits for some on executor threads that
Python joins at exit): TensorStore's retries come from `client_retries(timeout_s())`
(checkpoint/client_retries.py passes them to Orbax), and gcsfs requests that fail once
the store has answered none for `client_deadline(timeout_s())` (counted the same way)
raise `StoreAwayError`, which gcsfs does not retry (`bound_clients`: an aiohttp
middleware added through fsspec's config; it also records every answer and failure).

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

from tpu_estimator import store_health
from tpu_estimator.api.checks import message
from tpu_estimator.errors import CheckpointStorageError

__all__ = ["ENV", "DEFAULT_S", "check_timeout", "set_timeout_s", "timeout_s", "probe_interval",
           "probe_timeout", "client_deadline", "client_retries", "wait_for", "bounded",
           "bound_clients", "StoreAwayError"]

ENV = "TPU_ESTIMATOR_STORAGE_TIMEOUT_S"
DEFAULT_S = 120.0
_MAX_INTERVAL = 5.0
_MIN_PROBE_TIMEOUT = 3.0  # s: healthy probes took <= 0.6 s here at load ~17; a false timeout would count
_chosen: float | None = None
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


def probe_timeout(timeout: float) -> float:
    """How long one probe waits for its answer: two probe intervals, at least 3 s."""
    return max(2 * probe_interval(timeout), _MIN_PROBE_TIMEOUT)


def _gap(timeout: float) -> float:
    """The longest a wait goes between two failures of a store that stays away (a probe
    interval and a probe's timeout), and 1 s of slack: failures further apart than this
    are separate outages (store_health.away_since)."""
    return probe_interval(timeout) + probe_timeout(timeout) + 1.0


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


class StoreAwayError(RuntimeError):
    """A request failed after the store answered none for `storage_timeout_s` (raised
    inside gcsfs, which retries OSErrors and aiohttp's errors but not this)."""


class _ClientDeadline:
    """An aiohttp client middleware for gcsfs: records each answer or failure (429/5xx, no
    answer) of the store (store_health), and a request that fails once the store has
    answered none for `client_deadline(timeout_s())` raises StoreAwayError, which gcsfs
    does not retry.

    gcsfs retries each call 6 times over ~31-36 s (fixed in its code); Orbax waits for
    some of these calls (existence checks, metadata writes) on asyncio executor workers,
    which Python joins at exit. This ends them at their next try once the deadline has
    passed. Every try is still sent: a store that is back answers it (and resets this).
    The deadline counts from the first failure seen since the last answer (of any client
    or probe), not from when that request was sent.
    """

    async def __call__(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        try:
            response = await handler(request)
        except Exception:
            self._unanswered(request)
            raise
        if response.status == 429 or response.status >= 500:
            response.release()
            self._unanswered(request)
        else:
            store_health.answered("gs")
        return response

    def _unanswered(self, request: Any) -> None:
        timeout = timeout_s()
        store_health.failed("gs", gap=_gap(timeout))
        since = store_health.failing_since("gs")
        if since is not None and time.monotonic() - since >= client_deadline(timeout):
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
    gap = _gap(timeout)
    probe = store_health.Probe(uri, timeout=probe_timeout(timeout), gap=gap)
    # A store seen away lately (by an earlier wait, or a client) is probed at once.
    pause = 0 if store_health.away_since(probe.store, gap=gap) is not None else interval
    first_sent: float | None = None
    while not done.wait(pause):
        pause = interval
        if alive is not None and not alive():
            return
        now = time.monotonic()
        probe.check(now)
        if not probe.running():
            probe.start()
            first_sent = first_sent or probe.started
        since = store_health.away_since(probe.store, gap=gap)
        last = store_health.last_failure(probe.store)
        # away for the deadline, and seen failing by this wait (not only before it)
        if since is not None and now - since >= timeout and last is not None and last >= first_sent:
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
