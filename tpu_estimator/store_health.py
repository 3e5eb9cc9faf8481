"""What this process has seen of each object store: its last answer and its failures since.

Every observation is timed when it is seen, never when its request was sent: a request
that was merely slow (a loaded machine, a busy event loop) is no evidence that the store
was away before it failed. Fed by the waits' probes (`Probe`) and by the clients' own
requests (storage.py's gcsfs middleware); read by the waits (`away_since`) and by that
middleware (`failing_since`).

A store is named by its URI scheme ("gs" for gs:// and gcs://): the clients of one
scheme reach one service, and a bucket that is not there still answers (404).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Callable

__all__ = ["CLIENT_GAP", "store_of", "answered", "failed", "last_answer", "last_failure",
           "failing_since", "away_since", "NoAnswer", "Probe"]

CLIENT_GAP = 18.0  # s: longer than any wait's gap (storage._gap: at most 16 s)
_lock = threading.Lock()
# store -> [last answer, start of the failures' run for the clients (CLIENT_GAP), start
#           of their run for the waits (their gap), last failure]; failures since the answer
_seen: dict[str, list[float | None]] = {}
_loop: asyncio.AbstractEventLoop | None = None
_clients: dict[tuple[str, float, float], Any] = {}  # (bucket, timeout, gap) -> probe filesystem


def store_of(uri: str) -> str:
    """The store `uri` is on: its scheme ("gs" for gs:// and gcs://)."""
    scheme = str(uri).partition("://")[0].lower()
    return "gs" if scheme == "gcs" else scheme


def _record(store: str) -> list[float | None]:
    return _seen.setdefault(store, [None, None, None, None])


def answered(store: str) -> None:
    """The store answered (any answer but 429/5xx, a 404 included): failures so far end."""
    with _lock:
        _record(store)[:] = [time.monotonic(), None, None, None]


def failed(store: str, *, gap: float) -> None:
    """A request to the store failed (no answer, or 429/5xx), seen now. A failure more than
    `gap` seconds after the previous one starts a new run of failures (`away_since`); more
    than CLIENT_GAP seconds after it, a new one for `failing_since` too."""
    now = time.monotonic()
    with _lock:
        seen = _record(store)
        if seen[3] is None or now - seen[3] > CLIENT_GAP:
            seen[1] = now
        if seen[3] is None or now - seen[3] > gap:
            seen[2] = now
        seen[3] = now


def last_answer(store: str) -> float | None:
    """When the store last answered (time.monotonic()), None if never seen."""
    with _lock:
        return _seen.get(store, [None])[0]


def last_failure(store: str) -> float | None:
    """When the store's last failure since its last answer was seen; None if none."""
    with _lock:
        return _seen.get(store, [None] * 4)[3]


def failing_since(store: str) -> float | None:
    """When the store's current run of failures began, counting failures up to CLIENT_GAP
    seconds apart (a client's retries of one request: gcsfs waits up to 16 s and 1 s of
    jitter between them), none answered since; None if there is none, or if its last
    failure is older than CLIENT_GAP."""
    with _lock:
        seen = _seen.get(store)
        if seen is None or seen[1] is None or time.monotonic() - seen[3] > CLIENT_GAP:
            return None
        return seen[1]


def away_since(store: str, *, gap: float) -> float | None:
    """When the store's current run of failures began: failures seen at most `gap` apart
    (failures as `failed` recorded them, each with the same gap), none answered since; None
    if there is none, or if its last failure is older than `gap` (not seen away lately)."""
    with _lock:
        seen = _seen.get(store)
        if seen is None or seen[2] is None or time.monotonic() - seen[3] > gap:
            return None
        return seen[2]


class NoAnswer(RuntimeError):
    """A probe's request got no answer (raised inside gcsfs, which does not retry it)."""


class _ProbeMiddleware:
    """The probe client's aiohttp middleware: one try per request, bounded by `timeout`
    seconds; records the store's answer or failure, and ends a failed request at once
    (NoAnswer) instead of gcsfs's retries."""

    def __init__(self, store: str, timeout: float, gap: float) -> None:
        self.store, self.timeout, self.gap = store, timeout, gap

    async def __call__(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        try:
            response = await asyncio.wait_for(handler(request), self.timeout)
        except Exception as e:  # dropped, refused, timed out (not cancelled: BaseException)
            failed(self.store, gap=self.gap)
            raise NoAnswer(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__) from e
        if response.status == 429 or response.status >= 500:
            response.release()
            failed(self.store, gap=self.gap)
            raise NoAnswer(f"HTTP {response.status}")
        answered(self.store)
        return response


def _probe_loop() -> asyncio.AbstractEventLoop:
    """The probes' own event loop (on a daemon thread): a probe waits on no other client's
    requests (fsspec's shared loop carries the uploads)."""
    global _loop
    with _lock:
        if _loop is None:
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="store-probe-loop", daemon=True).start()
        return _loop


def _client(uri: str, timeout: float, gap: float) -> tuple[Any, str]:
    """(filesystem, bucket) for probing `uri`'s store; gcsfs: its own instance on the
    probes' loop, one try per request, each bounded by `timeout` seconds."""
    import fsspec

    root = str(uri).split("://", 1)[-1].split("/")[0]
    store = store_of(uri)
    if store != "gs":
        fs, path = fsspec.core.url_to_fs(uri)  # fsspec's shared instance, its own retries
        return fs, path.split("/")[0]
    key = (root, timeout, gap)
    with _lock:
        fs = _clients.get(key)
    if fs is None:
        fs, _ = fsspec.core.url_to_fs(
            uri, skip_instance_cache=True, loop=_probe_loop(),
            session_kwargs={"middlewares": (_ProbeMiddleware(store, timeout, gap),)})
        with _lock:
            fs = _clients.setdefault(key, fs)
    return fs, root


class Probe:
    """Asks `uri`'s store for its bucket on a daemon thread, one request at a time.

    Each probe is one try (gcsfs: no retries) bounded by `timeout` seconds, its outcome
    recorded when seen (`answered`/`failed`); a probe still running `timeout` seconds after
    it was sent (a client without that bound, inside its own retries) is recorded as a
    failure at each `check` from then on.
    """

    def __init__(self, uri: str, *, timeout: float, gap: float) -> None:
        self.uri, self.store, self.timeout, self.gap = uri, store_of(uri), timeout, gap
        self.started: float | None = None  # when the running (or last) probe was sent
        self.error: BaseException | None = None  # the last failed probe's error
        self._thread: threading.Thread | None = None
        self._client: tuple[Any, str] | None = None
        try:  # made here, in the waiting thread: making the client (its imports, credentials:
            # seconds on a loaded machine) is not time the store stayed silent
            self._client = _client(uri, timeout, gap)
        except Exception:  # noqa: BLE001 - tried again, and reported, by the probe
            pass

    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        self.started = time.monotonic()
        self._thread = threading.Thread(target=self._ask, name=f"store-probe:{self.uri}", daemon=True)
        self._thread.start()

    def check(self, now: float) -> None:
        """Records a probe still unanswered `timeout` seconds after it was sent as a failure."""
        if self.running() and now - self.started >= self.timeout:
            failed(self.store, gap=self.gap)

    def _ask(self) -> None:
        started = self.started
        try:
            if self._client is None:
                self._client = _client(self.uri, self.timeout, self.gap)
            fs, bucket = self._client
            fs.invalidate_cache(bucket)  # asked of the store, never answered from a cache
            fs.info(bucket)  # one small request
            self.error = None
            if self.store != "gs":  # (gcsfs: recorded by the middleware)
                answered(self.store)
        except FileNotFoundError:
            self.error = None
            answered(self.store)  # the store answered
        except Exception as e:  # noqa: BLE001 - any other failure is "no answer"
            self.error = e
            seen = last_answer(self.store)
            if not isinstance(e, NoAnswer) and (seen is None or seen < started):
                failed(self.store, gap=self.gap)  # (not after an answer to this probe: a 403)
