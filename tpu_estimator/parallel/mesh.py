"""The device mesh: axes ("data", "model") over the devices an estimator uses."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from tpu_estimator.api.checks import message
from tpu_estimator.parallel.distributed import initialize_cluster

if TYPE_CHECKING:
    from tpu_estimator.api.run_config import ClusterConfig

DATA = "data"
MODEL = "model"


def estimator_devices(*, use_tpu: bool) -> list[jax.Device]:
    """The devices an estimator uses: all of the default backend's on every host (use_tpu),
    else one CPU device. With several hosts, join the cluster first (`initialize_cluster`)."""
    return list(jax.devices()) if use_tpu else jax.local_devices(backend="cpu")[:1]


@dataclasses.dataclass(frozen=True)
class Topology:
    """The devices of one estimator, arranged as a ("data", "model") mesh.

    `num_replicas` model replicas run data-parallel over "data"; each replica
    spans `cores_per_replica` devices over "model".
    """

    mesh: Mesh
    num_hosts: int
    host_id: int

    @classmethod
    def create(
        cls, *, use_tpu: bool, cores_per_replica: int = 1, split_model: bool = False, cluster: ClusterConfig | None = None
    ) -> "Topology":
        """All devices of the default backend on every host (use_tpu) or one CPU device.

        With use_tpu, joins the multi-host job first (`initialize_cluster`).
        `split_model` factors the "model" axis into size-2 axes ("model",
        "model_1", ...), so inputs can be partitioned over several dimensions
        (`input_partition_dims`); `model_axes` names them all.
        """
        if use_tpu:
            initialize_cluster(cluster)
        else:
            cores_per_replica = 1
        devices = estimator_devices(use_tpu=use_tpu)
        if len(devices) % cores_per_replica:
            raise ValueError(
                message(
                    "The device count must be a multiple of `num_cores_per_replica`.",
                    f"num_cores_per_replica={cores_per_replica} with {len(devices)} devices",
                    "Pick a num_cores_per_replica that divides the device count.",
                )
            )
        names: tuple[str, ...] = (MODEL,)
        sizes: tuple[int, ...] = (cores_per_replica,)
        if split_model and cores_per_replica > 1:
            n = cores_per_replica.bit_length() - 1  # cores_per_replica is a power of 2
            names = (MODEL, *(f"{MODEL}_{i}" for i in range(1, n)))
            sizes = (2,) * n
        grid = np.asarray(devices, dtype=object).reshape(-1, *sizes)
        return cls(
            mesh=Mesh(grid, (DATA, *names)),
            num_hosts=jax.process_count() if use_tpu else 1,
            host_id=jax.process_index() if use_tpu else 0,
        )

    @property
    def num_replicas(self) -> int:
        return self.mesh.shape[DATA]

    @property
    def cores_per_replica(self) -> int:
        return self.mesh.size // self.mesh.shape[DATA]

    @property
    def model_axes(self) -> tuple[str, ...]:
        """The mesh axes a replica spans ("model", or its size-2 factors)."""
        return tuple(a for a in self.mesh.axis_names if a != DATA)

    @property
    def model_axis(self) -> str | tuple[str, ...]:
        """The replica's axes as one PartitionSpec entry."""
        axes = self.model_axes
        return axes[0] if len(axes) == 1 else axes

    @property
    def num_devices(self) -> int:
        return self.mesh.size

    def replicated(self) -> NamedSharding:
        """Sharding of values every device holds whole (parameters, scalars)."""
        return NamedSharding(self.mesh, P())
