"""The feeder's blocks for on-device inference loops (feeding/lockstep.py): runs of full
batches stacked and placed as one, what is left (fewer, padded, cut by `steps`) one by one,
in input order."""

from __future__ import annotations

import numpy as np
import pytest

from tpu_estimator.feeding.host_batches import HostBatch
from tpu_estimator.feeding.lockstep import Block, Blocking, lockstep_feed


def batches(n: int, *, last_real: int = 4) -> list[HostBatch]:
    """`n` batches of 4 rows, numbered by their first feature; the last has `last_real` real rows."""
    real = lambda i: last_real if i == n - 1 else 4
    return [HostBatch(np.full((4, 2), i, np.float32), np.full(4, i), real(i), 4) for i in range(n)]


def kinds(items: list) -> list:
    """Each item as ('block', [batch numbers]) or ('step', batch number, counts)."""
    out = []
    for item in items:
        if isinstance(item, Block):
            assert np.asarray(item.device[0]).shape[0] == len(item.hosts)  # stacked on a new axis
            out.append(("block", [int(h.features[0, 0]) for h in item.hosts]))
        else:
            host, device, counts = item
            assert device == ("placed", int(host.features[0, 0]))
            out.append(("step", int(host.features[0, 0]), counts.tolist()))
    return out


def feed(items: list[HostBatch], **kwargs) -> list:
    stack = lambda hosts: (np.stack([h.features for h in hosts]),)
    place = lambda b: ("placed", int(b.features[0, 0]))
    with lockstep_feed(items[0], iter(items[1:]), place, blocking=Blocking(3, stack), **kwargs) as f:
        return kinds(list(f))


def test_full_runs_are_blocks_the_rest_one_by_one():
    assert feed(batches(8)) == [("block", [0, 1, 2]), ("block", [3, 4, 5]), ("step", 6, [4]), ("step", 7, [4])]


def test_a_padded_batch_is_never_in_a_block():
    assert feed(batches(6, last_real=1)) == [
        ("block", [0, 1, 2]), ("step", 3, [4]), ("step", 4, [4]), ("step", 5, [1]),
    ]


@pytest.mark.parametrize("steps, expected", [
    (4, [("block", [0, 1, 2]), ("step", 3, [4])]),
    (3, [("block", [0, 1, 2])]),
    (2, [("step", 0, [4]), ("step", 1, [4])]),
])
def test_steps_cut_the_input_before_blocking(steps, expected):
    assert feed(batches(9), steps=steps) == expected


def test_without_blocking_every_batch_is_a_step():
    items = batches(4)
    with lockstep_feed(items[0], iter(items[1:]), lambda b: ("placed", int(b.features[0, 0]))) as f:
        assert [k[0] for k in kinds(list(f))] == ["step"] * 4
