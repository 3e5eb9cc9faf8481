"""`TPUConfig` and `InputPipelineConfig`: how steps are looped and input is fed."""

from __future__ import annotations

import dataclasses
import enum
import re
from typing import Any, Literal, NamedTuple, Sequence

from tpu_estimator.api import step_options
from tpu_estimator.api.checks import is_int, message, optional_positive_int, positive_int
from tpu_estimator.api.keywords import suggest_keywords


class InputPipelineConfig(enum.IntEnum):
    """How `input_fn` is called and its batches reach the replicas (TF's `tpu.InputPipelineConfig`).

    * `PER_SHARD_V1`: `input_fn` once per replica, with the per-replica batch
      (TRAIN only). `per_host_input_for_training=False` means this.
    * `PER_HOST_V1`: `input_fn` once per host, with the per-host batch
      (global batch / number of hosts). `per_host_input_for_training=True`
      means this; it is the default.
    * `PER_HOST_V2`: `input_fn` once per host with the per-replica batch; the
      host pulls one batch per local replica per step.
    * `BROADCAST`: `input_fn` only on host 0 with the whole global batch; every
      replica receives the same batch.
    * `SLICED`: (for `eval_training_input_configuration`) `input_fn` only on
      host 0; each replica receives a slice of the batch.
    """

    PER_SHARD_V1 = 1
    PER_HOST_V1 = 2
    PER_HOST_V2 = 3
    BROADCAST = 4
    SLICED = 5


