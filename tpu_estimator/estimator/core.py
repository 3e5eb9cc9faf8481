"""`Core`: what the drivers (train, evaluate, predict, export) and hooks work on.

`TPUEstimator` checks the user's arguments, builds one Core and delegates to
the drivers with it. The Core owns the topology, the loop strategy, the
checkpointer, one `Runtime` per mode, input opening, the bound model_fn,
warm start and the export flags, behind public methods. Hooks and
checkpoint listeners receive it as their `session` (there is no
`tf.Session`): `model_dir`, `config`, `params`, `global_step`,
`latest_checkpoint()` are what they read.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from types import MappingProxyType
from typing import Any, Callable, Mapping

import jax
import numpy as np
from jax.experimental import multihost_utils

from tpu_estimator.api.checks import message
from tpu_estimator.api.mode_keys import ModeKeys
from tpu_estimator.api.run_config import RunConfig
from tpu_estimator.checkpoint import integrity
from tpu_estimator.errors import CheckpointStorageError
from tpu_estimator.checkpoint.manager import Checkpointer, CheckpointRef, split_checkpoint_path
from tpu_estimator.estimator.components import registered, variable_readers
from tpu_estimator.checkpoint.variables import Readers
from tpu_estimator.model import components as comp
from tpu_estimator.estimator.runtime import Runtime
from tpu_estimator.feeding.host_batches import HostBatch, HostBatches
from tpu_estimator.feeding.input_state import is_checkpointable, set_input_state
from tpu_estimator.feeding.pipelines import open_input
from tpu_estimator.loops.strategy import LoopStrategy
from tpu_estimator.model.call import INPUT_FN_ARGS, accepted_args
from tpu_estimator.model.module import BoundModel, bind_model
from tpu_estimator.model.precision import Precision
from tpu_estimator.model.spec_view import SpecView, view_spec
from tpu_estimator.model.state import TrainState
from tpu_estimator.parallel.layout import DataLayout
from tpu_estimator.parallel.mesh import Topology
from tpu_estimator import storage
from tpu_estimator.paths import as_uri

log = logging.getLogger("tpu_estimator")


@dataclasses.dataclass(frozen=True)
class ExportFlags:
    """The constructor's export options."""

    to_cpu: bool = True
    to_tpu: bool = True
    api_version: int = 1


