"""`Cadence`: every N global steps and/or every T seconds (TF's SecondOrStepTimer).

One small policy object, in the spirit of Orbax v1's save policies, serves
`RunConfig`'s checkpoint cadence, `train()`'s logging and the timed hooks
(`LoggingTensorHook`, `StepCounterHook`, `SummarySaverHook`,
`CheckpointSaverHook`, early stopping).

Example:
  >>> c = Cadence(steps=100)
  >>> c.start(0)
  >>> c.due(50), c.due(100)
  (False, True)
  >>> c.mark(100)
  (..., 100)
  >>> c.due(150)
  False
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from tpu_estimator.api.checks import message

if TYPE_CHECKING:
    from tpu_estimator.api.session_run_hook import Session

__all__ = ["Cadence", "global_step_of"]


class Cadence:
    """Due when `steps` global steps or `secs` seconds have passed since the last mark.

    Neither given: never due. Before the first `start()`/`mark()` it is due
    at once (a hook's first loop triggers, as TF's timers did). At most once
    per global step.

    Args:
      steps: Every this many global steps (None: not by steps).
      secs: Every this many seconds (None: not by time).
    """

    def __init__(self, steps: int | None = None, secs: float | None = None) -> None:
        self.steps, self.secs = steps, secs
        self.last_step: int | None = None
        self.last_time: float | None = None

    @classmethod
    def exactly_one(
        cls, steps: int | None, secs: float | None, *, who: str,
        names: tuple[str, str] = ("every_n_steps", "every_n_secs"),
    ) -> "Cadence":
        """A cadence from a hook's two arguments, exactly one of which must be given (> 0).

        Raises:
          ValueError: neither or both given, or one <= 0; the message names `who` and `names`.
        """
        if (steps is None) == (secs is None):
            raise ValueError(
                message(
                    f"{who}: give exactly one of `{names[0]}` and `{names[1]}`.",
                    f"{names[0]}={steps!r}, {names[1]}={secs!r}",
                )
            )
        for name, value in zip(names, (steps, secs)):
            if value is not None and (isinstance(value, bool) or value <= 0):
                raise ValueError(message(f"{who}: `{name}` must be > 0.", f"{name}={value!r}"))
        return cls(steps, secs)

    def start(self, step: int) -> None:
        """Counts from `step` (now) without triggering."""
        self.last_step, self.last_time = step, time.monotonic()

    def due(self, step: int) -> bool:
        """Whether `step` (now) is a trigger."""
        if self.last_step is None:
            return self.steps is not None or self.secs is not None
        if step == self.last_step:
            return False
        by_steps = bool(self.steps) and step >= self.last_step + self.steps
        by_secs = self.secs is not None and time.monotonic() - (self.last_time or 0.0) >= self.secs
        return by_steps or by_secs

    def mark(self, step: int) -> tuple[float | None, int | None]:
        """Records a trigger at `step`; (seconds, steps) since the previous one (None the first time)."""
        now = time.monotonic()
        elapsed = None if self.last_time is None else now - self.last_time
        steps = None if self.last_step is None else step - self.last_step
        self.last_step, self.last_time = step, now
        return elapsed, steps


def global_step_of(session: Session | None) -> int:
    """The current global step as `session` (the estimator's core) knows it; 0 if it cannot tell."""
    return int(getattr(session, "global_step", 0) or 0)
