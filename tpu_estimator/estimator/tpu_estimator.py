"""`TPUEstimator` and `Estimator`: the user's entry points."""

from __future__ import annotations

import functools
import logging
import os
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import numpy as np

from tpu_estimator.api.checks import message
from tpu_estimator.api.contracts import ArrayTree, BatchAxis, InputFn
from tpu_estimator.api.keywords import suggest_keywords
from tpu_estimator.api.mode_keys import ModeKeys
from tpu_estimator.api.run_config import RunConfig
from tpu_estimator.estimator.variables import list_variables, load_variable
from tpu_estimator.estimator import arguments, evaluation, prediction, training
from tpu_estimator.estimator.core import Core, ExportFlags
from tpu_estimator.model.call import check_model_fn
from tpu_estimator.parallel.distributed import initialize_cluster

if TYPE_CHECKING:
    from tpu_estimator.api.serving_input import ServingInputReceiver
    from tpu_estimator.api.session_run_hook import SessionRunHook
    from tpu_estimator.api.spec import ModelFn
    from tpu_estimator.checkpoint.warm_start import WarmStartSettings
    from tpu_estimator.hooks.listener import CheckpointSaverListener

log = logging.getLogger("tpu_estimator")


@suggest_keywords
class TPUEstimator:
    """Trains, evaluates, predicts and exports a `model_fn` on every device.

    `model_fn(features, labels, mode, params, config)` (only `features` is
    required; the others are passed when named) builds its layers inline
    with `flax.linen` and returns a `TPUEstimatorSpec`. `input_fn(params)`
    (optionally also `config`, `mode`, `input_context`) returns an iterable
    of batches: `features` or `(features, labels)`, arrays or dicts of arrays.

    Batch sizes are global. `params['batch_size']` is what each function
    sees: `model_fn` the per-replica batch; `input_fn` what its input
    pipeline mode reads per call: the per-host batch (PER_HOST_V1), the
    per-replica batch (PER_HOST_V2, PER_SHARD_V1) or the global batch
    (BROADCAST, SLICED), in every mode. With `use_tpu=False` the estimator
    runs on one CPU device and both see the global batch.
    `params['use_tpu']` tells model_fn whether this mode runs on the
    accelerator (False for EVAL with `eval_on_tpu=False`; for export, the
    platform being exported).

    Args:
      model_fn: The model function (see above).
      model_dir: Directory for checkpoints and summaries; must agree with
        `config.model_dir` if both are set; neither: a temporary directory.
      config: A `tpu_estimator.RunConfig` (required).
      params: Hyperparameters passed to `model_fn`/`input_fn`; the keys
        `batch_size` and `context` are reserved.
      use_tpu: True: all devices of JAX's default backend, data-parallel.
        False: one CPU device.
      train_batch_size: Global training batch size; required with `use_tpu`;
        must divide by the number of replicas.
      eval_batch_size: Global evaluation batch size.
      predict_batch_size: Global prediction batch size.
      batch_axis: `(features_axis, labels_axis)`: the axis of each input that
        holds the batch (ints, or dicts of ints per feature). Default 0.
      eval_on_tpu: False: evaluation may use a plain `EstimatorSpec` with
        `eval_metric_ops`.
      export_to_tpu: Export an accelerator (TPU/GPU) program too.
      export_to_cpu: Export a CPU program.
      warm_start_from: A checkpoint (directory or `<model_dir>/<step>`) or a
        `WarmStartSettings` to initialise from.
      embedding_config_spec: An `EmbeddingConfigSpec`: large embedding tables sharded by
        rows over every device; model_fn receives each embedding feature's
        looked-up activations in `features[name]` (see README "Large embeddings").
      export_saved_model_api_version: 1 or 2 (see `export_saved_model`).

    Raises:
      ValueError, TypeError: invalid arguments, with the fix in the message.

    Example:
      >>> est = TPUEstimator(model_fn, config=RunConfig(model_dir='/tmp/m'),
      ...                    train_batch_size=64, eval_batch_size=64)
      >>> est.train(train_input_fn, max_steps=100)
      >>> est.evaluate(eval_input_fn)
    """

    def __init__(
        self,
        model_fn: ModelFn,
        model_dir: str | None = None,
        config: RunConfig | None = None,
        params: dict[str, Any] | None = None,
        use_tpu: bool = True,
        train_batch_size: int | None = None,
        eval_batch_size: int | None = None,
        predict_batch_size: int | None = None,
        batch_axis: BatchAxis = None,
        eval_on_tpu: bool = True,
        export_to_tpu: bool = True,
        export_to_cpu: bool = True,
        warm_start_from: str | os.PathLike[str] | WarmStartSettings | None = None,
        embedding_config_spec: Any = None,
        export_saved_model_api_version: int = 1,
    ) -> None:
        config = arguments.check_config(config)
        params = arguments.check_params(params)
        arguments.check_batch_sizes(
            use_tpu,
            train_batch_size=train_batch_size,
            eval_batch_size=eval_batch_size,
            predict_batch_size=predict_batch_size,
        )
        arguments.check_export_options(export_saved_model_api_version, embedding_config_spec)
        model_fn_args = check_model_fn(model_fn)
        config = config.replace(model_dir=arguments.agree_model_dir(model_dir, config.model_dir))
        if use_tpu:  # several hosts: join before anything (Orbax included) touches devices
            initialize_cluster(config.cluster)
        arguments.check_num_shards(config.tpu_config, use_tpu=use_tpu)
        self._core = Core(
            model_fn,
            model_fn_args,
            config,
            params,
            use_tpu=use_tpu,
            eval_on_tpu=eval_on_tpu,
            batch_sizes={
                ModeKeys.TRAIN: train_batch_size,
                ModeKeys.EVAL: eval_batch_size,
                ModeKeys.PREDICT: predict_batch_size,
            },
            batch_axis=batch_axis,
            export=ExportFlags(bool(export_to_cpu), bool(export_to_tpu), int(export_saved_model_api_version)),
            warm_start_from=warm_start_from,
            embedding_config_spec=embedding_config_spec,
        )
        self._last_train: training.TrainResult | None = None

    # --- attributes ----------------------------------------------------------

    @property
    def config(self) -> RunConfig:
        return self._core.config

    @property
    def model_dir(self) -> str:
        return self._core.model_dir

    @property
    def params(self) -> dict[str, Any]:
        return dict(self._core.params)

    @property
    def model_fn(self) -> ModelFn:
        """The model_fn bound to `self.params` (when it takes `params`)."""
        if "params" in self._core.model_fn_args:
            return functools.partial(self._core.model_fn, params=self.params)
        return self._core.model_fn

    @property
    def loop_strategy(self) -> str:
        """How training loops run now: "scan" or "step" (see `TPUConfig.loop_strategy`)."""
        return self._core.loop_strategy.current

    @property
    def inference_loop_strategy(self) -> str:
        """How evaluate() and predict() loops run: "scan" or "step" ("auto" before the
        first call); differs from `loop_strategy` where "auto" steps training only (XLA:CPU,
        convolutions and several devices, see `TPUConfig.loop_strategy`)."""
        return self._core.loop_strategy.inference

    @property
    def preempted(self) -> bool:
        """True if the last `train()` call stopped early on a preemption notice (SIGTERM).

        That call saved the step it reached (with the input position) and
        returned normally. A job script should then exit non-zero so that its
        scheduler runs it again; the next `train()` resumes from that step.

        Example:
          >>> est.train(input_fn, max_steps=10_000)
          >>> if est.preempted:
          ...     sys.exit(143)  # 128 + SIGTERM: "killed", reschedule me
        """
        return self._last_train is not None and self._last_train.preempted

    @property
    def num_replicas(self) -> int:
        """How many model replicas run data-parallel (devices / cores_per_replica)."""
        return self._core.topology.num_replicas

    def eval_dir(self, name: str | None = None) -> str:
        """`model_dir/eval` or `model_dir/eval_<name>`: where evaluation summaries go."""
        return evaluation.eval_dir(self.model_dir, name)

    def latest_checkpoint(self) -> str | None:
        """Path of the newest intact checkpoint in `model_dir` (`<model_dir>/<step>`), or None.

        Raises:
          DamagedCheckpointError: the newest checkpoint is damaged (with
            `RunConfig(fall_back_to_intact_checkpoint=True)`: only when none is intact; the
            newest intact one is named, with a warning).
        """
        return self._core.latest_checkpoint()

    def get_variable_names(self) -> list[str]:
        """Names of the saved variables: `Dense_0/kernel`, `batch_stats/...`, `global_step`,
        `embedding/<table>` (whole tables) and `embedding/<table>/<slot>`."""
        return [name for name, _ in list_variables(self._core.newest_checkpoint().path)]

    def get_variable_value(self, name: str) -> np.ndarray:
        """The saved value of variable `name` (see `get_variable_names`); reads only it."""
        path = self._core.newest_checkpoint().path
        names = [n for n, _ in list_variables(path)]
        if name not in names:
            raise ValueError(
                message(
                    "Unknown variable name.",
                    f"name={name!r}",
                    f"Use one of get_variable_names(): {names[:20]}",
                )
            )
        return load_variable(path, name)

    # --- modes ---------------------------------------------------------------

    def train(
        self,
        input_fn: InputFn,
        hooks: Sequence[SessionRunHook] | None = None,
        steps: int | None = None,
        max_steps: int | None = None,
        saving_listeners: Sequence[CheckpointSaverListener] | None = None,
    ) -> "TPUEstimator":
        """Trains the model on `input_fn`'s batches.

        Preemption: a SIGTERM (what TPU maintenance, spot VMs, `kubectl delete`
        and SLURM send before they stop a job) ends training at the next loop
        boundary: that step is saved with the input position, hooks' and
        listeners' `end` run, and train() returns normally with
        `self.preempted` True (on several hosts, every host stops at the same
        step through JAX's preemption service). Exit non-zero then, so the
        job is rescheduled; the next train() resumes bit-identically.

        Args:
          input_fn: Returns an iterable of `features` or `(features, labels)`.
          hooks: `SessionRunHook`s, called at loop boundaries.
          steps: Steps to train beyond the current global step.
          max_steps: Global step to train to (returns at once if reached).
            Neither: until the input ends.
          saving_listeners: `CheckpointSaverListener`s, called around saves.

        Returns:
          self (see `preempted`).

        Raises:
          ValueError: both steps and max_steps, or a value <= 0.
          CheckpointStorageError (an OSError): model_dir is not a writable
            directory (checked before training), or a checkpoint save failed.
        """
        self._last_train = None
        self._last_train = training.train(
            self._core, input_fn, hooks=hooks, steps=steps, max_steps=max_steps,
            saving_listeners=saving_listeners,
        )
        return self

    def evaluate(
        self,
        input_fn: InputFn,
        steps: int | None = None,
        hooks: Sequence[SessionRunHook] | None = None,
        checkpoint_path: str | None = None,
        name: str | None = None,
    ) -> dict[str, Any]:
        """Evaluates the model on every example of `input_fn` (or `steps` batches).

        A final short batch is padded and masked: each real example counts once.

        Returns:
          The metrics of `eval_metrics`/`eval_metric_ops`, plus `loss` (mean
          over examples) and `global_step`.

        Raises:
          ValueError: steps <= 0, or a metric named `loss` or `global_step`.
          PreemptedError: a SIGTERM came before the last batch; raised at the
            next loop boundary (on every process, the same one) with no
            metrics recorded. Exit; the new job evaluates again.
        """
        return evaluation.evaluate(
            self._core, input_fn, steps=steps, hooks=hooks, checkpoint_path=checkpoint_path, name=name
        )

    def predict(
        self,
        input_fn: InputFn,
        predict_keys: Sequence[str] | None = None,
        hooks: Sequence[SessionRunHook] | None = None,
        checkpoint_path: str | None = None,
        yield_single_examples: bool = True,
    ) -> Iterator[ArrayTree]:
        """Yields predictions, one per input example (or one per batch).

        A final short batch is padded and its padding dropped.

        Raises:
          ValueError: unknown `predict_keys`, or predictions of differing
            batch sizes with `yield_single_examples`.
          PreemptedError: from `next()`, when a SIGTERM came while the
            generator was open (at the next loop boundary, on every process
            the same one); that loop's predictions are not handed out.
        """
        return prediction.predict(
            self._core, input_fn, predict_keys=predict_keys, hooks=hooks,
            checkpoint_path=checkpoint_path, yield_single_examples=yield_single_examples,
        )

    # --- export --------------------------------------------------------------

    def export_saved_model(
        self,
        export_dir_base: str | os.PathLike[str],
        serving_input_receiver_fn: Callable[[], ServingInputReceiver],
        assets_extra: dict[str, str] | None = None,
        as_text: bool = False,
        checkpoint_path: str | None = None,
        experimental_mode: str = ModeKeys.PREDICT,
    ) -> bytes:
        """Exports the model as `jax.export` artifacts under `export_dir_base/<timestamp>`.

        Calls `serving_input_receiver_fn()` for the input specs (a batch
        dimension of None is exported symbolically: any batch size), calls
        `model_fn` in `experimental_mode` with `params['use_tpu']` telling the
        platform being exported (and no `params['batch_size']`), restores the
        checkpoint and writes, atomically: `manifest.json`, one serialized
        function per signature and tag set, the weights in safetensors and
        `assets.extra/`. PREDICT gives one signature per `export_outputs` entry
        (`serving_default` always), under the tags `serve` (CPU, with
        `export_to_cpu`) and `serve,tpu` (CUDA and TPU, with `export_to_tpu`).
        Load the result with `tpu_estimator.load_exported` or serve it with
        `tpu-estimator serve`.

        Args:
          export_dir_base: Directory in which to create the timestamped export.
          serving_input_receiver_fn: No-argument function returning a
            `ServingInputReceiver` (a `SupervisedInputReceiver` for TRAIN/EVAL).
          assets_extra: `{destination relative to assets.extra: source file}`.
          as_text: Also write each lowered module as text (`.mlir`).
          checkpoint_path: Checkpoint to export; None: the latest one.
          experimental_mode: The mode to export (`ModeKeys.PREDICT` by default).

        Returns:
          The export directory as bytes.

        Raises:
          ValueError: no `serving_input_receiver_fn`, no `export_outputs`, no
            checkpoint (`Couldn't find trained model at ...`), or neither
            `export_to_cpu` nor `export_to_tpu`.

        Example:
          >>> fn = tpu_estimator.build_raw_serving_input_receiver_fn(
          ...     {'x': tpu_estimator.TensorSpec((None, 4), 'float32')})
          >>> path = est.export_saved_model('/tmp/export', fn)
          >>> model = tpu_estimator.load_exported(path)
        """
        from tpu_estimator.export import exporter

        return exporter.export_all(
            self._core, export_dir_base, {experimental_mode: serving_input_receiver_fn},
            assets_extra=assets_extra, as_text=as_text, checkpoint_path=checkpoint_path,
        )

    def export_savedmodel(
        self,
        export_dir_base: str | os.PathLike[str],
        serving_input_receiver_fn: Callable[[], ServingInputReceiver],
        assets_extra: dict[str, str] | None = None,
        as_text: bool = False,
        checkpoint_path: str | None = None,
        strip_default_attrs: bool = False,
    ) -> bytes:
        """Deprecated alias of `export_saved_model` (PREDICT mode); warns with a FutureWarning.

        Args:
          export_dir_base, serving_input_receiver_fn, assets_extra, as_text,
          checkpoint_path: As in `export_saved_model`.
          strip_default_attrs: Ignored (there are no graph node attributes).

        Returns:
          The export directory as bytes.

        Raises:
          ValueError: as `export_saved_model`.

        Example:
          >>> est.export_savedmodel('/tmp/export', fn)  # use export_saved_model
        """
        import warnings

        warnings.warn(
            "export_savedmodel is deprecated; use export_saved_model (same arguments, "
            "without strip_default_attrs).",
            FutureWarning,
            stacklevel=2,
        )
        return self.export_saved_model(
            export_dir_base, serving_input_receiver_fn, assets_extra=assets_extra,
            as_text=as_text, checkpoint_path=checkpoint_path,
        )

    def experimental_export_all_saved_models(
        self,
        export_dir_base: str | os.PathLike[str],
        input_receiver_fn_map: dict[str, Callable[[], ServingInputReceiver]],
        assets_extra: dict[str, str] | None = None,
        as_text: bool = False,
        checkpoint_path: str | None = None,
    ) -> bytes:
        """Exports TRAIN, EVAL and/or PREDICT in one directory, with one set of weights.

        PREDICT is exported as in `export_saved_model`. EVAL gives the tag set
        `eval` with the signature `eval` (outputs `loss`,
        `metrics/<name>/value` for one batch, `predictions/<key>`); TRAIN the
        tag set `train` with the signature `train` (outputs `loss` and
        predictions; it does not update the weights). TRAIN and EVAL are
        exported for CPU only and take their labels from a
        `SupervisedInputReceiver`.

        Args:
          export_dir_base: Directory in which to create the timestamped export.
          input_receiver_fn_map: `{ModeKeys.X: receiver_fn}`.
          assets_extra: As in `export_saved_model`.
          as_text: As in `export_saved_model`.
          checkpoint_path: Checkpoint to export; None: the latest one.

        Returns:
          The export directory as bytes.

        Raises:
          ValueError: a receiver function is None, no `export_outputs`, or no
            checkpoint.

        Example:
          >>> est.experimental_export_all_saved_models(
          ...     '/tmp/export', {ModeKeys.EVAL: eval_receiver_fn, ModeKeys.PREDICT: fn})
        """
        from tpu_estimator.export import exporter

        return exporter.export_all(
            self._core, export_dir_base, input_receiver_fn_map,
            assets_extra=assets_extra, as_text=as_text, checkpoint_path=checkpoint_path,
        )


@suggest_keywords
class Estimator(TPUEstimator):
    """The same engine on one CPU device, with no batch splitting.

    `params` carries no `batch_size`: `input_fn` chooses the batch size.
    Evaluation accepts a plain `EstimatorSpec` with `eval_metric_ops`.
    """

    def __init__(
        self,
        model_fn: ModelFn,
        model_dir: str | None = None,
        config: RunConfig | None = None,
        params: dict[str, Any] | None = None,
        warm_start_from: str | os.PathLike[str] | WarmStartSettings | None = None,
    ) -> None:
        super().__init__(
            model_fn,
            model_dir=model_dir,
            config=config if config is not None else RunConfig(),
            params=params,
            use_tpu=False,
            eval_on_tpu=False,
            warm_start_from=warm_start_from,
        )
