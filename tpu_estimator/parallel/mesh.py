"""The device mesh: axes ("data", "model") over the devices an estimator uses."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from tpu_estimator.api._checks import message

DATA = "data"
MODEL = "model"


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
    def create(cls, *, use_tpu: bool, cores_per_replica: int = 1) -> "Topology":
        """All devices of the default backend (use_tpu) or one CPU device."""
        if use_tpu:
            devices = jax.devices()
        else:
            devices = jax.local_devices(backend="cpu")[:1]
            cores_per_replica = 1
        if len(devices) % cores_per_replica:
            raise ValueError(
                message(
                    "The device count must be a multiple of `num_cores_per_replica`.",
                    f"num_cores_per_replica={cores_per_replica} with {len(devices)} devices",
                    "Pick a num_cores_per_replica that divides the device count.",
                )
            )
        grid = np.asarray(devices, dtype=object).reshape(-1, cores_per_replica)
        return cls(
            mesh=Mesh(grid, (DATA, MODEL)),
            num_hosts=jax.process_count() if use_tpu else 1,
            host_id=jax.process_index() if use_tpu else 0,
        )

    @property
    def num_replicas(self) -> int:
        return self.mesh.shape[DATA]

    @property
    def cores_per_replica(self) -> int:
        return self.mesh.shape[MODEL]

    @property
    def num_devices(self) -> int:
        return self.mesh.size

    def replicated(self) -> NamedSharding:
        """Sharding of values every device holds whole (parameters, scalars)."""
        return NamedSharding(self.mesh, P())

    def batch_sharded(self, ndim: int, batch_axis: int = 0, leading: int = 0) -> NamedSharding:
        """Sharding of an array whose `batch_axis` (after `leading` stacked axes) splits on "data"."""
        spec = [None] * ndim
        spec[leading + batch_axis] = DATA
        return NamedSharding(self.mesh, P(*spec))
