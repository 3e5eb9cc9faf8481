"""`RunConfig` (the TPU variant) and `ClusterConfig` for several hosts."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from tpu_estimator.api.checks import (
    is_int,
    message,
    non_negative_number,
    optional_positive_int,
)
from tpu_estimator.api.keywords import suggest_keywords
from tpu_estimator.api.tf_config import CHIEF, ENV_TF_CONFIG, WORKER, TFConfig
from tpu_estimator.api.tpu_config import TPUConfig
from tpu_estimator.storage import check_timeout

_DEFAULT_CHECKPOINT_SECS = 600
_USE_DEFAULT = object()

ENV_COORDINATOR = "TPU_ESTIMATOR_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "TPU_ESTIMATOR_NUM_PROCESSES"
ENV_PROCESS_ID = "TPU_ESTIMATOR_PROCESS_ID"


@suggest_keywords
@dataclasses.dataclass(frozen=True)
class ClusterConfig:
    """Where the hosts of a multi-host job meet (`jax.distributed.initialize`).

    All three None means "let `jax.distributed` detect the cluster" (SLURM, TPU
    pods, Kubernetes); otherwise all three are required.

    Args:
      coordinator_address: `host:port` of process 0's coordinator service.
      num_processes: Number of processes (hosts) in the job.
      process_id: This process's index in `[0, num_processes)`.
      lost_host_timeout_s: Seconds after which a process that stopped (killed,
        crashed, its machine lost) ends the job: JAX's heartbeat timeout
        (`jax.distributed.initialize(heartbeat_timeout_seconds=)`). None: the
        `TPU_ESTIMATOR_LOST_HOST_TIMEOUT_S` environment variable, else 60 (JAX's
        own default is 100). A process killed outright is named at once in every
        survivor's log (`HostLostError`); see docs/cluster.md.
    """

    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    lost_host_timeout_s: float | None = None

    def __post_init__(self) -> None:
        if self.lost_host_timeout_s is not None and (
            isinstance(self.lost_host_timeout_s, bool)
            or not isinstance(self.lost_host_timeout_s, (int, float))
            or not self.lost_host_timeout_s >= 1
        ):
            raise ValueError(
                message(
                    "`lost_host_timeout_s` must be a number of seconds >= 1, or None.",
                    f"lost_host_timeout_s={self.lost_host_timeout_s!r}",
                )
            )
        given = [
            self.coordinator_address is not None,
            self.num_processes is not None,
            self.process_id is not None,
        ]
        if any(given) and not all(given):
            raise ValueError(
                message(
                    "ClusterConfig needs all of coordinator_address, num_processes and "
                    "process_id, or none of them (auto-detection).",
                    f"coordinator_address={self.coordinator_address!r}, "
                    f"num_processes={self.num_processes!r}, process_id={self.process_id!r}",
                )
            )
        if not any(given):
            return
        if not isinstance(self.coordinator_address, str) or ":" not in self.coordinator_address:
            raise ValueError(
                message(
                    "`coordinator_address` must be a 'host:port' string.",
                    f"coordinator_address={self.coordinator_address!r}",
                )
            )
        optional_positive_int(self.num_processes, "num_processes")
        if not is_int(self.process_id) or not 0 <= self.process_id < self.num_processes:
            raise ValueError(
                message(
                    "`process_id` must be an int in [0, num_processes).",
                    f"process_id={self.process_id!r}, num_processes={self.num_processes!r}",
                )
            )

    @property
    def is_explicit(self) -> bool:
        """True when the addresses were given rather than left to auto-detection."""
        return self.coordinator_address is not None

    @classmethod
    def from_environment(cls, environ: dict[str, str] | None = None) -> "ClusterConfig":
        """Reads TPU_ESTIMATOR_COORDINATOR_ADDRESS / _NUM_PROCESSES / _PROCESS_ID, else TF_CONFIG.

        From `TF_CONFIG`, the processes are the chief and the workers in that
        order (the coordinator is the chief's address, or worker 0's when there
        is no chief); a one-task cluster is one process. Neither set: auto-detection.

        Raises:
          ValueError: an incomplete TPU_ESTIMATOR_* set, an invalid TF_CONFIG,
            or a TF_CONFIG task that is not a chief or a worker.
        """
        env = os.environ if environ is None else environ
        if ENV_COORDINATOR not in env:
            return cls._from_tf_config(TFConfig.from_environment(env))
        try:
            num = int(env[ENV_NUM_PROCESSES])
            pid = int(env[ENV_PROCESS_ID])
        except (KeyError, ValueError) as e:
            raise ValueError(
                message(
                    f"With {ENV_COORDINATOR} set, {ENV_NUM_PROCESSES} and {ENV_PROCESS_ID} "
                    "must be set to integers.",
                    f"{ENV_NUM_PROCESSES}={env.get(ENV_NUM_PROCESSES)!r}, "
                    f"{ENV_PROCESS_ID}={env.get(ENV_PROCESS_ID)!r}",
                )
            ) from e
        return cls(env[ENV_COORDINATOR], num, pid)

    @classmethod
    def _from_tf_config(cls, tf: TFConfig) -> "ClusterConfig":
        if tf.task_type not in (CHIEF, WORKER):
            raise ValueError(
                message(
                    f"{ENV_TF_CONFIG}'s task must be a 'chief' or a 'worker': every process of a "
                    "JAX job trains (no parameter servers; evaluation runs on the training "
                    "processes, or in a separate single-process job).",
                    f"{ENV_TF_CONFIG} task type={tf.task_type!r}, index={tf.task_id}",
                    "Start this script only for the chief and worker tasks (evaluate there, e.g. "
                    "with train_and_evaluate, or in a process without TF_CONFIG).",
                )
            )
        tasks = tf.training_tasks
        if len(tasks) <= 1:
            return cls()
        return cls(tasks[0], len(tasks), tf.process_id)


@suggest_keywords
@dataclasses.dataclass(frozen=True, init=False)
class RunConfig:
    """Where and how an estimator runs: model directory, checkpoints, summaries.

    Args:
      model_dir: Directory for checkpoints and event files. None: the
        estimator's `model_dir` argument, or a temporary directory.
      tpu_config: A `TPUConfig`; None means `TPUConfig()`.
      tf_random_seed: Seed for initialisation and the dropout RNG streams;
        None means 0 (runs are always reproducible).
      save_summary_steps: Write summaries every this many steps.
      save_checkpoints_steps: Save a checkpoint every this many steps.
      save_checkpoints_secs: Save a checkpoint every this many seconds. If
        neither is given, 600 seconds. Giving both is an error. Both None:
        only at the start and end of `train()`.
      keep_checkpoint_max: Checkpoints to keep; 0 or None keeps all.
      keep_checkpoint_every_n_hours: Additionally keep one checkpoint per this
        many hours.
      log_step_count_steps: Log loss and steps/sec every this many steps.
      cluster: A `ClusterConfig` for several hosts; None reads the environment
        (`ClusterConfig.from_environment`: TPU_ESTIMATOR_*, else TF_CONFIG) when
        the estimator starts. `cluster_spec`, `task_type`, `task_id`,
        `is_chief` and `num_worker_replicas` report TF_CONFIG as TF's RunConfig
        did (read at construction).
      fall_back_to_intact_checkpoint: What to do when the newest checkpoint
        of `model_dir` is damaged (a file missing, truncated or changed since
        it was saved, an empty or half-copied step directory, an unreadable
        input position). False (the default): `train`, `evaluate`,
        `predict`, `export_saved_model` and `get_variable_value` raise an
        error naming the step directory, what is wrong, and the newest
        intact step. True: they use the newest intact checkpoint instead,
        with a warning naming the skipped ones (training saving at a skipped
        step moves the damaged directory aside to `<step>.damaged`); an
        unreadable input position makes the input start from its beginning,
        with a warning. An explicit `checkpoint_path=` is never replaced.
      storage_timeout_s: Seconds an object store (`gs://` model_dir) may stay
        away before a write fails: a checkpoint save, the wait for a background
        save, a summary flush then raises `CheckpointStorageError` naming the
        path, whichever meets the failure first (within this plus a tenth of it,
        at most 5 s more). A store that answers, even slowly or with errors the
        clients retry, never trips it. None: the environment variable
        `TPU_ESTIMATOR_STORAGE_TIMEOUT_S`, else 120. Set for the whole process
        by the estimator built with it (the object-store clients are per
        process). See docs/cluster.md "A store that stays away".

    Raises:
      ValueError, TypeError: on an invalid value, with the fix in the message.

    Example:
      >>> cfg = RunConfig(model_dir='/tmp/m', save_checkpoints_steps=100)
      >>> cfg.save_checkpoints_secs is None
      True
      >>> cfg.replace(save_checkpoints_secs=60).save_checkpoints_steps is None
      True
    """

    model_dir: str | None
    tpu_config: TPUConfig
    tf_random_seed: int | None
    save_summary_steps: int | None
    save_checkpoints_steps: int | None
    save_checkpoints_secs: int | float | None
    keep_checkpoint_max: int | None
    keep_checkpoint_every_n_hours: float
    log_step_count_steps: int | None
    cluster: ClusterConfig | None
    fall_back_to_intact_checkpoint: bool
    storage_timeout_s: float | None

    def __init__(
        self,
        model_dir: str | os.PathLike[str] | None = None,
        tpu_config: TPUConfig | None = None,
        tf_random_seed: int | None = None,
        save_summary_steps: int | None = 100,
        save_checkpoints_steps: int | None = None,
        save_checkpoints_secs: Any = _USE_DEFAULT,
        keep_checkpoint_max: int | None = 5,
        keep_checkpoint_every_n_hours: float = 10000,
        log_step_count_steps: int | None = 100,
        cluster: ClusterConfig | None = None,
        fall_back_to_intact_checkpoint: bool = False,
        storage_timeout_s: float | None = None,
    ) -> None:
        if save_checkpoints_secs is _USE_DEFAULT:
            save_checkpoints_secs = (
                None if save_checkpoints_steps is not None else _DEFAULT_CHECKPOINT_SECS
            )
        if save_checkpoints_steps is not None and save_checkpoints_secs is not None:
            raise ValueError(
                message(
                    "Give at most one of `save_checkpoints_steps` and `save_checkpoints_secs`.",
                    f"save_checkpoints_steps={save_checkpoints_steps!r}, "
                    f"save_checkpoints_secs={save_checkpoints_secs!r}",
                    "Set the other to None.",
                )
            )
        if model_dir is not None:
            if not isinstance(model_dir, (str, os.PathLike)):
                raise TypeError(
                    message("`model_dir` must be a path string or None.", f"model_dir={model_dir!r}")
                )
            model_dir = os.fspath(model_dir)
            if not model_dir:
                raise ValueError(
                    message("`model_dir` must not be empty.", "model_dir=''", "Pass None or a path.")
                )
        if tpu_config is None:
            tpu_config = TPUConfig()
        if not isinstance(tpu_config, TPUConfig):
            raise TypeError(
                message(
                    "`tpu_config` must be a tpu_estimator.TPUConfig.",
                    f"tpu_config={tpu_config!r}",
                )
            )
        if tf_random_seed is not None and not is_int(tf_random_seed):
            raise TypeError(
                message("`tf_random_seed` must be an int or None.", f"tf_random_seed={tf_random_seed!r}")
            )
        optional_positive_int(save_summary_steps, "save_summary_steps", fix="Use None to disable.")
        optional_positive_int(save_checkpoints_steps, "save_checkpoints_steps")
        if save_checkpoints_secs is not None:
            non_negative_number(save_checkpoints_secs, "save_checkpoints_secs")
        if keep_checkpoint_max is not None and (
            not is_int(keep_checkpoint_max) or keep_checkpoint_max < 0
        ):
            raise ValueError(
                message(
                    "`keep_checkpoint_max` must be an int >= 0 (0 or None keeps all).",
                    f"keep_checkpoint_max={keep_checkpoint_max!r}",
                )
            )
        non_negative_number(keep_checkpoint_every_n_hours, "keep_checkpoint_every_n_hours")
        optional_positive_int(log_step_count_steps, "log_step_count_steps", fix="Use None to disable.")
        if cluster is not None and not isinstance(cluster, ClusterConfig):
            raise TypeError(
                message("`cluster` must be a tpu_estimator.ClusterConfig or None.", f"cluster={cluster!r}")
            )
        if not isinstance(fall_back_to_intact_checkpoint, bool):
            raise TypeError(
                message(
                    "`fall_back_to_intact_checkpoint` must be True or False.",
                    f"fall_back_to_intact_checkpoint={fall_back_to_intact_checkpoint!r}",
                )
            )
        values = dict(
            model_dir=model_dir,
            tpu_config=tpu_config,
            tf_random_seed=tf_random_seed,
            save_summary_steps=save_summary_steps,
            save_checkpoints_steps=save_checkpoints_steps,
            save_checkpoints_secs=save_checkpoints_secs,
            keep_checkpoint_max=keep_checkpoint_max,
            keep_checkpoint_every_n_hours=keep_checkpoint_every_n_hours,
            log_step_count_steps=log_step_count_steps,
            cluster=cluster,
            fall_back_to_intact_checkpoint=fall_back_to_intact_checkpoint,
            storage_timeout_s=check_timeout(storage_timeout_s),
        )
        for name, value in values.items():
            object.__setattr__(self, name, value)
        # TF_CONFIG as TF's RunConfig read it, once at construction (not a field).
        object.__setattr__(self, "_tf_config", TFConfig.from_environment())

    @property
    def seed(self) -> int:
        """`tf_random_seed`, with None meaning 0."""
        return 0 if self.tf_random_seed is None else int(self.tf_random_seed)

    # --- TF_CONFIG, as TF's RunConfig reported it -----------------------------------

    @property
    def cluster_spec(self) -> dict[str, list[str]]:
        """TF_CONFIG's cluster: task type -> addresses; {} without TF_CONFIG (or for an evaluator)."""
        return {job: list(addresses) for job, addresses in self._tf_config.cluster.items()}

    @property
    def task_type(self) -> str:
        """TF_CONFIG's task type; 'worker' without TF_CONFIG."""
        return self._tf_config.task_type

    @property
    def task_id(self) -> int:
        """TF_CONFIG's task index; 0 without TF_CONFIG."""
        return self._tf_config.task_id

    @property
    def is_chief(self) -> bool:
        """TF_CONFIG's chief (worker 0 when it lists no chief); True without TF_CONFIG.

        TF_CONFIG only: in a job described otherwise, `jax.process_index() == 0`
        is the chief.
        """
        return self._tf_config.is_chief

    @property
    def num_worker_replicas(self) -> int:
        """TF_CONFIG's chief and workers; 1 without TF_CONFIG (0 for an evaluator)."""
        return self._tf_config.num_worker_replicas

    def replace(self, **changes: Any) -> "RunConfig":
        """A copy with `changes` applied and validated again.

        Setting one of `save_checkpoints_steps` / `save_checkpoints_secs` to a
        value clears the other, as the original did.
        """
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(
                message(
                    "RunConfig.replace() only takes RunConfig fields.",
                    f"{sorted(unknown)}",
                )
            )
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if changes.get("save_checkpoints_steps") is not None and "save_checkpoints_secs" not in changes:
            values["save_checkpoints_secs"] = None
        if changes.get("save_checkpoints_secs") is not None and "save_checkpoints_steps" not in changes:
            values["save_checkpoints_steps"] = None
        values.update(changes)
        return RunConfig(**values)
