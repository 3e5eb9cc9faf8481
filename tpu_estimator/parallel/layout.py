"""`DataLayout`: how one mode's global batch is split over hosts, input_fns and replicas.

The batch-size rules follow the seeds (TPUEstimator, TPUConfig): the user gives
global batch sizes; `input_fn` and `model_fn` see `params['batch_size']`.
"""

from __future__ import annotations

import dataclasses

from tpu_estimator.api._checks import message
from tpu_estimator.api.mode_keys import ModeKeys
from tpu_estimator.api.tpu_config import InputPipelineConfig
from tpu_estimator.parallel.mesh import Topology

_BATCH_ARG = {
    ModeKeys.TRAIN: "train_batch_size",
    ModeKeys.EVAL: "eval_batch_size",
    ModeKeys.PREDICT: "predict_batch_size",
}


@dataclasses.dataclass(frozen=True)
class DataLayout:
    """Batch arithmetic of one mode.

    Attributes:
      mode: the ModeKeys value.
      pipeline: the input pipeline mode in force for this mode.
      global_batch_size: examples per step over all replicas (None: the input
        decides; only with use_tpu=False).
      num_replicas: data-parallel replicas.
      num_hosts: processes feeding input.
      replicated_input: True when every replica gets the whole batch (BROADCAST).
    """

    mode: str
    pipeline: InputPipelineConfig
    global_batch_size: int | None
    num_replicas: int
    num_hosts: int
    replicated_input: bool = False

    @classmethod
    def create(
        cls,
        mode: str,
        *,
        batch_size: int | None,
        topology: Topology,
        pipeline: InputPipelineConfig,
        use_tpu: bool,
    ) -> "DataLayout":
        """Validates `batch_size` for `mode` and returns the layout.

        Raises:
          ValueError: no batch size, or one not divisible by the replica count.
        """
        arg = _BATCH_ARG[mode]
        if batch_size is None and not use_tpu:
            # One device and no batch size: input_fn decides, params has no batch_size.
            return cls(mode, InputPipelineConfig.PER_HOST_V1, None, 1, 1)
        if batch_size is None:
            raise ValueError(
                message(
                    f"TPUEstimator.{'predict' if mode == ModeKeys.PREDICT else mode}() needs "
                    f"`{arg}`.",
                    f"{arg}=None",
                    f"Pass {arg}=<global batch size> to the TPUEstimator constructor.",
                )
            )
        if mode != ModeKeys.TRAIN or not use_tpu:
            pipeline = InputPipelineConfig.PER_HOST_V1
        replicated = pipeline is InputPipelineConfig.BROADCAST
        n = topology.num_replicas
        if not replicated and batch_size % n:
            raise ValueError(
                message(
                    f"`{arg}` must be divisible by the number of replicas.",
                    f"{arg}={batch_size} with {n} replicas",
                    f"Use a multiple of {n}, e.g. {arg}={max(n, batch_size // n * n)}.",
                )
            )
        if not replicated and batch_size % topology.num_hosts:
            raise ValueError(
                message(
                    f"`{arg}` must be divisible by the number of hosts.",
                    f"{arg}={batch_size} with {topology.num_hosts} hosts",
                )
            )
        return cls(mode, pipeline, batch_size, n, topology.num_hosts, replicated)

    @property
    def per_replica_batch_size(self) -> int:
        """What `model_fn` sees as `params['batch_size']`."""
        if self.replicated_input:
            return self.global_batch_size
        return self.global_batch_size // self.num_replicas

    @property
    def per_host_batch_size(self) -> int:
        """Examples one host feeds per step."""
        if self.replicated_input:
            return self.global_batch_size
        return self.global_batch_size // self.num_hosts

    @property
    def input_fn_calls_per_host(self) -> int:
        """How many input_fn pipelines one host runs (each pulled once per step)."""
        if self.pipeline is InputPipelineConfig.PER_SHARD_V1:
            return self.num_replicas // self.num_hosts
        return 1

    @property
    def input_fn_batch_size(self) -> int:
        """What `input_fn` sees as `params['batch_size']`."""
        if self.pipeline in (InputPipelineConfig.PER_SHARD_V1, InputPipelineConfig.PER_HOST_V2):
            return self.per_replica_batch_size
        return self.per_host_batch_size

    @property
    def batches_per_pull(self) -> int:
        """Batches taken from each input_fn pipeline per step (PER_HOST_V2 pulls one per replica)."""
        if self.pipeline is InputPipelineConfig.PER_HOST_V2:
            return self.num_replicas // self.num_hosts
        return 1
