"""`EmbeddingConfigSpec`, `TableConfig`, `FeatureConfig`: the original's embedding API.

Checked at construction as the original's (tensorflow/python/tpu/tpu_embedding.py
and tensorflow_estimator's `_tpu_estimator_embedding.py`): a table used by no
feature, a feature naming an unknown table, non-positive sizes, an unknown
combiner, a negative `max_sequence_length`, the partition strategy and the
optimizer are errors that say what to change.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Literal, Mapping

from tpu_estimator.api.checks import is_int, message
from tpu_estimator.api.keywords import suggest_keywords
from tpu_estimator.embedding.optimizers import OPTIMIZERS

COMBINERS = ("sum", "mean", "sqrtn")
SHARDINGS = ("row", "column", "replicated", "table")  # TableConfig(sharding=...); embedding/plan.py
# EmbeddingConfigSpec(replicate_budget_bytes=...)'s default: 1/64 of a 16 GiB TPU v5e chip (embedding/plan.py)
REPLICATE_BUDGET_BYTES = 256 << 20
Initializer = Callable[[Any, tuple[int, ...], Any], Any]


def default_initializer(dimension: int) -> Initializer:
    """The original's default: truncated normal, mean 0, stddev 1/sqrt(dimension)."""
    import jax

    return jax.nn.initializers.truncated_normal(stddev=1.0 / math.sqrt(dimension))


@suggest_keywords
@dataclasses.dataclass(frozen=True, eq=False)
class TableConfig:
    """One embedding table: `vocabulary_size` rows of `dimension` values.

    Args:
      vocabulary_size: Number of rows (ids are 0 .. vocabulary_size-1).
      dimension: Width of each row.
      initializer: `(key, shape, dtype) -> array` (a `jax.nn.initializers`
        function); None: truncated normal with stddev 1/sqrt(dimension), as the
        original.
      combiner: How the ids of one example are reduced: 'mean' (default),
        'sum' or 'sqrtn' (weighted sum over the root of the sum of squared weights).
      name: The table's name (used when a `FeatureConfig` holds this object and
        no `table_to_config_dict` names it).
      learning_rate: This table's learning rate (a positive number), in place
        of the embedding optimizer's; None: the optimizer's, as the original.
      learning_rate_fn: This table's learning rate as a function of the global
        step (an int32 scalar, traced), as the original's; at most one of the two.
      sharding: How the table is placed on several devices: 'row' (rows over
        every device), 'column' (the dimension split over the devices; it must
        be a multiple of the device count), 'replicated' (whole on every device),
        'table' (whole on one device, tables placed to balance rows and lookups);
        None (default): the planner's choice (embedding/plan.py: small tables
        replicated, others row-sharded). One device holds every table whole.

    Example:
      >>> from tpu_estimator.embedding import TableConfig
      >>> TableConfig(vocabulary_size=1000, dimension=16).combiner
      'mean'
    """

    vocabulary_size: int
    dimension: int
    initializer: Initializer | None = None
    combiner: Literal["sum", "mean", "sqrtn"] = "mean"
    name: str | None = None
    learning_rate: float | None = None
    learning_rate_fn: Callable[[Any], Any] | None = None
    sharding: Literal["row", "column", "replicated", "table"] | None = None

    def __post_init__(self) -> None:
        self._check_learning_rate()
        if self.sharding is not None and self.sharding not in SHARDINGS:
            raise ValueError(
                message(
                    "`TableConfig(sharding=...)` must be 'row', 'column', 'replicated', 'table' or None "
                    "(the planner's choice).",
                    f"sharding={self.sharding!r}",
                    "Pass one of those, or leave it None.",
                )
            )
        for field in ("vocabulary_size", "dimension"):
            value = getattr(self, field)
            if not is_int(value) or value < 1:
                raise ValueError(
                    message(
                        f"`TableConfig({field}=...)` must be a positive int.",
                        f"{field}={value!r}",
                        None if field == "dimension" else "Count the ids the feature can take (0 .. vocabulary_size-1).",
                    )
                )
        if self.initializer is not None and not callable(self.initializer):
            raise ValueError(
                message(
                    "`TableConfig(initializer=...)` must be callable (key, shape, dtype) -> array.",
                    f"initializer={self.initializer!r}",
                    "Pass e.g. jax.nn.initializers.normal(0.01), or None for the default.",
                )
            )
        if self.combiner not in COMBINERS:
            raise ValueError(
                message(
                    "`TableConfig(combiner=...)` must be one of 'sum', 'mean', 'sqrtn'.",
                    f"combiner={self.combiner!r}",
                )
            )
        if self.name is not None and not isinstance(self.name, str):
            raise TypeError(message("`TableConfig(name=...)` must be a str or None.", f"name={self.name!r}"))

    def init_fn(self) -> Initializer:
        return self.initializer or default_initializer(self.dimension)

    def learning_rate_at(self, step: Any) -> Any:
        """This table's learning rate at `step`, or None (the optimizer's applies)."""
        if self.learning_rate_fn is not None:
            return self.learning_rate_fn(step)
        return self.learning_rate

    def _check_learning_rate(self) -> None:
        if self.learning_rate is not None and self.learning_rate_fn is not None:
            raise ValueError(
                message(
                    "`TableConfig` takes at most one of `learning_rate` and `learning_rate_fn`.",
                    f"learning_rate={self.learning_rate!r}, learning_rate_fn={self.learning_rate_fn!r}",
                    "Pass a number, or a function of the global step, not both.",
                )
            )
        lr = self.learning_rate
        if lr is not None and (isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0):
            raise ValueError(
                message("`TableConfig(learning_rate=...)` must be a positive number or None.",
                        f"learning_rate={lr!r}")
            )
        if self.learning_rate_fn is not None and not callable(self.learning_rate_fn):
            raise TypeError(
                message("`TableConfig(learning_rate_fn=...)` must be a function of the global step, or None.",
                        f"learning_rate_fn={self.learning_rate_fn!r}")
            )


