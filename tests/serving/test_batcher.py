"""Dynamic batching without a server: merging, padding, splitting, retiring, errors."""

import threading

import numpy as np
import pytest

from tpu_estimator.serving.batcher import Batcher, BatchingOptions, ModelRetired


class Recorder:
    def __init__(self, fail=False):
        self.shapes, self.fail, self.gate = [], fail, threading.Event()

    def __call__(self, inputs):
        self.gate.wait(5)
        self.shapes.append(inputs["x"].shape[0])
        if self.fail:
            raise RuntimeError("boom")
        return {"y": inputs["x"] * 2, "n": np.full(len(inputs["x"]), len(inputs["x"]))}


def test_merges_pads_and_slices():
    run = Recorder()
    b = Batcher(run, BatchingOptions.create(max_batch_size=8, batch_timeout_micros=200_000,
                                            allowed_batch_sizes=[4, 8]))
    xs = [np.arange(n, dtype=np.float32)[:, None] + 10 * n for n in (1, 2, 3)]
    futures = [b.submit({"x": x}, len(x))[0] for x in xs]
    run.gate.set()
    outs = [f.result(5) for f in futures]
    for x, out in zip(xs, outs):
        np.testing.assert_array_equal(out["y"], x * 2)
    assert run.shapes == [8]  # 6 rows merged, padded to the allowed size 8
    b.close()


def test_large_requests_are_split_and_padding_sizes():
    run = Recorder()
    run.gate.set()
    b = Batcher(run, BatchingOptions.create(max_batch_size=4, batch_timeout_micros=0,
                                            allowed_batch_sizes=[2, 4]))
    x = np.arange(7, dtype=np.float32)[:, None]
    parts = [f.result(5) for f in b.submit({"x": x}, 7)]
    np.testing.assert_array_equal(np.concatenate([p["y"] for p in parts]), x * 2)
    assert all(s in (2, 4) for s in run.shapes)
    b.close()


def test_close_finishes_queued_work_then_refuses():
    run = Recorder()
    b = Batcher(run, BatchingOptions.create(max_batch_size=2, batch_timeout_micros=0))
    fut = b.submit({"x": np.ones((1, 1), np.float32)}, 1)[0]
    b.close()
    run.gate.set()
    assert fut.result(5)["y"].shape == (1, 1)
    with pytest.raises(ModelRetired):
        b.submit({"x": np.ones((1, 1), np.float32)}, 1)


def test_errors_reach_every_request():
    run = Recorder(fail=True)
    b = Batcher(run, BatchingOptions.create(max_batch_size=4, batch_timeout_micros=100_000))
    futures = [b.submit({"x": np.ones((1, 1), np.float32)}, 1)[0] for _ in range(2)]
    run.gate.set()
    for f in futures:
        with pytest.raises(RuntimeError, match="boom"):
            f.result(5)
    b.close()


def test_options_precedence_and_defaults():
    recorded = {"num_batch_threads": 2, "max_batch_size": 8, "batch_timeout_micros": 5,
                "allowed_batch_sizes": [2, 8]}
    o = BatchingOptions.create(recorded)
    assert (o.max_batch_size, o.allowed_batch_sizes, o.num_batch_threads) == (8, (2, 8), 2)
    o = BatchingOptions.create(recorded, max_batch_size=12)  # recorded sizes end at 8: dropped
    assert o.allowed_batch_sizes == (1, 2, 4, 8, 12)
    assert BatchingOptions.create().allowed_batch_sizes == (1, 2, 4, 8, 16, 32)
    assert o.padded_size(3) == 4 and o.padded_size(13) == 13
    with pytest.raises(ValueError, match="batch_timeout_micros"):
        BatchingOptions.create(batch_timeout_micros=-1)