class Core:
    """The estimator's internals, shared by the drivers and given to hooks as `session`.

    Args:
      model_fn: The user's model_fn; `model_fn_args` the argument names it takes.
      config: The checked RunConfig (its model_dir set).
      params: The user's params (the reserved keys absent).
      use_tpu, eval_on_tpu: As given to TPUEstimator.
      batch_sizes: Global batch size per mode (None: input_fn decides).
      batch_axis: As given to TPUEstimator.
      export: The export flags.
      warm_start_from: As given to TPUEstimator.
      embedding_config_spec: As given to TPUEstimator (checked), or None.
    """

    def __init__(
        self,
        model_fn: Callable[..., Any],
        model_fn_args: frozenset[str],
        config: RunConfig,
        params: Mapping[str, Any],
        *,
        use_tpu: bool,
        eval_on_tpu: bool,
        batch_sizes: Mapping[str, int | None],
        batch_axis: Any,
        export: ExportFlags,
        warm_start_from: Any,
        embedding_config_spec: Any = None,
    ) -> None:
        self.model_fn = model_fn
        self.model_fn_args = model_fn_args
        self.config = config
        if config.storage_timeout_s is not None:  # the store clients are per process
            storage.set_timeout_s(config.storage_timeout_s)
        self.params: Mapping[str, Any] = MappingProxyType(dict(params))
        self.use_tpu = bool(use_tpu)
        self.eval_on_tpu = bool(eval_on_tpu)
        self.batch_sizes: Mapping[str, int | None] = MappingProxyType(dict(batch_sizes))
        self.batch_axis = batch_axis
        self.export = export
        self.warm_start_from = warm_start_from
        self.embedding_config_spec = embedding_config_spec
        self._runtimes: dict[tuple[str, int | None], Runtime] = {}
        self._checkpointers: dict[str, Checkpointer] = {}
        self._last_state: TrainState | None = None
        # (step, digests record) of the checkpoint this process wrote that holds exactly
        # _last_state (None: not known to be saved)
        self._last_saved: tuple[int, str] | None = None

    # --- what hooks read -------------------------------------------------------

    @property
    def model_dir(self) -> str:
        return self.config.model_dir

    @property
    def global_step(self) -> int:
        """The global step of the state in memory, else of the newest intact checkpoint, else 0.

        Raises:
          DamagedCheckpointError: as `latest_checkpoint()`.
        """
        state = self._last_state
        if state is not None and not any(x.is_deleted() for x in jax.tree.leaves(state.step)):
            return int(jax.device_get(state.step))
        ref = self.find_checkpoint(None)
        return 0 if ref is None else ref.step

    def latest_checkpoint(self) -> str | None:
        """Path of the newest intact checkpoint in `model_dir` (`<model_dir>/<step>`), or None.

        Raises:
          DamagedCheckpointError: the newest is damaged (with
            `RunConfig.fall_back_to_intact_checkpoint`: only when none is intact).
        """
        ref = self.find_checkpoint(None)
        return None if ref is None else ref.path

    # --- parts -------------------------------------------------------------------

    @functools.cached_property
    def topology(self) -> Topology:
        tpu = self.config.tpu_config
        return Topology.create(
            use_tpu=self.use_tpu,
            cores_per_replica=tpu.cores_per_replica,
            split_model=tpu.input_partition_dims is not None,
            cluster=self.config.cluster,
        )

    @functools.cached_property
    def components(self) -> tuple[comp.StateComponent, ...]:
        """The extra kinds of training state the settings ask for (estimator/components.py)."""
        train_batch_size = self.batch_sizes.get(ModeKeys.TRAIN)
        return registered(self.config, self.topology, self.embedding_config_spec, train_batch_size=train_batch_size)

    @property
    def variable_readers(self) -> Readers:
        """The components' variable readers (checkpoint/variables.py), for warm start."""
        return variable_readers()

    @functools.cached_property
    def loop_strategy(self) -> LoopStrategy:
        """How loops run; "auto" decides once per estimator, at the first call (loops/strategy.py)."""
        return LoopStrategy(self.config.tpu_config.loop_strategy)

    @property
    def checkpointer(self) -> Checkpointer:
        """The Orbax manager of `model_dir` (one per directory, shared with hooks)."""
        return self.checkpointer_for(self.model_dir)

    def checkpointer_for(self, directory: str) -> Checkpointer:
        """The manager of `directory`: writable for model_dir, read-only for another run's."""
        directory = as_uri(directory, arg="checkpoint directory")
        if directory not in self._checkpointers:
            own = directory == as_uri(self.model_dir, arg="model_dir")
            self._checkpointers[directory] = Checkpointer(
                directory,
                max_to_keep=self.config.keep_checkpoint_max if own else None,
                keep_every_n_hours=self.config.keep_checkpoint_every_n_hours if own else None,
                read_only=not own,
            )
        return self._checkpointers[directory]

    def close_checkpointer(self) -> None:
        """Closes model_dir's manager so that Orbax's threads end (after a failed save too);
        the next use opens a new one. A failure while closing is logged, not raised: the
        caller is already raising the error that made it close."""
        checkpointer = self._checkpointers.pop(as_uri(self.model_dir, arg="model_dir"), None)
        if checkpointer is None:
            return
        try:
            checkpointer.close()
        except Exception as e:  # noqa: BLE001 - the save's failure, raised already by the caller
            log.debug("Closing the checkpoint manager of %s: %s", self.model_dir, e)

    def bind(
        self, mode: str, *, batch_size: int | None = None, use_tpu: bool | None = None,
        one_device: bool = False,
    ) -> BoundModel:
        """model_fn bound to `mode`: params carry `batch_size` (if given) and `use_tpu`.

        `params['use_tpu']` is set in every mode, as the original did: whether
        this mode runs on the accelerator (EVAL with `eval_on_tpu=False` does
        not), or, for export, the platform being exported. `one_device`: the
        components as a one-device export runs them (whole embedding tables).
        """
        if use_tpu is None:
            use_tpu = self.use_tpu and (mode != ModeKeys.EVAL or self.eval_on_tpu)
        params = {**self.params, "use_tpu": bool(use_tpu)}
        model = bind_model(self.model_fn, self.model_fn_args, mode, params, self.config, batch_size)
        tpu = self.config.tpu_config
        model = dataclasses.replace(
            model, components=comp.on_one_device(self.components) if one_device else self.components,
            precision=Precision(tpu.precision_policy),
            accumulation_steps=tpu.gradient_accumulation_steps if mode == ModeKeys.TRAIN else 1,
            remat_policy=tpu.remat_policy if mode == ModeKeys.TRAIN else None,
        )
        return model

    def view(self, mode: str, *, use_tpu: bool | None = None) -> Callable[[Any], SpecView]:
        """The (pure) check of what model_fn returns in `mode`."""
        return functools.partial(
            view_spec, mode=mode, use_tpu=self.use_tpu if use_tpu is None else use_tpu,
            eval_on_tpu=self.eval_on_tpu,
        )

    def runtime(self, mode: str) -> Runtime:
        """The Runtime of `mode` (cached per batch size: programs compile once)."""
        batch = self.batch_sizes[mode]
        key = (mode, batch)
        if key not in self._runtimes:
            layout = DataLayout.create(
                mode,
                batch_size=batch,
                topology=self.topology,
                pipeline=self.config.tpu_config.input_pipeline_config,
                use_tpu=self.use_tpu,
                eval_pipeline=self.config.tpu_config.eval_training_input_configuration,
            )
            self._runtimes[key] = Runtime(self, mode, layout)
        return self._runtimes[key]

    # --- input and state -----------------------------------------------------------

    def open_input(
        self, runtime: Runtime, input_fn: Callable[..., Any], *, restore: CheckpointRef | None = None
    ) -> tuple[HostBatches, Any]:
        """Calls input_fn as the layout says; (validated host batches, the raw iterator).
        With `restore`, the iterator resumes from that checkpoint's input position; one that
        cannot be restored is an error (RunConfig.fall_back_to_intact_checkpoint: a warning,
        and the input starts from its beginning), and a checkpoint without one a warning."""
        names = accepted_args(input_fn, INPUT_FN_ARGS, "input_fn")
        batches, iterator = open_input(
            input_fn, names, layout=runtime.layout, params=dict(self.params), config=self.config,
            mode=runtime.mode, batch_axis=self.batch_axis, pad_final=runtime.mode != ModeKeys.TRAIN,
            features_fn=comp.host_features(self.components),
        )
        if restore is not None and is_checkpointable(iterator):
            try:
                saved = restore.checkpointer.restore_input(restore.step)
                if set_input_state(iterator, saved):
                    log.info("Restored the input position of checkpoint %d.", restore.step)
                    return batches, iterator
            except Exception as e:  # noqa: BLE001 - unreadable or not this pipeline's position
                integrity.input_position_error(
                    restore.path, e, fall_back=self.config.fall_back_to_intact_checkpoint
                )
                return self.open_input(runtime, input_fn)  # a fresh iterator, from the beginning
            ckpt = restore.checkpointer
            saved_one = integrity.verify(ckpt.directory, restore.step, ckpt.all_steps()).input_saved
            log.warning(
                "Checkpoint %s holds no input position (%s): the input starts from its beginning.",
                restore.path,
                "input_fn's iterator was not checkpointable when it was saved" if saved_one is False
                else "saved by a version that did not record whether it had one",
            )
        return batches, iterator

    def find_checkpoint(self, checkpoint_path: str | os.PathLike[str] | None) -> CheckpointRef | None:
        """`checkpoint_path` (any run's `<dir>/<step>`), or model_dir's newest (None if none),
        verified against the digests recorded when it was saved (checkpoint/integrity.py).

        Raises:
          DamagedCheckpointError: `checkpoint_path` is damaged, or model_dir's newest is (with
            `RunConfig.fall_back_to_intact_checkpoint`: only when no checkpoint is intact).
        """
        if checkpoint_path is None:  # the newest intact one (see checkpoint/integrity.py)
            step = integrity.newest_intact(
                self.checkpointer.directory, self.checkpointer.all_steps(),
                fall_back=self.config.fall_back_to_intact_checkpoint,
            )
            return None if step is None else CheckpointRef(self.checkpointer, step)
        directory, step = split_checkpoint_path(checkpoint_path)
        checkpointer = self.checkpointer_for(directory)
        integrity.check_chosen(checkpointer.directory, step, checkpointer.all_steps())
        return CheckpointRef(checkpointer, step)

    def state_for(
        self, runtime: Runtime, first: HostBatch, axes: Any, ref: CheckpointRef | None, *, train: bool
    ) -> TrainState:
        """The state at checkpoint `ref` (None: fresh), reusing the last one in memory."""
        runtime.prepare(first, axes)
        ipl = self.config.tpu_config.iterations_per_loop_parsed
        self.loop_strategy.decide(
            ipl.value if ipl.unit == "count" else None, runtime.traced.primitives, self.topology.mesh.size
        )
        cached = self._last_state
        reuse = ref is not None and self._holds(ref) and not any(x.is_deleted() for x in jax.tree.leaves(cached))
        if jax.process_count() > 1:  # process 0's answer on every process: a restore is collective
            reuse = bool(multihost_utils.broadcast_one_to_all(np.int32(reuse)))
        if reuse:
            return cached if train else cached.replace(opt_state=None)
        if ref is None and not train:
            log.warning("No checkpoint in %s: running with freshly initialised variables.", self.model_dir)
        return runtime.load_state(first, axes, ref)

    def remember(self, state: TrainState, *, committed: bool = False) -> None:
        """Keeps the newest training state. `committed`: model_dir's manager has just written
        the checkpoint of its step and waited for it; its digests record (which names that
        save) is read, and the next call starts from this state without a restore while the
        checkpoint it finds is that one (`_holds`)."""
        self._last_state, self._last_saved = state, None
        if not committed:
            return
        checkpointer = self.checkpointer
        step = int(jax.device_get(state.step))
        if checkpointer.committed_step != step:
            return
        try:
            record = integrity.recorded(checkpointer.directory, step)
        except CheckpointStorageError as e:  # the save is committed: the next call restores
            log.debug("Digests of checkpoint %d not read back: %s", step, e)
            return
        self._last_saved = None if record is None else (step, record)

    def _holds(self, ref: CheckpointRef) -> bool:
        """Whether the state in memory is exactly what checkpoint `ref` holds: this process
        saved it, and the step's digests, as `find_checkpoint` just verified them, are still
        those of that save (not those of another run that wrote the step since)."""
        if self._last_state is None or self._last_saved is None or ref.checkpointer is not self.checkpointer:
            return False
        verdict = integrity.last_verdict(ref.checkpointer.directory, ref.step)
        return verdict is not None and self._last_saved == (ref.step, verdict.record)

    def last_state(self) -> TrainState | None:
        """The newest training state in memory (its buffers may have been donated)."""
        return self._last_state

    def newest_checkpoint(self) -> CheckpointRef:
        """model_dir's newest checkpoint.

        Raises:
          ValueError: there is none yet.
        """
        ref = self.find_checkpoint(None)
        if ref is None:
            raise ValueError(
                message(
                    "The estimator has no checkpoint yet.",
                    f"model_dir={self.model_dir!r} without checkpoints",
                    "Call train() first.",
                )
            )
        return ref
