"""The embedding tables (`embedding_config_spec`) inside the programs.

With an `EmbeddingConfigSpec`, input_fn's features hold each embedding
feature's ids (embedding/inputs.py); the programs replace them by the
looked-up, combined activations before model_fn sees the features, exactly
where the original put them (`features[name]`). Training differentiates the
loss with respect to those activations too and applies the embedding
optimizer to the rows looked up (embedding/replica.py); evaluation and
prediction only look up. Each program runs once per replica under
`shard_map` manual over "data", where the tables are the replica's block of
rows (`loops/replica.specs_of` gives their specs).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

from tpu_estimator.embedding.config import EmbeddingConfigSpec
from tpu_estimator.embedding.lookup import Collectives
from tpu_estimator.embedding.replica import (
    lookup_in_replica,
    placeholder_activations,
    replica_collectives,
    replica_tables,
    split_in_step,
)
from tpu_estimator.embedding.sharded import ShardedTables
from tpu_estimator.model.state import EMBEDDING
from tpu_estimator.parallel.mesh import Topology


@dataclasses.dataclass(frozen=True)
class Embedding:
    """An `EmbeddingConfigSpec` on a topology: the per-replica collectives and the placement
    of the tables (rows over "data": each replica's devices hold 1/R of every table)."""

    spec: EmbeddingConfigSpec
    collectives: Collectives
    tables: ShardedTables

    @classmethod
    def create(cls, spec: EmbeddingConfigSpec, topology: Topology) -> "Embedding":
        return cls(spec, replica_collectives(topology), replica_tables(spec, topology))

    def split(self, features: Any) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        """(model_fn's other features, ids, weights) of one replica's features. Ids become int32
        `[batch, width]` and weights float32 here too (a no-op for batches the host prepared;
        an export's receiver may give other dtypes or `[batch]` ids)."""
        rest, ids, weights = split_in_step(self.spec, features)
        ids = {f: _two_d(x).astype(jnp.int32) for f, x in ids.items()}
        weights = {f: _two_d(x).astype(jnp.float32) for f, x in weights.items()}
        return rest, ids, weights

    def lookup(self, state: Any, ids: dict[str, Any], weights: dict[str, Any]) -> dict[str, Any]:
        """This replica's activations (`features[name]`)."""
        return lookup_in_replica(self.spec, self.collectives, state, ids, weights)

    def placeholders(self, features: Any) -> dict[str, Any]:
        """The features with zeros in place of the activations (to initialise model_fn)."""
        rest, ids, _ = self.split(features)
        return {**rest, **placeholder_activations(self.spec, ids)}


def looked_up(embedding: Embedding | None, variables: Any, features: Any) -> tuple[Any, Any]:
    """(variables without the tables, features with the activations) for a forward pass;
    unchanged without tables (`TrainState.program_variables` holds them under "embedding")."""
    if embedding is None or not isinstance(variables, dict) or EMBEDDING not in variables:
        return variables, features
    variables = dict(variables)
    state = variables.pop(EMBEDDING)
    rest, ids, weights = embedding.split(features)
    return variables, {**rest, **embedding.lookup(state, ids, weights)}


def _two_d(x: Any) -> Any:
    x = jnp.asarray(x)
    return x[:, None] if x.ndim == 1 else x
