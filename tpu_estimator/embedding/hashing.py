"""Ids beyond a fixed vocabulary: `hash_bucket`, TF's `to_hash_bucket_fast` on the host.

For features whose values are arbitrary strings or int64s (TF's
`categorical_column_with_hash_bucket`): each value is mapped to a row in
`[0, num_buckets)` by FarmHash's `Fingerprint64` of its bytes (UTF-8 for str;
an integer's decimal digits, as TF's `as_string`) modulo `num_buckets` - the
very function TF's `tf.strings.to_hash_bucket_fast` computes, so rows trained
in TF, here, and the ids a serving client computes agree. The fingerprint is
fixed by FarmHash's specification (it does not depend on the machine or the
process), so serving computes the same rows: a client sends
`hash_bucket(values, n)` as the feature's ids.

Values that collide share a row, as in TF; with B buckets and N distinct
values, about N^2 / (2B) pairs collide (choose B a few times N). A
collision-free dynamic vocabulary (a growing table with eviction, as TorchRec's
managed collision modules and TF Recommenders Addons offer) does not fit the
sharded tables here: their shapes are fixed when the programs compile, and a
row's owner is a function of its id; it would need a host-side id -> row map
kept consistent across hosts and checkpointed with the tables (not built).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tpu_estimator.api.checks import message


def hash_bucket(values: Any, num_buckets: int) -> np.ndarray:
    """The rows of `values` (strings, bytes or integers, any shape) in `num_buckets` buckets.

    Args:
      values: array-like of str, bytes or ints (ints hash as their decimal digits, as TF's
        `categorical_column_with_hash_bucket` does for integer columns).
      num_buckets: positive int, the table's `vocabulary_size`.

    Returns:
      int64 array of `values`' shape, in `[0, num_buckets)`.

    Raises:
      ValueError: `num_buckets` is not a positive int, or a value is of another type.
      ImportError: pyfarmhash is missing (the `embedding` extra brings it).

    Example:
      >>> hash_bucket(["a", "hello"], 1000).tolist()   # = tf.strings.to_hash_bucket_fast
      [939, 296]
    """
    if isinstance(num_buckets, bool) or not isinstance(num_buckets, (int, np.integer)) or num_buckets < 1:
        raise ValueError(message("`num_buckets` must be a positive int.", f"num_buckets={num_buckets!r}"))
    try:
        import farmhash
    except ImportError as e:
        raise ImportError(
            "hash_bucket needs pyfarmhash (FarmHash's Fingerprint64, as TensorFlow's): "
            "pip install 'tpu_estimator[embedding]'"
        ) from e
    array = np.asarray(values)
    flat = array.reshape(-1)
    out = np.empty(flat.shape, np.uint64)
    for i, value in enumerate(flat.tolist()):
        out[i] = farmhash.fingerprint64(_bytes(value))
    return (out % np.uint64(num_buckets)).astype(np.int64).reshape(array.shape)


def _bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return str(int(value)).encode("ascii")
    raise ValueError(
        message(
            "hash_bucket takes strings, bytes or integers.",
            f"a value {value!r} of type {type(value).__name__}",
            "Convert other values to strings first.",
        )
    )
