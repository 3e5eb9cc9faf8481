"""Large embedding tables placed over every device (`embedding_config_spec`): by rows, columns or replicated.

The original's `tf.estimator.tpu.experimental.EmbeddingConfigSpec` and
`tf.tpu.experimental.*` names (the configs and optimizers are also top-level
`tpu_estimator.*` names, as the package flattens TF's paths), and helpers for the
common `embedding_column` / `shared_embedding_columns` cases. This module only
re-exports.
"""

from tpu_estimator.embedding.columns import config_dicts as config_dicts
from tpu_estimator.embedding.columns import embedding_column as embedding_column
from tpu_estimator.embedding.columns import shared_embedding_columns as shared_embedding_columns
from tpu_estimator.embedding.config import EmbeddingConfigSpec as EmbeddingConfigSpec
from tpu_estimator.embedding.hashing import hash_bucket as hash_bucket
from tpu_estimator.embedding.config import FeatureConfig as FeatureConfig
from tpu_estimator.embedding.config import TableConfig as TableConfig
from tpu_estimator.embedding.optimizers import AdagradParameters as AdagradParameters
from tpu_estimator.embedding.optimizers import AdamParameters as AdamParameters
from tpu_estimator.embedding.optimizers import FtrlParameters as FtrlParameters
from tpu_estimator.embedding.optimizers import (
    StochasticGradientDescentParameters as StochasticGradientDescentParameters,
)

__all__ = [
    "AdagradParameters",
    "AdamParameters",
    "EmbeddingConfigSpec",
    "FeatureConfig",
    "FtrlParameters",
    "StochasticGradientDescentParameters",
    "TableConfig",
    "config_dicts",
    "embedding_column",
    "hash_bucket",
    "shared_embedding_columns",
]