_LOOP_RE = re.compile(r"^(?P<value>[1-9]\d*)(?P<suffix>[smh]?)$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600}
_VALID_CORES = (1, 2, 4, 8, 16, 32, 64, 128)


class IterationsPerLoop(NamedTuple):
    """`iterations_per_loop` parsed: a step count, or a duration in seconds."""

    value: int
    unit: Literal["count", "seconds"]


def parse_iterations_per_loop(value: Any) -> IterationsPerLoop:
    """Parses a positive int or a `'<N>s'`, `'<N>m'`, `'<N>h'` time string.

    >>> parse_iterations_per_loop('2m')
    IterationsPerLoop(value=120, unit='seconds')
    """
    if isinstance(value, bool) or not (is_int(value) or isinstance(value, str)):
        raise TypeError(
            message(
                "`iterations_per_loop` must be a positive int or a time string "
                "like '30s', '5m' or '1h'.",
                f"iterations_per_loop={value!r}",
            )
        )
    m = _LOOP_RE.match(str(value))
    if m is None:
        raise ValueError(
            message(
                "`iterations_per_loop` must be a positive int (steps) or a time string "
                "'<N>s', '<N>m' or '<N>h' with N a positive integer without leading zeros.",
                f"iterations_per_loop={value!r}",
                "Use e.g. iterations_per_loop=100 or iterations_per_loop='30s'.",
            )
        )
    suffix = m.group("suffix")
    if not suffix:
        return IterationsPerLoop(int(m.group("value")), "count")
    return IterationsPerLoop(int(m.group("value")) * _UNIT_SECONDS[suffix], "seconds")


def as_input_pipeline_config(value: Any, name: str) -> InputPipelineConfig:
    """Maps True/False and the enum (or its int value) to an `InputPipelineConfig`."""
    if value is True:
        return InputPipelineConfig.PER_HOST_V1
    if value is False:
        return InputPipelineConfig.PER_SHARD_V1
    if isinstance(value, InputPipelineConfig):
        return value
    if is_int(value) and int(value) in {m.value for m in InputPipelineConfig}:
        return InputPipelineConfig(int(value))
    raise ValueError(
        message(
            f"`{name}` must be True, False or an InputPipelineConfig "
            "(PER_SHARD_V1, PER_HOST_V1, PER_HOST_V2, BROADCAST).",
            f"{name}={value!r}",
        )
    )


@suggest_keywords
@dataclasses.dataclass(frozen=True)
class TPUConfig:
    """TPU-related configuration of `TPUEstimator` (seed `TPUConfig`).

    Args:
      iterations_per_loop: Steps run on the device in one compiled program
        before returning to the host, or a time string (`'30s'`, `'5m'`,
        `'1h'`): the estimator then adapts the step count to the measured step
        time. Evaluation does not use it.
      num_shards: The number of model replicas, or None (default): every
        device is used (devices / `num_cores_per_replica` replicas). When set,
        `TPUEstimator` checks it against the devices it finds and raises a
        ValueError if they disagree, as the original did; ignored with
        `use_tpu=False` (one CPU device).
      num_cores_per_replica: Cores per model replica (model parallelism);
        1, 2, 4, ..., 128, or None (= 1).
      per_host_input_for_training: True (PER_HOST_V1), False (PER_SHARD_V1)
        or an `InputPipelineConfig`.
      tpu_job_name: Kept for compatibility; unused.
      initial_infeed_sleep_secs: Seconds to wait before feeding the first batch.
      input_partition_dims: Spatial partitioning of inputs: one (features)
        or two (features, labels) elements. Needs PER_HOST_V2 and
        `num_cores_per_replica`.
      eval_training_input_configuration: PER_HOST_V1 or SLICED.
      experimental_host_call_every_n_steps: Run `host_call` every n steps
        within a loop.
      loop_strategy: (Not in the original.) How a loop of steps runs: "scan"
        (one compiled program of `iterations_per_loop` steps), "step" (one
        program per step, dispatched by the host), or "auto": decided once,
        before the first loop, from the model: "step" at
        `iterations_per_loop=1` and on XLA:CPU for models with convolutions
        (XLA:CPU runs their gradients far slower inside `lax.scan`), else
        "scan"; evaluate() and predict() loops (no gradients) "scan" unless
        `iterations_per_loop=1`, or a model with convolutions on one XLA:CPU
        device ("step"). The choice is logged and training's is
        readable as `TPUEstimator.loop_strategy`. "scan" or "step" applies
        to every mode.
      partition_rules: (Not in the original.) With `num_cores_per_replica`:
        `(regex, PartitionSpec)` pairs; a parameter whose path (e.g.
        `Dense_0/kernel`) matches a regex (`re.search`, first match wins) is
        sharded over the replica's cores as the spec says (entries "model" or
        None). Unmatched parameters follow their layer's
        `nn.with_partitioning` metadata, else the default: matrices of at least
        4096 elements split on their largest divisible dimension.
      logical_axis_rules: (Not in the original.) `(logical name, "model" or
        None)` pairs mapping `nn.with_logical_partitioning` names to the mesh.
      moving_average_decay: (Not in the original, where models built a
        `tf.train.ExponentialMovingAverage` themselves.) A float in [0, 1], or
        None (default: off). After each training step every parameter's average
        becomes `decay * average + (1 - decay) * parameter`, starting from the
        initial (or warm-started) parameters. Training uses the raw parameters;
        evaluate(), predict() and export_saved_model() use the averages. They
        are checkpointed, and read as `moving_average/<variable name>`.
      parameter_sharding: (Not in the original.) "replicated" (default): every
        data-parallel replica holds the whole parameters and optimizer state.
        "fsdp" (ZeRO-3): every parameter and optimizer slot of at least 4,096
        elements is split on a dimension that the device count divides, so
        each device holds ~1/N of it (over the "data" and "model" axes
        together); each training step gathers the parameters where it uses
        them and reduce-scatters the gradients, and the optimizer updates the
        shards. Results equal the replicated run's (within float rounding);
        checkpoints restore between the two settings and device counts.
        A no-op on one device. The optimizer must be elementwise (Adam, SGD,
        ...): transformations that reduce over a parameter (global-norm
        clipping, LAMB, Adafactor) are refused.
      gradient_accumulation_steps: (Not in the original.) k >= 1 (default 1).
        Each replica's batch of a training step is split into k micro-batches
        inside the compiled step; their gradients are summed in float32 and
        averaged before one optimizer update (`global_step` counts updates).
        `input_fn` sees the same `params['batch_size']` as without it;
        `model_fn` is called on micro-batches and its `params['batch_size']`
        is the micro-batch size (per-replica batch / k). The reported loss is
        the mean over the micro-batches; mutable collections (`batch_stats`)
        are updated micro-batch after micro-batch, as k small steps would;
        `host_call` tensors are concatenated over the micro-batches. A
        per-replica batch that k does not divide is a ValueError.
      precision_policy: (Not in the original, where models used
        `tf.tpu.bfloat16_scope`.) "float32" (default), "mixed_bfloat16" or
        "mixed_float16" (Keras' names): model_fn's layers see the parameters
        and the floating features in the low precision, while parameters,
        optimizer state, checkpoints, the loss, predictions and metric tensors
        stay float32. "mixed_float16" scales the loss dynamically (Keras'
        LossScaleOptimizer: 2**15 at first, doubled after 2000 finite steps,
        halved with the update skipped when a gradient is not finite; a
        skipped step still counts in `global_step`); its state is
        checkpointed as `loss_scale/scale` and `loss_scale/good_steps`. The
        same policy in evaluate(), predict() and export_saved_model().
      remat_policy: (Not in the original.) None (default), "full" or the name
        of a `jax.checkpoint_policies` policy (e.g.
        "dots_with_no_batch_dims_saveable"): model_fn's forward pass in
        training is rematerialized as one block (`jax.checkpoint`): values the
        policy does not save are recomputed in the backward pass. Results are
        unchanged; what it saves depends on the policy and the compiler (none
        measured on XLA:CPU; README "Large models"); per-layer savings need
        `nn.remat` around the layers in model_fn.

    Raises:
      ValueError, TypeError: on an invalid value, with the fix in the message.

    Example:
      >>> TPUConfig(iterations_per_loop='30s').iterations_per_loop_parsed
      IterationsPerLoop(value=30, unit='seconds')
    """

    iterations_per_loop: int | str = 2
    num_shards: int | None = None
    num_cores_per_replica: int | None = None
    per_host_input_for_training: bool | InputPipelineConfig = True
    tpu_job_name: str | None = None
    initial_infeed_sleep_secs: int | None = None
    input_partition_dims: Sequence[Any] | None = None
    eval_training_input_configuration: InputPipelineConfig = InputPipelineConfig.PER_HOST_V1
    experimental_host_call_every_n_steps: int = 1
    loop_strategy: Literal["auto", "scan", "step"] = "auto"
    partition_rules: Sequence[tuple[str, Any]] | None = None
    logical_axis_rules: Sequence[tuple[str, str | None]] | None = None
    moving_average_decay: float | None = None
    parameter_sharding: Literal["replicated", "fsdp"] = "replicated"
    gradient_accumulation_steps: int = 1
    precision_policy: Literal["float32", "mixed_bfloat16", "mixed_float16"] = "float32"
    remat_policy: str | None = None

    def __post_init__(self) -> None:
        parse_iterations_per_loop(self.iterations_per_loop)
        optional_positive_int(self.num_shards, "num_shards")  # vs the devices: TPUEstimator()
        if self.num_cores_per_replica is not None and (
            not is_int(self.num_cores_per_replica)
            or self.num_cores_per_replica not in _VALID_CORES
        ):
            raise ValueError(
                message(
                    "`num_cores_per_replica` must be one of 1, 2, 4, 8, 16, 32, 64, 128, or None.",
                    f"num_cores_per_replica={self.num_cores_per_replica!r}",
                )
            )
        pipeline = as_input_pipeline_config(
            self.per_host_input_for_training, "per_host_input_for_training"
        )
        if pipeline is InputPipelineConfig.SLICED:
            raise ValueError(
                message(
                    "`per_host_input_for_training` cannot be SLICED; SLICED is only for "
                    "`eval_training_input_configuration`.",
                    "per_host_input_for_training=InputPipelineConfig.SLICED",
                )
            )
        if self.tpu_job_name is not None and not isinstance(self.tpu_job_name, str):
            raise TypeError(
                message("`tpu_job_name` must be a str or None.", f"tpu_job_name={self.tpu_job_name!r}")
            )
        optional_positive_int(self.initial_infeed_sleep_secs, "initial_infeed_sleep_secs")
        self._check_partition_dims(pipeline)
        self._check_partition_rules()
        eval_cfg = self.eval_training_input_configuration
        if not (isinstance(eval_cfg, InputPipelineConfig) or is_int(eval_cfg)) or eval_cfg not in (
            InputPipelineConfig.PER_HOST_V1,
            InputPipelineConfig.SLICED,
        ):
            raise ValueError(
                message(
                    "`eval_training_input_configuration` must be InputPipelineConfig.PER_HOST_V1 "
                    "or InputPipelineConfig.SLICED.",
                    f"eval_training_input_configuration={self.eval_training_input_configuration!r}",
                )
            )
        positive_int(
            self.experimental_host_call_every_n_steps, "experimental_host_call_every_n_steps"
        )
        self._check_moving_average_decay()
        self._check_parameter_sharding()
        step_options.check_gradient_accumulation_steps(self.gradient_accumulation_steps)
        step_options.check_precision_policy(self.precision_policy)
        step_options.check_remat_policy(self.remat_policy)
        if not isinstance(self.loop_strategy, str) or self.loop_strategy not in (
            "auto",
            "scan",
            "step",
        ):
            raise ValueError(
                message(
                    "`loop_strategy` must be 'auto', 'scan' or 'step'.",
                    f"loop_strategy={self.loop_strategy!r}",
                )
            )

    def _check_moving_average_decay(self) -> None:
        decay = self.moving_average_decay
        if decay is None:
            return
        if isinstance(decay, bool) or not isinstance(decay, (int, float)):
            raise TypeError(
                message("`moving_average_decay` must be a float in [0, 1] or None.",
                        f"moving_average_decay={decay!r}")
            )
        if not 0.0 <= float(decay) <= 1.0:
            raise ValueError(
                message(
                    "`moving_average_decay` must be in [0, 1].",
                    f"moving_average_decay={decay!r}",
                    "Use e.g. moving_average_decay=0.9999 (TF TPU models' usual value), or None.",
                )
            )

    def _check_parameter_sharding(self) -> None:
        if not isinstance(self.parameter_sharding, str) or self.parameter_sharding not in (
            "replicated",
            "fsdp",
        ):
            raise ValueError(
                message(
                    "`parameter_sharding` must be 'replicated' or 'fsdp'.",
                    f"parameter_sharding={self.parameter_sharding!r}",
                    "Use parameter_sharding='fsdp' to shard parameters and optimizer state over "
                    "the devices, or leave the default 'replicated'.",
                )
            )

    def _check_partition_rules(self) -> None:
        for field in ("partition_rules", "logical_axis_rules"):
            rules = getattr(self, field)
            if rules is None:
                continue
            ok = not isinstance(rules, (str, bytes)) and isinstance(rules, Sequence)
            for rule in rules if ok else ():
                if not (isinstance(rule, (tuple, list)) and len(rule) == 2 and isinstance(rule[0], str)):
                    ok = False
                elif field == "partition_rules":
                    try:
                        re.compile(rule[0])
                    except re.error:
                        ok = False
                    spec = rule[1]
                    ok = ok and (
                        spec is None
                        or isinstance(spec, (tuple, list))
                        or type(spec).__name__ in ("P", "PartitionSpec")
                    )
                else:
                    ok = ok and (rule[1] is None or isinstance(rule[1], str))
            if not ok:
                example = (
                    "[('Dense_0/kernel', PartitionSpec(None, 'model'))]"
                    if field == "partition_rules"
                    else "[('mlp', 'model'), ('embed', None)]"
                )
                raise ValueError(
                    message(
                        f"`{field}` must be a list of (name, value) pairs, e.g. {example}.",
                        f"{field}={rules!r}",
                    )
                )

    def _check_partition_dims(self, pipeline: InputPipelineConfig) -> None:
        dims = self.input_partition_dims
        if dims is None:
            return
        if isinstance(dims, (str, bytes)) or not isinstance(dims, Sequence) or len(dims) not in (1, 2):
            raise ValueError(
                message(
                    "`input_partition_dims` must be a list/tuple with one (features) or two "
                    "(features, labels) elements.",
                    f"input_partition_dims={dims!r}",
                )
            )
        if pipeline is not InputPipelineConfig.PER_HOST_V2:
            raise ValueError(
                message(
                    "`input_partition_dims` is only supported with the PER_HOST_V2 input mode.",
                    f"per_host_input_for_training={self.per_host_input_for_training!r}",
                    "Set per_host_input_for_training=InputPipelineConfig.PER_HOST_V2.",
                )
            )
        if self.num_cores_per_replica is None:
            raise ValueError(
                message(
                    "`input_partition_dims` requires `num_cores_per_replica`.",
                    "num_cores_per_replica=None",
                    "Set num_cores_per_replica to the product of the partition dims.",
                )
            )

    @property
    def iterations_per_loop_parsed(self) -> IterationsPerLoop:
        """`iterations_per_loop` as (value, unit); unit is 'count' or 'seconds'."""
        return parse_iterations_per_loop(self.iterations_per_loop)

    @property
    def input_pipeline_config(self) -> InputPipelineConfig:
        """`per_host_input_for_training` as an `InputPipelineConfig`."""
        return as_input_pipeline_config(
            self.per_host_input_for_training, "per_host_input_for_training"
        )

    @property
    def cores_per_replica(self) -> int:
        """`num_cores_per_replica`, with None meaning 1."""
        return self.num_cores_per_replica or 1

    def replace(self, **changes: Any) -> "TPUConfig":
        """A copy with `changes` applied, validated again."""
        return dataclasses.replace(self, **changes)
