"""embedding.hash_bucket equals TensorFlow's to_hash_bucket_fast (strings, bytes, unicode, and
integers through as_string, as categorical_column_with_hash_bucket does), any shape."""

from __future__ import annotations

import numpy as np
import pytest

from tpu_estimator.embedding import hash_bucket

STRINGS = ["", "a", "hello", "é", "日本", "x" * 300, "user:12345"]


@pytest.fixture(scope="module")
def tf():
    import tensorflow as tf

    return tf


@pytest.mark.parametrize("buckets", [1, 7, 1000, 2**31 - 1])
def test_strings_and_bytes_hash_as_tensorflow(tf, buckets):
    expected = tf.strings.to_hash_bucket_fast(STRINGS, buckets).numpy()
    np.testing.assert_array_equal(hash_bucket(STRINGS, buckets), expected)
    np.testing.assert_array_equal(hash_bucket([s.encode() for s in STRINGS], buckets), expected)


def test_integers_hash_as_their_digits_as_tensorflow(tf):
    ids = np.array([[0, -7, 42], [2**62, -(2**63), 123456789]], np.int64)
    expected = tf.strings.to_hash_bucket_fast(tf.strings.as_string(ids), 10_000).numpy()
    got = hash_bucket(ids, 10_000)
    assert got.shape == (2, 3) and got.dtype == np.int64
    np.testing.assert_array_equal(got, expected)


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="num_buckets=0"):
        hash_bucket(["a"], 0)
    with pytest.raises(ValueError, match="strings, bytes or integers"):
        hash_bucket([1.5], 10)
