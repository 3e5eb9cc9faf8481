"""`InputContext`: what an input_fn needs to read its share of the data."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class InputContext:
    """Passed to an `input_fn` that takes an `input_context` argument.

    Attributes:
      num_input_pipelines: Number of hosts (processes) reading input.
      input_pipeline_id: This host's index, in `[0, num_input_pipelines)`.
      num_replicas_in_sync: Data-parallel replicas over all hosts.
      per_replica_batch_size: Examples per replica per step (None when the
        input decides the batch size, as with `use_tpu=False` and no batch size).

    Example:
      >>> def input_fn(params, input_context):
      ...     files = all_files[input_context.input_pipeline_id::input_context.num_input_pipelines]
      ...     ...
    """

    num_input_pipelines: int = 1
    input_pipeline_id: int = 0
    num_replicas_in_sync: int = 1
    per_replica_batch_size: int | None = None

    @property
    def num_hosts(self) -> int:
        return self.num_input_pipelines

    @property
    def host_id(self) -> int:
        return self.input_pipeline_id

    @property
    def replicas_per_host(self) -> int:
        return max(1, self.num_replicas_in_sync // self.num_input_pipelines)
