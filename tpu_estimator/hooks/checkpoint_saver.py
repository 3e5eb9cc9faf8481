"""`CheckpointSaverHook`: saves the training state every N steps or T seconds."""

from __future__ import annotations

from typing import Sequence

from tpu_estimator.checkpoint.manager import Checkpointer
from tpu_estimator.api.contracts import PyTree
from tpu_estimator.hooks.cadence import Cadence
from tpu_estimator.hooks.listener import CheckpointSaverListener
from tpu_estimator.hooks.listener import check_listeners, save_with_listeners
from tpu_estimator.paths import as_uri
from tpu_estimator.api.session_run_hook import (
    RunContext,
    Session,
    SessionRunArgs,
    SessionRunHook,
    SessionRunValues,
)


class CheckpointSaverHook(SessionRunHook):
    """Saves checkpoints (Orbax, as `train()` does) into `checkpoint_dir` at loop ends.

    `train()` already saves into `model_dir` as `RunConfig` says; this hook
    adds saves on its own cadence, into `model_dir` or another directory
    (restorable by an estimator whose model_dir it is). It also saves the
    final state in `end()`.

    Args:
      checkpoint_dir: Where to save.
      save_secs: Save every this many seconds, or
      save_steps: every this many global steps (give exactly one).
      listeners: `CheckpointSaverListener`s called around each save of this hook;
        `after_save` returning True stops training.

    Raises:
      ValueError: neither or both of save_secs/save_steps.

    Example:
      >>> CheckpointSaverHook('/tmp/m/extra', save_steps=500)
    """

    def __init__(
        self,
        checkpoint_dir: str,
        save_secs: float | None = None,
        save_steps: int | None = None,
        listeners: Sequence[CheckpointSaverListener] | None = None,
    ) -> None:
        self._dir = as_uri(checkpoint_dir, arg="checkpoint_dir")
        self._timer = Cadence.exactly_one(save_steps, save_secs, who="CheckpointSaverHook", names=("save_steps", "save_secs"))
        self._listeners = check_listeners(listeners)
        self._ckpt: Checkpointer  # model_dir's (shared) or its own: set by after_create_session
        self._own = False
        self._state: PyTree = None
        self._step: int | None = None
        self._saved_step: int | None = None

    def begin(self) -> None:
        for lis in self._listeners:
            lis.begin()

    def after_create_session(self, session: Session, coord: None) -> None:
        self._session = session  # the core: what listeners receive
        shared: Checkpointer | None = getattr(session, "checkpointer", None)  # the core's, of model_dir
        if as_uri(session.model_dir, arg="model_dir") == self._dir and shared is not None:
            self._ckpt = shared  # one Orbax manager per directory
        else:
            self._ckpt, self._own = Checkpointer(self._dir), True
        self._saved_step = session.global_step  # train() has saved the step it starts from

    def before_run(self, run_context: RunContext) -> SessionRunArgs:
        return SessionRunArgs("state")

    def after_run(self, run_context: RunContext, run_values: SessionRunValues) -> None:
        self._state, self._step = run_values.results, run_values.global_step or 0
        if self._timer.due(self._step):
            self._timer.mark(self._step)
            if self._save(self._session):
                run_context.request_stop()

    def end(self, session: Session) -> None:
        if self._state is not None and self._step != self._saved_step:
            self._save(session)
        for lis in self._listeners:
            lis.end(session, self._step)
        self._ckpt.wait()
        self._state = None  # do not keep device buffers alive
        del self._session  # nor the core (after_create_session sets it again)

    def _save(self, session: Session) -> bool:
        """Saves the current step once; True if a listener asks to stop."""
        self._saved_step = self._step
        return save_with_listeners(self._ckpt, self._step, self._state, self._listeners, session)
