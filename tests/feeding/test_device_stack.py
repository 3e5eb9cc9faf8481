"""feeding.device.stack: a scan's chunk written once, in memory XLA:CPU takes without a copy."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from tpu_estimator.feeding.device import aligned_empty, stack


def batches(n: int) -> list[dict]:
    rng = np.random.RandomState(0)
    return [
        {"x": rng.rand(8, 3).astype(np.float32), "y": np.int32(i), "mask": rng.rand(8) > 0.5}
        for i in range(n)
    ]


def test_stack_equals_numpy_stack_leaf_by_leaf():
    trees = batches(5)
    out = stack(trees)
    for key in ("x", "y", "mask"):
        expected = np.stack([t[key] for t in trees])
        assert out[key].dtype == expected.dtype and out[key].shape == expected.shape
        np.testing.assert_array_equal(out[key], expected)
        assert out[key].flags.writeable


def test_the_stacked_buffers_are_aligned_and_become_the_cpu_device_array():
    out = stack(batches(4))
    assert all(leaf.ctypes.data % 64 == 0 for leaf in jax.tree.leaves(out))
    cpu = jax.devices("cpu")[0]
    placed = jax.device_put(out["x"], cpu)
    assert placed.unsafe_buffer_pointer() == out["x"].ctypes.data  # no second copy
    expected = out["x"].copy()
    del out
    np.testing.assert_array_equal(np.asarray(placed), expected)  # the device array keeps the memory


@pytest.mark.parametrize(
    "shape, dtype", [((0, 3), np.float32), ((), np.bool_), ((2,), object), ((3, 5), np.int8)]
)
def test_aligned_empty_shapes_and_dtypes(shape, dtype):
    out = aligned_empty(shape, dtype)
    assert out.shape == shape and out.dtype == np.dtype(dtype)
