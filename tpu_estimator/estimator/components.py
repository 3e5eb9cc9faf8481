"""The one place where the user's settings register `StateComponent`s (model/components.py).

A new kind of training state is one module (its component) and one line here
(and, if its variables are not named by their paths, one line in
`variable_readers`). Each component's package is imported only when its
setting asks for it (or when a checkpoint being read holds its state).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tpu_estimator.api.checks import message
from tpu_estimator.api.run_config import RunConfig
from tpu_estimator.checkpoint.variables import Readers, VariableReader
from tpu_estimator.model.components import StateComponent

if TYPE_CHECKING:
    from tpu_estimator.parallel.mesh import Topology


def registered(
    config: RunConfig, topology: Topology, embedding_config_spec: Any = None, *, train_batch_size: int | None = None
) -> tuple[StateComponent, ...]:
    """The components the settings ask for, in the order their hooks run (the embedding
    tables planned for a training step of `train_batch_size` examples, global; None: not known)."""
    found: list[StateComponent] = []
    if embedding_config_spec is not None:
        from tpu_estimator.embedding.component import EmbeddingTables

        found.append(EmbeddingTables.create(embedding_config_spec, topology, global_batch=train_batch_size))
    if config.tpu_config.precision_policy == "mixed_float16":
        from tpu_estimator.extras.loss_scale import DynamicLossScale

        found.append(DynamicLossScale())
    decay = config.tpu_config.moving_average_decay
    if decay is not None:
        from tpu_estimator.extras.moving_average import MovingAverage

        found.append(MovingAverage(float(decay)))
    return tuple(found)


def check_component_settings(*, embedding_config_spec: Any = None) -> None:
    """The constructor's check of the settings that register components (type errors early).

    Raises:
      TypeError: `embedding_config_spec` is not an `EmbeddingConfigSpec`.
    """
    if embedding_config_spec is not None:
        from tpu_estimator.embedding.config import EmbeddingConfigSpec

        if not isinstance(embedding_config_spec, EmbeddingConfigSpec):
            raise TypeError(
                message(
                    "`embedding_config_spec` must be a tpu_estimator.EmbeddingConfigSpec.",
                    f"embedding_config_spec={type(embedding_config_spec).__name__}",
                    "Build one with EmbeddingConfigSpec(feature_to_config_dict=..., "
                    "table_to_config_dict=..., optimization_parameters=...).",
                )
            )


def _table_reader() -> VariableReader:
    from tpu_estimator.embedding.component import TableReader

    return TableReader()


def variable_readers() -> Readers:
    """Component name -> its variable reader (made, and its package imported, only for a
    checkpoint holding that component's state): `list_variables` and friends, warm start."""
    return {"embedding": _table_reader}
