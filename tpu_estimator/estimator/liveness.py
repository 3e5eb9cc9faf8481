"""A lost host, named: every process learns at once which process of the job stopped.

JAX's coordination service notices a silent process only after its heartbeat
timeout (`ClusterConfig.lost_host_timeout_s`) and then terminates every
survivor from C++ (SIGABRT, exit 134): nothing public lets Python catch that.
So that the survivors still say what happened, the processes keep one TCP
connection each to process 0 (its address and a key shared by one
`broadcast_one_to_all` when the first train/evaluate/predict starts). A
process killed outright closes its connections at once (the kernel does): process
0 sees it and tells the others; if process 0 is the one lost, the others see
their connection close. A process that falls silent (machine lost) is lost after
the same timeout as JAX's. Heartbeat bytes go every `timeout/5` seconds on a
daemon thread, never on the training path; a process ending normally says so
first (at exit), so it is not taken for lost. Where the processes cannot
reach process 0 over TCP, a warning, and the job runs without the watcher.

On the verdict each survivor logs `HostLostError`'s message (naming the
process) at once; an error that then reaches train/evaluate/predict (a
collective that failed) is raised as `HostLostError` (`raise_if_lost`).
"""

from __future__ import annotations

import atexit
import logging
import secrets
import selectors
import socket
import struct
import threading
import time
from typing import Any

import jax

from tpu_estimator.errors import HostLostError
from tpu_estimator.feeding import broadcast

log = logging.getLogger("tpu_estimator")

_BEAT, _BYE, _LOST, _READY = b"H", b"B", b"L", b"R"  # _LOST + u32 process: process 0's verdict
CONNECT_S = 60.0  # how long the processes try to reach process 0 for the watcher
_started: "Liveness | None" = None
_tried = False
_lock = threading.Lock()


def watch_hosts(timeout_s: float) -> "Liveness | None":
    """Starts watching the other processes once per process (every process calls it at the
    same point: the first train/evaluate/predict); None on one process."""
    global _started, _tried
    if jax.process_count() == 1:
        return None
    with _lock:
        if not _tried:
            _tried = True
            _started = Liveness.connect(timeout_s)
        return _started


def raise_if_lost(error: BaseException, *, wait_s: float = 5.0, watcher: "Liveness | None" = None) -> None:
    """Raises `HostLostError` from `error` when a process of the job is known lost (waiting up
    to `wait_s` for the verdict when `error` is the kind a failed collective raises).
    `watcher`: this process's (`watch_hosts`) unless given."""
    watcher = watcher or _started
    if watcher is None or isinstance(error, HostLostError):
        return
    # a failed collective (XLA), a broken link, or the broadcast input cut off (a plain
    # RuntimeError); never our own errors (NaN loss, preemption, storage)
    waits = isinstance(error, (jax.errors.JaxRuntimeError, ConnectionError)) or type(error) is RuntimeError
    if watcher.lost.wait(wait_s if waits else 0.0):
        raise watcher.error() from error


