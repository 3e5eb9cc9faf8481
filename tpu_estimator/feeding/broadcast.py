"""Host 0's input sent to the other hosts (BROADCAST, SLICED input modes).

Each opened input gets one TCP connection from host 0 to every other host.
Host 0 listens on a free port and tells the others where, with a key, by one
`multihost_utils.broadcast_one_to_all` that every host runs on its main thread
when it opens the input (the same point of the program on every host). After
that the batches go host to host, not through device collectives, so the
feeder threads cannot interleave with the training programs' collectives.
Nothing is stored on the way: a batch is gone once every host has read it
(host 0 keeps a batch only until its sender thread has written it to the
socket; the hosts' steps are in lockstep, so that is a few loops' batches at
most; the queue of each connection is bounded, `QUEUE_BYTES`). Batches go as raw
array buffers behind a typed JSON header (feeding/wire.py), never pickled, and
not encrypted: hosts on a trusted network, as for JAX's own coordination
service; a key checks both ends of a connection.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import collections
import secrets
import socket
import struct
import threading
import time
import weakref
from typing import Any, Iterable, Iterator

from tpu_estimator.api.contracts import ArrayTree

import jax
import numpy as np

from tpu_estimator.api.checks import message
from tpu_estimator.feeding import wire
from tpu_estimator.feeding.host_batches import split_element

CONNECT_TIMEOUT_S = 300.0  # how long host 0 waits for every host to connect
_TRY_TIMEOUT_S = 5.0  # one connection attempt to one of host 0's addresses
_INFO_BYTES = 4096  # the broadcast record: host 0's addresses, port and key
_HEADER = struct.Struct("!cQ")  # kind, payload length
_DATA, _END = b"D", b"E"
QUEUE_BYTES = 1 << 30  # per connection: host 0 waits while more than this is unsent (at least one frame queued)
QUEUE_WAIT_S = 300.0  # ... and fails if a host reads nothing for this long


def broadcast_batches(iterator: Iterable[ArrayTree], *, num_hosts: int) -> Iterator[ArrayTree]:
    """On host 0: yields `iterator`'s elements and sends each to the other hosts.

    Connects now (every host must open the input at the same point): the
    others call `received_batches()` at the same time.
    """
    server = listen()
    try:
        key = secrets.token_bytes(32)
        share_info({"addresses": own_addresses(), "port": server.getsockname()[1], "key": key.hex()})
        conns = accept_hosts(server, key, num_hosts - 1)
    finally:
        server.close()
    return sending(iterator, conns)


def received_batches() -> Iterator[ArrayTree]:
    """On the other hosts: the elements host 0 sends with `broadcast_batches` (connects now)."""
    info = share_info(None)
    conn = connect_to_host0(info["addresses"], int(info["port"]), bytes.fromhex(info["key"]), me=jax.process_index())
    return receiving(conn)


def sending(iterator: Iterable[ArrayTree], conns: list[socket.socket]) -> Iterator[ArrayTree]:
    """Yields `iterator`'s elements, each sent (raw buffers behind a typed header, by a thread per connection) to `conns`.

    The end of `iterator` is sent as such; closing the generator early closes the connections.
    """
    senders = [Sender(conn) for conn in conns]
    batches = _sending(iter(iterator), senders)
    # A generator never started runs no `finally`: close the connections when it is dropped.
    weakref.finalize(batches, _finish, senders)
    return batches


def _sending(iterator: Iterator[ArrayTree], senders: list["Sender"]) -> Iterator[ArrayTree]:
    ended = False
    try:
        for element in iterator:
            payload = wire.encode(split_element(element))
            for sender in senders:
                sender.send(_DATA, payload)
            yield element
        ended = True
    finally:  # ended, closed early (the consumer stopped) or failed
        _finish(senders, ended=ended)


def _finish(senders: list["Sender"], *, ended: bool = False) -> None:
    for sender in senders:
        sender.finish(ended)


def receiving(conn: socket.socket) -> Iterator[ArrayTree]:
    """The elements `sending` sends down `conn`, until its end (closes `conn`)."""
    try:
        while True:
            kind, data = _read_frame(conn)
            if kind == _END:
                return
            yield wire.decode(data)
    finally:
        conn.close()


class Sender:
    """Writes frames to one host's connection on a daemon thread (host 0 does not wait on a
    slow host until `QUEUE_BYTES` are queued for it; then at most `QUEUE_WAIT_S`)."""

    def __init__(self, conn: socket.socket, *, limit: int = QUEUE_BYTES, wait_s: float = QUEUE_WAIT_S) -> None:
        self._conn, self._limit, self._wait_s = conn, limit, wait_s
        self._frames: collections.deque = collections.deque()
        self._queued = 0  # bytes in _frames
        self._closing = self._gone = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, daemon=True, name="tpu_estimator-broadcast")
        self._thread.start()

    def send(self, kind: bytes, payload: bytes | bytearray) -> None:
        """Queues one frame; waits while the queue is over its bound (raises after `wait_s`)."""
        size = len(payload)
        with self._cond:
            ok = self._cond.wait_for(
                lambda: self._gone or not self._frames or self._queued + size <= self._limit, self._wait_s)
            if self._gone:  # the host closed its end: it needs no more input
                return
            if not ok:
                raise RuntimeError(
                    message(
                        f"A host read none of host 0's broadcast input (BROADCAST/SLICED) for "
                        f"{self._wait_s:g} s.",
                        f"{self._queued} bytes in {len(self._frames)} batches queued for it",
                        "See that host's log: it hangs or is far behind; restart the job.",
                    )
                )
            self._frames.append((kind, payload))
            self._queued += size
            self._cond.notify_all()

    def finish(self, ended: bool) -> None:
        """Sends the end marker (input ended) or just closes (stopped early) after the queued frames."""
        with self._cond:
            if ended:
                self._frames.append((_END, b""))
            self._closing = True
            self._cond.notify_all()

    def _next(self) -> tuple[bytes, bytes | bytearray] | None:
        with self._cond:
            self._cond.wait_for(lambda: self._frames or self._closing)
            return self._frames[0] if self._frames else None

    def _sent(self, payload: bytes | bytearray) -> None:
        with self._cond:
            self._frames.popleft()
            self._queued -= len(payload)
            self._cond.notify_all()

    def _run(self) -> None:
        try:
            while (item := self._next()) is not None:
                kind, payload = item
                self._conn.sendall(_HEADER.pack(kind, len(payload)))
                self._conn.sendall(payload)
                self._sent(payload)
        except OSError:  # the host closed its end: it needs no more input
            pass
        finally:
            with self._cond:
                self._gone = True
                self._frames.clear()
                self._queued = 0
                self._cond.notify_all()
            self._conn.close()


# --- connecting ------------------------------------------------------------------


def share_info(info: dict[str, Any] | None) -> dict[str, Any]:
    """Host 0's `info` (a small JSON dict; None on the other hosts) on every host (a collective: every host calls it at the same point)."""
    record = np.zeros(_INFO_BYTES, np.uint8)
    if info is not None:
        while True:
            raw = json.dumps(info).encode()
            if len(raw) <= _INFO_BYTES or len(info["addresses"]) <= 1:
                break
            info = {**info, "addresses": info["addresses"][:-1]}
        record[: len(raw)] = np.frombuffer(raw[:_INFO_BYTES], np.uint8)
    from jax.experimental import multihost_utils

    shared = np.asarray(multihost_utils.broadcast_one_to_all(record))
    return json.loads(shared.tobytes().rstrip(b"\0"))


