"""`CheckpointSaverListener`: callbacks around each checkpoint save."""

from __future__ import annotations

from typing import Any


class CheckpointSaverListener:
    """Base class of listeners called around checkpoint saves (as in TF).

    Every method is a no-op; override the ones you need. `session` is the
    estimator object itself (there is no `tf.Session`).

    Example:
      >>> class Announce(CheckpointSaverListener):
      ...     def after_save(self, session, global_step_value):
      ...         print('saved step', global_step_value)
    """

    def begin(self) -> None:
        """Called once before training starts."""

    def before_save(self, session: Any, global_step_value: int) -> None:
        """Called before each checkpoint save."""

    def after_save(self, session: Any, global_step_value: int) -> bool | None:
        """Called after each checkpoint save. Returning True requests training to stop."""
        return None

    def end(self, session: Any, global_step_value: int) -> None:
        """Called once at the end of training, after the last save."""
