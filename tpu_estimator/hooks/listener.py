"""`CheckpointSaverListener`, and the one save sequence that calls listeners around a save."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from tpu_estimator.api.checks import message
from tpu_estimator.api.contracts import PyTree
from tpu_estimator.api.session_run_hook import Session

if TYPE_CHECKING:
    from tpu_estimator.checkpoint.manager import Checkpointer

__all__ = ["CheckpointSaverListener", "check_listeners", "save_with_listeners"]


class CheckpointSaverListener:
    """Base class of listeners called around checkpoint saves (as in TF).

    Every method is a no-op; override the ones you need. `session` is the
    estimator's core (there is no `tf.Session`): it has `model_dir`,
    `config`, `params`, `global_step` and `latest_checkpoint()`.

    Example:
      >>> class Announce(CheckpointSaverListener):
      ...     def after_save(self, session, global_step_value):
      ...         print('saved step', global_step_value)
    """

    def begin(self) -> None:
        """Called once before training starts."""

    def before_save(self, session: Session, global_step_value: int) -> None:
        """Called before each checkpoint save."""

    def after_save(self, session: Session, global_step_value: int) -> bool | None:
        """Called after each checkpoint save. Returning True requests training to stop."""
        return None

    def end(self, session: Session, global_step_value: int) -> None:
        """Called once at the end of training, after the last save."""


def check_listeners(listeners: Sequence[object] | None) -> list[CheckpointSaverListener]:
    """`listeners` as a list, each a CheckpointSaverListener.

    Raises:
      TypeError: an element is not a CheckpointSaverListener.
    """
    checked: list[CheckpointSaverListener] = []
    for lis in listeners or []:
        if not isinstance(lis, CheckpointSaverListener):
            raise TypeError(
                message(
                    "`saving_listeners` must be a list of tpu_estimator.CheckpointSaverListener "
                    "instances.",
                    f"saving_listeners contains {type(lis).__name__}",
                    "Subclass tpu_estimator.CheckpointSaverListener.",
                )
            )
        checked.append(lis)
    return checked


def save_with_listeners(
    checkpointer: Checkpointer,
    step: int,
    state: PyTree,
    listeners: Sequence[CheckpointSaverListener],
    session: Session,
    input_state: object = None,
) -> bool:
    """`before_save` of each listener, the (asynchronous) save, `after_save` of each.

    Returns:
      True if a listener's `after_save` asks training to stop.
    """
    for lis in listeners:
        lis.before_save(session, step)
    checkpointer.save(step, state, input_state)
    stop = False
    for lis in listeners:
        stop |= bool(lis.after_save(session, step))
    return stop