def listen() -> socket.socket:
    """Host 0's server socket: every interface, a free port."""
    if socket.has_dualstack_ipv6():
        return socket.create_server(("", 0), family=socket.AF_INET6, dualstack_ipv6=True)
    return socket.create_server(("", 0))


def own_addresses() -> list[str]:
    """Names and addresses the other hosts may reach this host by (best first)."""
    names = [socket.getfqdn(), socket.gethostname()]
    found: list[str] = []
    for name in names:
        try:
            found += [str(info[4][0]) for info in socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)]
        except OSError:
            pass
    ordered = [a for a in found if not a.startswith("127.") and a != "::1"] + names + found
    return list(dict.fromkeys(ordered + ["127.0.0.1"]))


def _proof(key: bytes, who: bytes) -> bytes:
    return hmac.new(key, who, hashlib.sha256).digest()


def accept_hosts(
    server: socket.socket, key: bytes, expected: int, *, timeout_s: float = CONNECT_TIMEOUT_S
) -> list[socket.socket]:
    """Host 0: one checked connection per other host, in host order (strangers are dropped)."""
    conns: dict[int, socket.socket] = {}
    deadline = time.monotonic() + timeout_s
    while len(conns) < expected:
        server.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            conn, _ = server.accept()
        except TimeoutError:
            for c in conns.values():
                c.close()
            raise RuntimeError(
                message(
                    f"Host 0 expected every other host to connect for its broadcast input "
                    f"within {timeout_s:g} s.",
                    f"{len(conns)} of {expected} connected (hosts {sorted(conns)})",
                    "Check that the hosts can reach host 0 over TCP (any port), "
                    "and the other hosts' logs.",
                )
            ) from None
        try:
            conn.settimeout(_TRY_TIMEOUT_S)
            host = struct.unpack("!I", _read_exact(conn, 4))[0]
            if not hmac.compare_digest(_read_exact(conn, 32), _proof(key, b"host%d" % host)):
                raise ConnectionError("wrong key")
            conn.sendall(_proof(key, b"host0"))
            conn.settimeout(None)
        except (OSError, ConnectionError, struct.error):
            conn.close()
            continue
        conns[host] = conn
    return [conns[h] for h in sorted(conns)]


