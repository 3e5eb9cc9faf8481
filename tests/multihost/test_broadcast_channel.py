"""The BROADCAST/SLICED channel in one process: host 0's connections, sending and
receiving, and its errors (a host that cannot connect, one that never does, an input
stopped before its end)."""

from __future__ import annotations

import secrets
import threading

import numpy as np
import pytest

from tpu_estimator.feeding import broadcast


def connected(key: bytes, hosts: int = 1):
    """(host 0's connections, each other host's connection), over 127.0.0.1."""
    server = broadcast.listen()
    port = server.getsockname()[1]
    addresses = ["no-such-host.invalid", *broadcast.own_addresses()]  # an unreachable one is skipped
    theirs: dict[int, object] = {}

    def connect(me: int) -> None:
        theirs[me] = broadcast.connect_to_host0(addresses, port, key, me=me, timeout_s=20)

    threads = [threading.Thread(target=connect, args=(i,)) for i in range(1, hosts + 1)]
    for t in threads:
        t.start()
    try:
        ours = broadcast.accept_hosts(server, key, hosts, timeout_s=20)
    finally:
        server.close()
    for t in threads:
        t.join()
    return ours, [theirs[i] for i in range(1, hosts + 1)]


def test_every_host_receives_host_zeros_elements_in_order():
    key = secrets.token_bytes(32)
    ours, theirs = connected(key, hosts=2)
    elements = [({"x": np.full((2, 3), i, np.float32)}, np.arange(2) + i) for i in range(50)]
    received: dict[int, list] = {}

    def receive(i: int) -> None:
        received[i] = list(broadcast.receiving(theirs[i]))

    threads = [threading.Thread(target=receive, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    sent = list(broadcast.sending(iter(elements), ours))  # host 0 yields them too
    for t in threads:
        t.join(timeout=20)
    assert len(sent) == 50
    for i in range(2):
        assert len(received[i]) == 50
        for (features, labels), (want_f, want_l) in zip(received[i], elements):
            np.testing.assert_array_equal(features["x"], want_f["x"])
            np.testing.assert_array_equal(labels, want_l)


def test_input_stopped_before_its_end_is_an_error_on_the_other_hosts():
    ours, (theirs,) = connected(secrets.token_bytes(32))
    batches = broadcast.sending(iter([np.zeros(2), np.ones(2), np.ones(2)]), ours)
    next(batches)
    batches.close()  # host 0 stops reading its input early (or fails)
    received = broadcast.receiving(theirs)
    np.testing.assert_array_equal(next(received)[0], np.zeros(2))
    with pytest.raises(RuntimeError, match=r"broadcast input \(BROADCAST/SLICED\) stopped before its end.*"
                       r"Received: the connection to host 0 closed.*See host 0's log"):
        next(received)


def test_a_host_with_the_wrong_key_cannot_connect_and_host_zero_times_out():
    server = broadcast.listen()
    port = server.getsockname()[1]
    errors: list[BaseException] = []

    def connect() -> None:
        try:
            broadcast.connect_to_host0(["127.0.0.1"], port, b"wrong" * 7, me=1, timeout_s=2)
        except RuntimeError as e:
            errors.append(e)

    thread = threading.Thread(target=connect)
    thread.start()
    with pytest.raises(RuntimeError, match=r"Host 0 expected every other host to connect for its broadcast "
                       r"input within 2 s.*Received: 0 of 1 connected.*reach host 0 over TCP"):
        broadcast.accept_hosts(server, secrets.token_bytes(32), 1, timeout_s=2)
    server.close()
    thread.join(timeout=20)
    assert len(errors) == 1
    assert errors[0].args[0].startswith("Host 1 could not connect to host 0 for its broadcast input")
    assert f"Received: port {port}: 127.0.0.1:" in errors[0].args[0]
    assert "or use PER_HOST_V1/PER_HOST_V2 input" in errors[0].args[0]


def test_elements_go_as_typed_raw_buffers_never_pickled():
    import ml_dtypes

    from tpu_estimator.feeding import wire

    features = {
        "f32": np.arange(6, dtype=np.float32).reshape(2, 3),
        "bf16": np.array([[1.5, -2.0]], ml_dtypes.bfloat16),
        "ids": np.array([[1, 2]], np.int64)[:, ::-1],  # not contiguous
        "words": np.array([b"ab", b"cde"]),
        "text": np.array(["x", "yz"]),
        "flag": np.array(True),
        "empty": np.zeros((0, 4), np.int8),
    }
    payload = wire.encode((features, None))
    assert b"pickle" not in payload and payload[4:5] == b"{"  # a JSON header
    got, labels = wire.decode(payload)
    assert labels is None and list(got) == list(features)
    for k, want in features.items():
        assert got[k].dtype == want.dtype and got[k].shape == want.shape, k
        np.testing.assert_array_equal(got[k], want, err_msg=k)
    got, labels = wire.decode(wire.encode((np.ones(3), np.arange(3))))
    np.testing.assert_array_equal(got, np.ones(3))
    np.testing.assert_array_equal(labels, np.arange(3))
    refilled = np.zeros(4, np.float32)
    payload = wire.encode((refilled, None))
    refilled[:] = 7  # an input_fn that refills its arrays in place: the frame keeps what was sent
    np.testing.assert_array_equal(wire.decode(payload)[0], np.zeros(4))
    with pytest.raises(TypeError, match=r"raw buffers, never pickled.*Received: features\['names'\] of "
                       r"dtype object.*dtype=bytes"):
        wire.encode(({"names": np.array(["a", None], object)}, None))
    bad = wire.encode((np.ones(2), None))
    with pytest.raises(ValueError, match="header describes"):
        wire.decode(bad + b"\0")


def test_the_senders_queue_is_bounded_and_a_host_that_never_reads_is_an_error():
    ours, (theirs,) = connected(secrets.token_bytes(32))
    sender = broadcast.Sender(ours[0], limit=1 << 20, wait_s=1.0)  # host 1 never reads
    frame = bytes(256 << 10)
    with pytest.raises(RuntimeError, match=r"A host read none of host 0's broadcast input.*for 1 s.*"
                       r"Received: \d+ bytes in \d+ batches queued for it"):
        for _ in range(64):  # 16 MiB: past the socket's buffers and the 1 MiB bound
            sender.send(b"D", frame)
    theirs.close()
    ours[0].close()
