"""The lost-host watcher's protocol in one process: watchers joined by socket pairs stand for
the processes (tests/multihost/test_lost_host.py kills real ones). A process that closes its
connection without saying bye is named lost on every other process; one that says bye is
not; one that stays silent is lost after the timeout."""

from __future__ import annotations

import socket

import jax
import pytest

import tpu_estimator as te
from tpu_estimator.estimator import liveness


def three(timeout_s: float = 30.0):
    """Watchers of processes 0 and 1, and process 2's raw end of its connection to process 0."""
    a0, a1 = socket.socketpair()  # process 0 <-> process 1
    b0, b2 = socket.socketpair()  # process 0 <-> process 2
    host0 = liveness.Liveness({1: a0, 2: b0}, timeout_s, me=0, count=3)
    host1 = liveness.Liveness({0: a1}, timeout_s, me=1, count=3)
    return host0, host1, b2


def test_a_killed_process_is_named_on_every_other():
    host0, host1, end2 = three()
    try:
        end2.close()  # what the kernel does when process 2 is killed
        assert host0.lost.wait(10) and host1.lost.wait(10)
        assert host0.who == host1.who == 2
        with pytest.raises(te.HostLostError, match=r"Process 2 of 3 stopped \(killed or crashed.*\); process 1 "
                           r"cannot go on.*lost_host_timeout_s=30 s.*Restart every process"):
            liveness.raise_if_lost(jax.errors.JaxRuntimeError("Gloo all-reduce failed"), watcher=host1)
        liveness.raise_if_lost(KeyError("not ours"), watcher=None)  # no watcher on one process: nothing
    finally:
        host0.close()
        host1.close()


def test_a_process_that_ends_normally_is_not_lost():
    host0, host1, end2 = three()
    try:
        end2.sendall(b"B")
        end2.close()
        host1.close()
        assert not host0.lost.wait(1.5)
    finally:
        host0.close()


def test_a_silent_process_is_lost_after_the_timeout():
    host0, host1, end2 = three(timeout_s=1.0)  # process 2 neither closes nor beats
    try:
        assert host0.lost.wait(10) and host0.who == 2 and "silent for 1 s" in str(host0.error())
        assert host1.lost.wait(10) and host1.who == 2
    finally:
        host0.close()
        host1.close()
        end2.close()