def connect_to_host0(
    addresses: list[str], port: int, key: bytes, *, me: int, timeout_s: float = 60.0
) -> socket.socket:
    """Host `me`: a checked connection to host 0, trying its addresses in turn."""
    deadline = time.monotonic() + timeout_s
    errors: dict[str, str] = {}
    while time.monotonic() < deadline:
        for address in addresses:
            try:
                conn = socket.create_connection((address, port), timeout=min(_TRY_TIMEOUT_S, timeout_s))
            except OSError as e:
                errors[address] = str(e)
                continue
            try:
                conn.sendall(struct.pack("!I", me) + _proof(key, b"host%d" % me))
                if hmac.compare_digest(_read_exact(conn, 32), _proof(key, b"host0")):
                    conn.settimeout(None)
                    return conn
                errors[address] = "not host 0"
            except (OSError, ConnectionError) as e:
                errors[address] = str(e) or type(e).__name__
            conn.close()
        time.sleep(min(1.0, timeout_s / 4))
    raise RuntimeError(
        message(
            f"Host {me} could not connect to host 0 for its broadcast input (BROADCAST/SLICED).",
            f"port {port}: " + "; ".join(f"{a}: {e}" for a, e in errors.items()),
            "Make host 0 reachable over TCP from the other hosts (any port), or use "
            "PER_HOST_V1/PER_HOST_V2 input.",
        )
    )


def _read_into(conn: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        read = conn.recv_into(view[got:])
        if not read:
            raise ConnectionError("connection closed")
        got += read
    return buf


def _read_exact(conn: socket.socket, n: int) -> bytes:
    return bytes(_read_into(conn, n))


def _read_frame(conn: socket.socket) -> tuple[bytes, bytearray]:
    try:
        kind, size = _HEADER.unpack(_read_exact(conn, _HEADER.size))
        return kind, _read_into(conn, size)
    except ConnectionError:
        raise RuntimeError(
            message(
                "Host 0's broadcast input (BROADCAST/SLICED) stopped before its end.",
                "the connection to host 0 closed",
                "See host 0's log: it failed, or stopped reading its input_fn early.",
            )
        ) from None