class Liveness:
    """The connections of this process to the others, watched on a daemon thread."""

    def __init__(self, conns: dict[int, socket.socket], timeout_s: float, *, me: int, count: int) -> None:
        self.me, self.count, self.timeout_s = me, count, timeout_s
        self.lost = threading.Event()
        self.who: int | None = None
        self.how = ""
        self._conns = conns
        self._seen = {p: time.monotonic() for p in conns}
        self._buffers = {p: b"" for p in conns}
        self._done: set[int] = set()
        self._stop = threading.Event()
        self._send_lock = threading.Lock()
        for conn in conns.values():
            conn.setblocking(False)
        self._thread = threading.Thread(target=self._run, daemon=True, name="tpu_estimator-liveness")
        self._thread.start()
        atexit.register(self.close)

    @classmethod
    def connect(cls, timeout_s: float) -> "Liveness | None":
        """Connects every process to process 0 (a collective: all call it at the same point).

        None, with a warning, where the processes cannot reach process 0 over TCP within
        `CONNECT_S`: the job runs on without named losses (JAX's deadline still holds).
        Process 0 sends a ready byte once every process is connected, so that no process
        watches a link that process 0 then drops."""
        me, count = jax.process_index(), jax.process_count()
        try:
            if me == 0:
                server = broadcast.listen()
                try:
                    key = secrets.token_bytes(32)
                    broadcast.share_info(
                        {"addresses": broadcast.own_addresses(), "port": server.getsockname()[1], "key": key.hex()})
                    conns = broadcast.accept_hosts(server, key, count - 1, timeout_s=CONNECT_S)
                finally:
                    server.close()
                for conn in conns:
                    conn.sendall(_READY)
                return cls(dict(zip(range(1, count), conns)), timeout_s, me=me, count=count)
            info = broadcast.share_info(None)
            conn = broadcast.connect_to_host0(
                info["addresses"], int(info["port"]), bytes.fromhex(info["key"]), me=me, timeout_s=CONNECT_S)
            conn.settimeout(CONNECT_S + 5)
            if conn.recv(1) != _READY:
                conn.close()
                raise ConnectionError("process 0 did not get every process's connection")
            return cls({0: conn}, timeout_s, me=me, count=count)
        except (RuntimeError, OSError) as e:
            log.warning("No lost-host watcher (a lost process will not be named; JAX still ends the job "
                        "after lost_host_timeout_s=%g s): %s", timeout_s, e)
            return None

    def error(self) -> HostLostError:
        """The error that names the lost process."""
        return HostLostError(
            f"Process {self.who} of {self.count} stopped ({self.how}); process {self.me} cannot go on. "
            f"JAX ends every process of the job within lost_host_timeout_s={self.timeout_s:g} s of the "
            "loss. Restart every process: training resumes from the newest checkpoint (commits "
            "are atomic: no step is half there)."
        )

    def close(self) -> None:
        """This process ends normally: tells the others (not a loss) and stops watching."""
        if self._stop.is_set():
            return
        self._stop.set()
        for conn in self._conns.values():
            try:
                conn.setblocking(True)
                conn.settimeout(1.0)
                conn.sendall(_BYE)
                conn.shutdown(socket.SHUT_WR)
                conn.setblocking(False)
                while conn.recv(4096):  # unread bytes at close would reset the stream, bye and all
                    pass
            except OSError:
                pass
            conn.close()

    # --- the watching thread -----------------------------------------------------

    def _verdict(self, who: int, how: str) -> None:
        if self.lost.is_set():
            return
        self.who, self.how = who, how
        self.lost.set()
        log.error("%s", self.error())
        if self.me == 0:
            for p in self._conns:
                if p != who and p not in self._done:
                    self._send(p, _LOST + struct.pack("!I", who))

    def _send(self, p: int, data: bytes) -> None:
        try:
            with self._send_lock:
                self._conns[p].send(data)
        except OSError:
            # Its buffer is full (not reading: the timeout tells) or its end closed: reading
            # tells (its bye, if it sent one, is read before the end of the stream).
            pass

    def _gone(self, p: int, how: str) -> None:
        if p in self._done:
            return
        self._done.add(p)
        self._verdict(p, how)

    def _run(self) -> None:
        interval = max(0.2, self.timeout_s / 5)
        selector = selectors.DefaultSelector()
        next_beat = 0.0
        try:
            for p, conn in self._conns.items():
                selector.register(conn, selectors.EVENT_READ, p)
            while not self._stop.is_set():
                now = time.monotonic()
                if now >= next_beat:
                    for p in self._conns:
                        if p not in self._done:
                            self._send(p, _BEAT)
                    next_beat = now + interval
                for key, _ in selector.select(timeout=min(interval, 0.5)):
                    self._read(key.data, key.fileobj)
                now = time.monotonic()
                for p, seen in self._seen.items():
                    if p not in self._done and now - seen > self.timeout_s:
                        self._gone(p, f"silent for {self.timeout_s:g} s: its machine or network is gone")
        except (OSError, ValueError):  # closed under us at exit
            pass
        finally:
            selector.close()

    def _read(self, p: int, conn: Any) -> None:
        try:
            data = conn.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            if p not in self._done:
                self._gone(p, "killed or crashed: its connection closed")
            return
        self._seen[p] = time.monotonic()
        buf = self._buffers[p] + data
        while buf:
            if buf[:1] == _LOST:
                if len(buf) < 5:
                    break
                (who,) = struct.unpack("!I", buf[1:5])
                buf = buf[5:]
                self._verdict(who, "killed or crashed: process 0 saw its connection close")
                continue
            if buf[:1] == _BYE:
                self._done.add(p)
            buf = buf[1:]
        self._buffers[p] = buf
