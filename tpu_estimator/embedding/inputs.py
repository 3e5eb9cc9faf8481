"""The embedding features of input_fn's batches, checked on the host and split off.

Input form (numpy, per feature named in `feature_to_config_dict`):

- ids: integers `[batch, width]`, each example's ids followed by -1 padding
  (a 1-D `[batch]` array is one id per example). A sequence feature
  (`max_sequence_length` L > 0) has width L: position p of example b is
  `ids[b, p]`, -1 where the sequence has ended. A bag feature with
  `max_ids_per_example` W is at most W wide.
- weights (`FeatureConfig.weight_key`): floats of the ids' shape under that
  key; a padding position's weight is ignored.

Ids below -1 or >= the table's `vocabulary_size` are an error naming the
feature and the table (the original TPU clamped or dropped them silently).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from tpu_estimator.api.checks import message
from tpu_estimator.embedding.config import EmbeddingConfigSpec


def prepare_features(spec: EmbeddingConfigSpec, features: Mapping[str, Any]) -> dict[str, Any]:
    """The features with each embedding feature's ids checked and made int32 `[batch, width]`
    (and its weights float32 of that shape): what the host places on the devices, where
    the step splits them off (`embedding.replica.split_in_step`)."""
    rest, ids, weights = split_features(spec, features)
    keys = {f: c.weight_key for f, c in spec.features.items() if c.weight_key is not None}
    return {**rest, **ids, **{keys[f]: w for f, w in weights.items()}}


def split_features(
    spec: EmbeddingConfigSpec, features: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(the other features, ids per feature, weights per weighted feature), checked.

    The ids and weight keys are removed from the features model_fn will see.
    """
    if not isinstance(features, Mapping):
        raise TypeError(
            message(
                "With `embedding_config_spec`, input_fn's features must be a dict holding each embedding feature's ids.",
                f"features={type(features).__name__}",
            )
        )
    rest = dict(features)
    ids, weights = {}, {}
    for feature, config in spec.features.items():
        table_name = spec.feature_tables[feature]
        table = spec.tables[table_name]
        if feature not in rest:
            raise KeyError(
                message(
                    f"input_fn's features lack the ids of embedding feature {feature!r} (table {table_name!r}).",
                    f"feature keys={sorted(rest)}",
                    "Return them as int ids padded with -1 to a fixed width.",
                )
            )
        value = np.asarray(rest.pop(feature))
        if value.ndim == 1:
            value = value[:, None]
        where = f"embedding feature {feature!r} (table {table_name!r})"
        if value.ndim != 2 or not np.issubdtype(value.dtype, np.integer):
            raise ValueError(
                message(
                    f"The ids of {where} must be ints shaped [batch, width] (-1 pads).",
                    f"dtype={value.dtype}, shape={value.shape}",
                )
            )
        length = config.max_sequence_length
        if length and value.shape[1] != length:
            raise ValueError(
                message(
                    f"The ids of sequence {where} must have width max_sequence_length={length}.",
                    f"shape={value.shape}",
                    "Pad each sequence with -1 to max_sequence_length (truncate longer ones).",
                )
            )
        width = config.max_ids_per_example
        if width is not None and value.shape[1] > width:
            raise ValueError(
                message(
                    f"The ids of {where} must be at most max_ids_per_example={width} wide (the width the "
                    "sharding planner counted).",
                    f"shape={value.shape}",
                    f"Pad each example's ids with -1 to at most {width}, or raise "
                    f"FeatureConfig(max_ids_per_example=...) to {value.shape[1]}.",
                )
            )
        bad = (value < -1) | (value >= table.vocabulary_size)
        if bad.any():
            raise ValueError(
                message(
                    f"The ids of {where} must be in [0, {table.vocabulary_size}) or -1 (padding).",
                    f"ids {sorted(set(value[bad].tolist()))[:5]} at {np.argwhere(bad)[:3].tolist()}",
                    "Hash or bucket ids into the vocabulary on the host, or enlarge vocabulary_size.",
                )
            )
        ids[feature] = value.astype(np.int32)
        if config.weight_key is not None:
            if config.weight_key not in features:
                raise KeyError(
                    message(
                        f"Weights {config.weight_key!r} of {where} are not in input_fn's features.",
                        f"feature keys={sorted(features)}",
                        "Return them (floats shaped like the ids) or set weight_key=None.",
                    )
                )
            w = np.asarray(features[config.weight_key])
            w = w[:, None] if w.ndim == 1 else w
            if w.shape != value.shape:
                raise ValueError(
                    message(
                        f"Weights {config.weight_key!r} of {where} must have the ids' shape.",
                        f"weights shape={w.shape}, ids shape={value.shape}",
                    )
                )
            weights[feature] = w.astype(np.float32)
            rest.pop(config.weight_key, None)
    return rest, ids, weights