@suggest_keywords
@dataclasses.dataclass(frozen=True)
class FeatureConfig:
    """One embedding feature: which table its ids index, and its shape.

    Args:
      table: The table, by its key in `table_to_config_dict` or as the
        `TableConfig` itself.
      table_id: The original's name for `table` (a key of
        `table_to_config_dict`); give one of the two.
      max_sequence_length: 0: the ids of an example are combined into one
        `[dimension]` vector. Positive: a sequence feature; model_fn gets
        `[batch, max_sequence_length, dimension]`, one row per position.
      weight_key: The input feature holding the ids' weights (same shape as
        the ids), or None for weight 1.
      max_ids_per_example: A bag feature's width: the most ids one example holds
        (the width of its `[batch, width]` ids, -1 padding included), which the
        sharding planner counts as the rows a training step looks up per example
        (embedding/plan.py). None (default): one. The planner runs before the
        first batch (the same plan on every host and in an estimator that only
        evaluates), so it cannot read the width; wider ids are an error naming
        the feature. The original had no such field (its TPU read SparseTensors'
        widths at run time); a sequence feature's width is its
        `max_sequence_length`, so leave this None there.
    """

    table: str | TableConfig | None = None
    max_sequence_length: int = 0
    weight_key: str | None = None
    table_id: str | None = None
    max_ids_per_example: int | None = None

    def __post_init__(self) -> None:
        if self.table_id is not None:
            if self.table is not None and self.table != self.table_id:
                raise ValueError(
                    message(
                        "`FeatureConfig` takes the table as `table` or as `table_id` (the original's name), "
                        "not both.",
                        f"table={self.table!r}, table_id={self.table_id!r}",
                    )
                )
            object.__setattr__(self, "table", self.table_id)  # the one field the rest reads
        if not isinstance(self.table, (str, TableConfig)):
            raise TypeError(
                message(
                    "`FeatureConfig(table=...)` must name a table (a key of table_to_config_dict) or be a TableConfig.",
                    f"table={self.table!r}",
                )
            )
        if not is_int(self.max_sequence_length) or self.max_sequence_length < 0:
            raise ValueError(
                message(
                    "`FeatureConfig(max_sequence_length=...)` must be an int >= 0 (0: not a sequence feature).",
                    f"max_sequence_length={self.max_sequence_length!r}",
                )
            )
        if self.weight_key is not None and not isinstance(self.weight_key, str):
            raise TypeError(
                message("`FeatureConfig(weight_key=...)` must be a str or None.", f"weight_key={self.weight_key!r}")
            )
        self._check_width()

    def _check_width(self) -> None:
        width = self.max_ids_per_example
        if width is None:
            return
        if not is_int(width) or width < 1:
            raise ValueError(
                message(
                    "`FeatureConfig(max_ids_per_example=...)` must be a positive int (the width of the "
                    "feature's [batch, width] ids) or None (one id per example).",
                    f"max_ids_per_example={width!r}",
                )
            )
        if self.max_sequence_length:
            raise ValueError(
                message(
                    "`FeatureConfig(max_ids_per_example=...)` is for bag features; a sequence feature's "
                    "width is its max_sequence_length.",
                    f"max_sequence_length={self.max_sequence_length}, max_ids_per_example={width}",
                    "Drop max_ids_per_example (the planner counts max_sequence_length ids per example).",
                )
            )

    @property
    def ids_per_example(self) -> int:
        """The rows one example looks up in the table (the planner's count): the sequence
        length, `max_ids_per_example`, or one."""
        return self.max_sequence_length or self.max_ids_per_example or 1


