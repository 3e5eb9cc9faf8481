"""A counting HTTP proxy on loopback between the GCS clients and the emulator.

`StoreProxy(upstream)` forwards every request to `upstream` (fake-gcs-server) and
counts it by kind (`list`, `get` (object metadata), `download`, `upload`,
`delete`, `copy`, `bucket`, `other`); `fail_every=n` answers every n-th request
with a 503 instead of forwarding it (the clients' retries must get through);
`gone = True` closes every connection without an answer from then on (a store that
went away: the clients see the connection dropped); `delay_s` holds each request that
long before it is answered (a slow but healthy store; a request held when `gone` is set
is then dropped). `go_away(when, how)` does either
("503" or "gone") from the first request for which `when(kind, method, unquoted
path?query)` is true (`went_at`: time.monotonic() then), e.g. at a restore's first
data read; a one-request upload's path?query ends with `&name=` and the object's name.
Point the clients at `proxy.url` (STORAGE_EMULATOR_HOST, TENSORSTORE_GCS_HTTP_URL)
before they start: a subprocess's environment is the simple way.
"""

from __future__ import annotations

import collections
import http.client
import http.server
import re
import threading
import time
import urllib.parse
from typing import Callable

_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


def kind(method: str, target: str) -> str:
    """The kind of a GCS JSON API request (`GET /storage/v1/b/B/o?prefix=...` -> 'list')."""
    parts = urllib.parse.urlsplit(target)
    path, query = parts.path, urllib.parse.parse_qs(parts.query)
    if path.startswith("/upload/"):
        return "upload"
    if path.startswith("/download/") or query.get("alt") == ["media"]:
        return "download"
    if method == "DELETE":
        return "delete"
    if "/copyTo/" in path or "/rewriteTo/" in path or path.endswith("/compose"):
        return "copy"
    if path.rstrip("/").endswith("/o"):
        return "list" if method == "GET" else "upload"
    if "/o/" in path:
        return "get" if method == "GET" else "other"
    if "/b" in path:
        return "bucket"
    # XML API (TensorStore may use it): /BUCKET/OBJECT
    if method == "PUT":
        return "upload"
    return "download" if method == "GET" else "other"


class StoreProxy:
    """Forwards to `upstream`, counting requests by kind; `fail_every` injects 503s."""

    def __init__(self, upstream: str, *, fail_every: int = 0) -> None:
        self.upstream = urllib.parse.urlsplit(upstream)
        self.fail_every = fail_every
        self.gone = False
        self.held = False
        self.delay_s = 0.0
        self.arrived = 0  # every request that reached the proxy: forwarded, 503'd or dropped
        self.counts: collections.Counter[str] = collections.Counter()
        self.failed = 0
        self.log: list[tuple[str, str, str]] = []  # (kind, method, path?query) of each forwarded request
        self.went_at: float | None = None
        self._when: Callable[[str, str, str], bool] | None = None
        self._how = "503"
        self._n = 0
        self._lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = bytearray()
                    while True:
                        size = int(self.rfile.readline().split(b";")[0], 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return bytes(out)
                        out += self.rfile.read(size)
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _forward(self) -> None:
                body = self._body()
                path = self.path
                if "uploadType=multipart" in path:  # the object's name is in the body
                    named = re.search(rb'"name":\s*"([^"]+)"', body)
                    path += f"&name={named.group(1).decode()}" if named else ""
                with proxy._lock:
                    proxy.arrived += 1
                    when = proxy._when
                    if when is not None and when(kind(self.command, self.path), self.command,
                                                 urllib.parse.unquote(path)):
                        proxy._when, proxy.went_at = None, time.monotonic()
                        if proxy._how == "gone":
                            proxy.gone = True
                        elif proxy._how == "hold":
                            proxy.held = True
                        else:
                            proxy._n, proxy.fail_every = 0, 1
                if proxy.delay_s and not proxy.gone:
                    time.sleep(proxy.delay_s)
                if proxy.held:  # never answered, never forwarded (the client waits)
                    threading.Event().wait()
                if proxy.gone:
                    self.close_connection = True
                    self.connection.close()
                    return
                with proxy._lock:
                    proxy._n += 1
                    fail = proxy.fail_every and proxy._n % proxy.fail_every == 0
                    if fail:
                        proxy.failed += 1
                    else:
                        k = kind(self.command, self.path)
                        proxy.counts[k] += 1
                        proxy.log.append((k, self.command, path))
                if fail:
                    payload = b'{"error": {"code": 503, "message": "injected by StoreProxy"}}'
                    self.send_response(503)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                headers["Host"] = proxy.upstream.netloc
                if body or self.command in ("POST", "PUT", "PATCH"):
                    headers["Content-Length"] = str(len(body))
                conn = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=120)
                try:
                    conn.request(self.command, self.path, body=body, headers=headers)
                    response = conn.getresponse()
                    data = response.read()
                finally:
                    conn.close()
                self.send_response(response.status, response.reason)
                for k, v in response.getheaders():
                    if k.lower() in _HOP or k.lower() == "content-length":
                        continue
                    if k.lower() == "location":
                        v = v.replace(f"{proxy.upstream.scheme}://{proxy.upstream.netloc}", proxy.url)
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            def handle_one_request(self) -> None:
                try:
                    super().handle_one_request()
                except ConnectionError:  # the client went away (e.g. it timed out)
                    self.close_connection = True

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _forward

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="store-proxy", daemon=True)
        self._thread.start()

    def go_away(self, when: Callable[[str, str, str], bool], how: str) -> None:
        """From the first request matching `when` on: 503 to everything (`how="503"`), every
        connection dropped (`how="gone"`) or every request held unanswered (`how="hold"`:
        for a process to be killed mid-request)."""
        if how not in ("503", "gone", "hold"):
            raise ValueError(f"how must be '503', 'gone' or 'hold'; received how={how!r}")
        with self._lock:
            self._when, self._how, self.went_at = when, how, None

    def back(self) -> None:
        """The store answers again (and no trigger stays armed)."""
        with self._lock:
            self._when, self.fail_every, self.gone = None, 0, False

    def snapshot(self) -> collections.Counter[str]:
        with self._lock:
            return collections.Counter(self.counts)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
