"""One TensorBoard event file, written directly: scalars need no tensorboardX.

An event file is TFRecord framing (length, masked CRC-32C, data, masked CRC-32C)
around `Event` protocol buffers. The few fields a scalar needs (Event.wall_time,
step, file_version, summary; Summary.Value.tag and simple_value) are encoded here
by hand, so a process that writes only scalars (train()'s loss and steps/sec,
evaluate()'s metrics) never imports tensorboardX, which imports
google-cloud-storage, grpc and cryptography when they are installed (the `gcs`
extra brings them): ~26 MB of a process's memory (benchmarks/RESULTS.md, "One
process"). Histograms and images are still encoded by tensorboardX's summary
functions (imported then) and written here as events of the same file.
"""

from __future__ import annotations

import functools
import logging
import pathlib
import re
import socket
import struct
import time
from typing import Any

import google_crc32c

log = logging.getLogger("tpu_estimator")

_INVALID_TAG = re.compile(r"[^-/\w\.]")  # as tensorboardX cleans a tag


def clean_tag(tag: str) -> str:
    """`tag` with characters TensorBoard does not take replaced by '_', leading '/' dropped."""
    cleaned = _INVALID_TAG.sub("_", tag).lstrip("/")
    if cleaned != tag:
        log.info("Summary name %s is illegal; using %s instead.", tag, cleaned)
    return cleaned


def _masked_crc(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # int64 as protobuf encodes it (negative: ten bytes)
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _length_delimited(field: int, payload: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def scalar_summary(tag: str, value: float) -> bytes:
    """A serialised `Summary` holding one `Value(tag, simple_value)`."""
    entry = _length_delimited(1, clean_tag(tag).encode()) + struct.pack("<Bf", 2 << 3 | 5, value)
    return _length_delimited(1, entry)


def event(step: int, *, summary: bytes | None = None, file_version: str | None = None,
          wall_time: float | None = None) -> bytes:
    """A serialised `Event` at `step` (now, unless `wall_time`)."""
    out = struct.pack("<Bd", 1 << 3 | 1, time.time() if wall_time is None else wall_time)
    out += _varint(2 << 3) + _varint(step)
    if file_version is not None:
        out += _length_delimited(3, file_version.encode())
    if summary is not None:
        out += _length_delimited(5, summary)
    return out


@functools.cache
def tensorflow_bins() -> list[float]:
    """TensorFlow's histogram bucket limits: +-1e-12 growing by 1.1 up to 1e20, and 0 (what
    tensorboardX's SummaryWriter.add_histogram uses by default)."""
    limits, v = [], 1e-12
    while v < 1e20:
        limits.append(v)
        v *= 1.1
    return [-x for x in reversed(limits)] + [0] + limits


class EventFile:
    """An event file in local directory `logdir`, named as tensorboardX names them (with
    `suffix`); each event reaches the file when written (flushed)."""

    def __init__(self, logdir: str, suffix: str = "") -> None:
        pathlib.Path(logdir).mkdir(parents=True, exist_ok=True)  # (local: the logdir or a staging folder)
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}{suffix}"
        self.path = f"{logdir.rstrip('/')}/{name}"
        self._file = open(self.path, "wb")
        self._write(event(0, file_version="brain.Event:2"))

    def _write(self, data: bytes) -> None:
        header = struct.pack("<Q", len(data))
        self._file.write(header + struct.pack("<I", _masked_crc(header)) + data
                         + struct.pack("<I", _masked_crc(data)))
        self._file.flush()

    def add_scalar(self, tag: str, value: float, global_step: int) -> None:
        self._write(event(global_step, summary=scalar_summary(tag, float(value))))

    def add_histogram(self, tag: str, values: Any, global_step: int) -> None:
        from tensorboardX import summary

        histogram = summary.histogram(tag, values, tensorflow_bins())
        self._write(event(global_step, summary=histogram.SerializeToString()))

    def add_image(self, tag: str, image: Any, global_step: int, dataformats: str = "HWC") -> None:
        from tensorboardX import summary  # (PNG encoded, as SummaryWriter.add_image)

        self._write(event(global_step, summary=summary.image(tag, image, dataformats=dataformats).SerializeToString()))

    def close(self) -> None:
        self._file.close()