_FEATURE_COLUMNS_FIX = (
    "TensorFlow feature columns do not exist here: pass "
    "feature_to_config_dict={'ids_feature': FeatureConfig('table')} and "
    "table_to_config_dict={'table': TableConfig(vocabulary_size, dimension)} instead."
)


@suggest_keywords
@dataclasses.dataclass(frozen=True)
class EmbeddingConfigSpec:
    """The embedding tables of a model, passed as `TPUEstimator(embedding_config_spec=...)`.

    Each table is placed by its plan (`TableConfig(sharding=...)`, or the
    planner's: small tables replicated, others sharded by rows over every
    device; embedding/plan.py); model_fn receives each
    feature's looked-up, combined activations in `features[name]`; the tables
    are trained by `optimization_parameters`, not by `train_op`.

    Args:
      feature_columns: Not supported (TF feature columns need TensorFlow); use
        the two dicts.
      optimization_parameters: `AdagradParameters`, `AdamParameters`,
        `FtrlParameters` or `StochasticGradientDescentParameters`.
      clipping_limit: If set, each table gradient value is clipped to
        [-clipping_limit, clipping_limit] before the update.
      pipeline_execution_with_tensor_core: Accepted; lookups here always see
        the previous step's update (the original's exact `False` behaviour).
      experimental_gradient_multiplier_fn: `fn(global_step) -> multiplier` of
        every table gradient.
      feature_to_config_dict: feature name -> `FeatureConfig`.
      table_to_config_dict: table name -> `TableConfig` (may be omitted when
        every FeatureConfig holds a named `TableConfig`).
      partition_strategy: 'div' (contiguous blocks of rows per device) or
        'mod' (row r on device r % N).
      replicate_budget_bytes: The most bytes per device the sharding planner's
        replicated tables and their optimizer slots take together (float32;
        tables asked for with `TableConfig(sharding='replicated')` counted
        first, never moved); the planner shards the tables that do not fit,
        keeping those looked up most per row (embedding/plan.py). Default 256
        MiB, 1/64 of a 16 GiB TPU v5e chip; 0: the planner replicates none.
        Not the original's (its TPU placed every table on the embedding
        engine).

    Example:
      >>> from tpu_estimator.embedding import (
      ...     EmbeddingConfigSpec, FeatureConfig, TableConfig, AdagradParameters)
      >>> spec = EmbeddingConfigSpec(
      ...     feature_to_config_dict={"watched": FeatureConfig("video"),
      ...                             "liked": FeatureConfig("video")},
      ...     table_to_config_dict={"video": TableConfig(1000, 16)},
      ...     optimization_parameters=AdagradParameters(0.1))
      >>> spec.features_of("video")
      ('liked', 'watched')
    """

    feature_columns: Any = None
    optimization_parameters: Any = None
    clipping_limit: float | None = None
    pipeline_execution_with_tensor_core: bool = False
    experimental_gradient_multiplier_fn: Callable[[Any], Any] | None = None
    feature_to_config_dict: Mapping[str, FeatureConfig] | None = None
    table_to_config_dict: Mapping[str, TableConfig] | None = None
    partition_strategy: Literal["div", "mod"] = "div"
    replicate_budget_bytes: int = REPLICATE_BUDGET_BYTES

    def __post_init__(self) -> None:
        if self.feature_columns is not None:
            raise ValueError(
                message(
                    "`EmbeddingConfigSpec(feature_columns=...)` is not supported.",
                    f"feature_columns={type(self.feature_columns).__name__}",
                    _FEATURE_COLUMNS_FIX,
                )
            )
        if not self.feature_to_config_dict:
            raise ValueError(
                message(
                    "`EmbeddingConfigSpec` needs `feature_to_config_dict` (and `table_to_config_dict`).",
                    f"feature_to_config_dict={self.feature_to_config_dict!r}",
                    _FEATURE_COLUMNS_FIX,
                )
            )
        if self.partition_strategy not in ("div", "mod"):
            raise ValueError(
                message(
                    "`partition_strategy` must be 'div' or 'mod'.",
                    f"partition_strategy={self.partition_strategy!r}",
                )
            )
        budget = self.replicate_budget_bytes
        if not is_int(budget) or budget < 0:
            raise ValueError(
                message(
                    "`EmbeddingConfigSpec(replicate_budget_bytes=...)` must be an int >= 0: the bytes per "
                    "device the planner's replicated tables and optimizer slots may take.",
                    f"replicate_budget_bytes={budget!r}",
                    f"Pass e.g. replicate_budget_bytes={REPLICATE_BUDGET_BYTES} (256 MiB, the default), "
                    "or 0 to replicate only the tables asked for.",
                )
            )
        if not isinstance(self.optimization_parameters, OPTIMIZERS):
            raise ValueError(
                message(
                    "`optimization_parameters` must be one of "
                    + ", ".join(c.__name__ for c in OPTIMIZERS) + ".",
                    f"optimization_parameters={self.optimization_parameters!r}",
                    "Pass e.g. optimization_parameters=tpu_estimator.embedding.AdagradParameters(0.1).",
                )
            )
        if self.clipping_limit is not None and not (
            isinstance(self.clipping_limit, (int, float)) and self.clipping_limit > 0
        ):
            raise ValueError(
                message("`clipping_limit` must be a positive number or None.", f"clipping_limit={self.clipping_limit!r}")
            )
        if self.experimental_gradient_multiplier_fn is not None and not callable(
            self.experimental_gradient_multiplier_fn
        ):
            raise TypeError(
                message(
                    "`experimental_gradient_multiplier_fn` must be callable (global_step -> multiplier).",
                    f"experimental_gradient_multiplier_fn={self.experimental_gradient_multiplier_fn!r}",
                )
            )
        object.__setattr__(self, "_resolved", _resolve(self.feature_to_config_dict, self.table_to_config_dict))

    @property
    def tables(self) -> dict[str, TableConfig]:
        """Table name -> TableConfig, sorted by name (the order of the state)."""
        return dict(self._resolved[0])  # type: ignore[attr-defined]

    @property
    def feature_tables(self) -> dict[str, str]:
        """Feature name -> its table's name, sorted by feature."""
        return dict(self._resolved[1])  # type: ignore[attr-defined]

    @property
    def features(self) -> dict[str, FeatureConfig]:
        return {f: self.feature_to_config_dict[f] for f in self.feature_tables}  # type: ignore[index]

    def features_of(self, table: str) -> tuple[str, ...]:
        """The features looking up `table`, sorted."""
        return tuple(f for f, t in self.feature_tables.items() if t == table)

    def table_of(self, feature: str) -> TableConfig:
        return self.tables[self.feature_tables[feature]]


