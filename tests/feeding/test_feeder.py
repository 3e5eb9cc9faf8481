"""The one feeder (feeding/feeder.py) with a plan that tags what it places: per-loop chunks
for every mode. Inference: runs of full batches stacked, what is left (fewer, padded, cut by
`steps`) as a list run batch by batch; train: every "scan" chunk stacked; "step" lists growing
1, 2, 4 ... and bounded in bytes; `loops` cuts at each loop's last chunk; one process's
agreement (feeding/lockstep.py) passes chunks through with their counts."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tpu_estimator.feeding import feeder
from tpu_estimator.feeding.host_batches import HostBatch
from tpu_estimator.feeding.lockstep import in_lockstep


def batches(n: int, *, last_real: int = 4) -> list[HostBatch]:
    """`n` batches of 4 rows, numbered by their first feature; the last has `last_real` real rows."""
    real = lambda i: last_real if i == n - 1 else 4
    return [HostBatch(np.full((4, 2), i, np.float32), np.full(4, i), real(i), 4) for i in range(n)]


class Tagging:
    """A plan of loops of `size`, chunks of `k`; places a group as ('stacked'|'list', [numbers])."""

    def __init__(self, size, k, *, scan=True, full_only=True, loops=None):
        self.size, self.k, self.scan, self.full_only = size, k, scan, full_only
        self.loops = itertools.count() if loops is None else iter(range(loops))

    def next_loop(self):
        return None if next(self.loops, None) is None else (self.size, self.scan, self.scan)

    def chunk_len(self, size, per_batch):
        return self.k

    def place(self, group, stacked):
        return ("stacked" if stacked else "list", [int(b.features[0, 0]) for b in group])

    def extra(self, group):
        return len(group)


def fed(items, plan) -> list:
    return [(c.data, c.end_of_loop) for c in feeder.chunks(iter(items), plan)]


def test_full_runs_are_stacked_the_rest_a_list():
    assert fed(batches(8), Tagging(6, 3)) == [
        (("stacked", [0, 1, 2]), False), (("stacked", [3, 4, 5]), True), (("list", [6, 7]), True),
    ]


def test_a_padded_batch_is_never_stacked_for_inference():
    assert fed(batches(6, last_real=1), Tagging(6, 3)) == [
        (("stacked", [0, 1, 2]), False), (("list", [3, 4, 5]), True),
    ]


def test_train_stacks_every_scan_chunk_and_stops_with_its_schedule():
    assert fed(batches(8), Tagging(3, 3, full_only=False, loops=2)) == [
        (("stacked", [0, 1, 2]), True), (("stacked", [3, 4, 5]), True),
    ]
    assert fed(batches(4), Tagging(3, 3, full_only=False)) == [
        (("stacked", [0, 1, 2]), True), (("stacked", [3]), True),
    ]


def test_step_lists_grow_to_step_chunk_and_stay_within_the_byte_bound(monkeypatch):
    monkeypatch.setattr(feeder, "STEP_CHUNK", 4)
    sizes = [len(c.data[1]) for c in feeder.chunks(iter(batches(20)), Tagging(8, 1, scan=False))]
    assert sizes == [1, 2, 4, 1, 4, 4, 4]  # loop 1: 1+2+4+1; loops 2, 3: 4+4 (capped)
    batch_bytes = 4 * 2 * 4 + 4 * 8  # features float32 [4, 2], labels int64 [4]
    monkeypatch.setattr(feeder, "MAX_CHUNK_BYTES", 2 * batch_bytes)
    sizes = [len(c.data[1]) for c in feeder.chunks(iter(batches(8)), Tagging(8, 1, scan=False))]
    assert sizes == [1, 2, 2, 2, 1]


def test_loops_hand_out_each_loop_chunk_by_chunk():
    loops = feeder.loops(feeder.chunks(iter(batches(8)), Tagging(6, 3)))
    assert [[c.data for c in loop] for loop in loops] == [
        [("stacked", [0, 1, 2]), ("stacked", [3, 4, 5])], [("list", [6, 7])],
    ]


@pytest.mark.parametrize("steps, expected", [
    (4, [("stacked", [0, 1, 2]), ("list", [3])]),
    (3, [("stacked", [0, 1, 2])]),
    (2, [("list", [0, 1])]),
])
def test_steps_cut_the_input_before_stacking(steps, expected):
    cut = itertools.islice(iter(batches(9)), steps)
    assert [c.data for c in feeder.chunks(cut, Tagging(6, 3))] == expected


def test_one_process_agrees_with_itself():
    chunks = feeder.chunks(iter(batches(5, last_real=1)), Tagging(3, 3))
    agreed = list(in_lockstep(chunks, lambda: None, width=3, size=4))
    assert [(a.data, [c.tolist() for c in a.counts], a.end_of_loop) for a in agreed] == [
        (("stacked", [0, 1, 2]), [[4], [4], [4]], True), (("list", [3, 4]), [[4], [1]], True),
    ]
    assert all(a.size == 4 for a in agreed)
