"""Joining a multi-host job: `jax.distributed.initialize` before any device use.

The cluster comes from `RunConfig(cluster=ClusterConfig(...))`, else the
`TPU_ESTIMATOR_*` environment or `TF_CONFIG` (`ClusterConfig.from_environment`),
else what `jax.distributed.initialize()` detects by itself (SLURM, Open MPI,
GKE TPU slices; `JAX_COORDINATOR_ADDRESS` with a Kubernetes Indexed Job). A
single process needs nothing. See docs/cluster.md.
"""

from __future__ import annotations

import logging
import math
import os
from typing import TYPE_CHECKING, Mapping

import jax

if TYPE_CHECKING:
    from tpu_estimator.api.run_config import ClusterConfig

log = logging.getLogger("tpu_estimator")

ENV_LOST_HOST_TIMEOUT = "TPU_ESTIMATOR_LOST_HOST_TIMEOUT_S"
DEFAULT_LOST_HOST_TIMEOUT_S = 60  # a stalled host's heartbeats: long past a GC pause or a network blip

# Environment that marks a job `jax.distributed.initialize()` can detect on its own.
_AUTO_ENV = ("JAX_COORDINATOR_ADDRESS", "SLURM_STEP_NODELIST", "OMPI_MCA_orte_hnp_uri", "TPU_WORKER_HOSTNAMES")


def is_initialized() -> bool:
    """True once this process has joined a multi-host job (`jax.distributed.initialize`)."""
    return jax.distributed.is_initialized()


def _auto_detectable(env: Mapping[str, str]) -> bool:
    if "SLURM_STEP_NODELIST" in env and int(env.get("SLURM_NTASKS", "1")) <= 1:
        return False
    if "TPU_WORKER_HOSTNAMES" in env and "," not in env["TPU_WORKER_HOSTNAMES"]:
        return False
    return any(k in env for k in _AUTO_ENV)


def lost_host_timeout_s(cluster: ClusterConfig | None = None, *, environ: Mapping[str, str] | None = None) -> int:
    """Seconds after which a silent process ends the job (JAX's heartbeat timeout): the
    cluster's `lost_host_timeout_s`, else TPU_ESTIMATOR_LOST_HOST_TIMEOUT_S, else 60."""
    value = getattr(cluster, "lost_host_timeout_s", None)
    if value is None:
        env = os.environ if environ is None else environ
        raw = env.get(ENV_LOST_HOST_TIMEOUT)
        if raw is None:
            return DEFAULT_LOST_HOST_TIMEOUT_S
        try:
            value = float(raw)
        except ValueError:
            value = float("nan")
        if not value >= 1:
            raise ValueError(
                f"{ENV_LOST_HOST_TIMEOUT} must be a number of seconds >= 1. "
                f"Received: {ENV_LOST_HOST_TIMEOUT}={raw!r}. Unset it for the default of "
                f"{DEFAULT_LOST_HOST_TIMEOUT_S}."
            )
    return max(1, math.ceil(value))


def initialize_cluster(cluster: ClusterConfig | None = None, *, environ: Mapping[str, str] | None = None) -> bool:
    """Joins the multi-host job once per process; True if this process is part of one.

    Call it (or create the estimator's devices, which calls it) before any
    other JAX device use. `cluster` is a `ClusterConfig` or None (environment).

    Example:
      >>> tpu_estimator.initialize_cluster(tpu_estimator.ClusterConfig(
      ...     '10.0.0.1:1234', num_processes=2, process_id=0))
    """
    from tpu_estimator.api.run_config import ClusterConfig

    if is_initialized():
        return True
    env = os.environ if environ is None else environ
    heartbeat = lost_host_timeout_s(cluster, environ=env)
    cluster = cluster if cluster is not None and cluster.is_explicit else ClusterConfig.from_environment(env)
    if cluster.is_explicit:
        log.info(
            "Joining %d processes at %s as process %d (a lost process ends the job after %d s).",
            cluster.num_processes, cluster.coordinator_address, cluster.process_id, heartbeat,
        )
        jax.distributed.initialize(
            coordinator_address=cluster.coordinator_address,
            num_processes=cluster.num_processes,
            process_id=cluster.process_id,
            heartbeat_timeout_seconds=heartbeat,
        )
        return True
    if _auto_detectable(env):
        log.info("Joining the cluster jax.distributed detects from the environment (a lost "
                 "process ends the job after %d s).", heartbeat)
        jax.distributed.initialize(heartbeat_timeout_seconds=heartbeat)
        return True
    return False