def _resolve(
    features: Mapping[str, Any], tables: Mapping[str, Any] | None
) -> tuple[tuple[tuple[str, TableConfig], ...], tuple[tuple[str, str], ...]]:
    """(table name, config) and (feature, table name) pairs, checked like the original's."""
    if not isinstance(features, Mapping):
        raise TypeError(
            message("`feature_to_config_dict` must be a dict of name -> FeatureConfig.", type(features).__name__)
        )
    if tables is not None and not isinstance(tables, Mapping):
        raise TypeError(message("`table_to_config_dict` must be a dict of name -> TableConfig.", type(tables).__name__))
    named: dict[str, TableConfig] = {}
    for name, config in (tables or {}).items():
        if not isinstance(config, TableConfig):
            raise TypeError(
                message(
                    f"Config for table {name!r} must be a `TableConfig`.",
                    f"table_to_config_dict[{name!r}]={type(config).__name__}",
                )
            )
        named[str(name)] = config
    feature_tables: dict[str, str] = {}
    for feature, config in features.items():
        if not isinstance(config, FeatureConfig):
            raise TypeError(
                message(
                    f"Config for feature {feature!r} must be a `FeatureConfig`.",
                    f"feature_to_config_dict[{feature!r}]={type(config).__name__}",
                )
            )
        table = config.table
        if isinstance(table, TableConfig):
            found = [n for n, t in named.items() if t is table]
            if found:
                table = found[0]
            elif tables is None and table.name:
                named.setdefault(table.name, config.table)  # type: ignore[arg-type]
                if named[table.name] is not config.table:
                    raise ValueError(
                        message(
                            "Two different TableConfigs share one name.",
                            f"name={table.name!r}",
                            "Give each table its own name.",
                        )
                    )
                table = table.name
            else:
                raise ValueError(
                    message(
                        f"Feature {feature!r} refers to a TableConfig that is not in `table_to_config_dict` "
                        "and has no name.",
                        f"feature_to_config_dict[{feature!r}].table={config.table!r}",
                        "Add it to table_to_config_dict, or give it name=... and omit table_to_config_dict.",
                    )
                )
        if table not in named:
            raise ValueError(
                message(
                    f"Feature {feature!r} refers to table {table!r} which is not in `table_to_config_dict`.",
                    f"tables={sorted(named)}",
                    "Add the table to table_to_config_dict or fix the FeatureConfig's table.",
                )
            )
        feature_tables[str(feature)] = table
    unused = sorted(set(named) - set(feature_tables.values()))
    if unused:
        raise ValueError(
            message(
                "`table_to_config_dict` has tables used by no feature in `feature_to_config_dict`.",
                f"unused tables={unused}",
                "Remove them, or add a FeatureConfig that looks them up.",
            )
        )
    return (
        tuple(sorted(named.items())),
        tuple(sorted(feature_tables.items())),
    )
