"""How many steps each device loop runs: `iterations_per_loop` as a count or a duration."""

from __future__ import annotations

import threading

from tpu_estimator.api.tpu_config import IterationsPerLoop


class LoopSchedule:
    """Loop sizes toward `last_step` (None: until the input ends).

    Count-based: `min(remaining, iterations_per_loop)` steps per loop.
    Time-based ('30s'): starts with 1 step, then the largest power of two
    whose measured duration fits the target, so few distinct loop lengths
    (programs) are ever compiled. Thread-safe: the feeder asks for sizes
    ahead of the trainer, which reports step times.
    """

    MAX_TIMED_STEPS = 1 << 16

    def __init__(self, ipl: IterationsPerLoop, start_step: int, last_step: int | None) -> None:
        self._ipl = ipl
        self._planned = start_step
        self._last = last_step
        self._step_secs: float | None = None
        self._lock = threading.Lock()

    def next_size(self) -> int | None:
        """Steps of the next loop to feed, or None when the plan is complete."""
        with self._lock:
            remaining = None if self._last is None else self._last - self._planned
            if remaining is not None and remaining <= 0:
                return None
            size = self._target()
            if remaining is not None:
                size = min(size, remaining)
            self._planned += size
            return size

    def _target(self) -> int:
        if self._ipl.unit == "count":
            return self._ipl.value
        if self._step_secs is None:
            return 1
        fit = max(1, int(self._ipl.value / max(self._step_secs, 1e-9)))
        size = 1
        while size * 2 <= min(fit, self.MAX_TIMED_STEPS):
            size *= 2
        return size

    def report(self, steps: int, seconds: float) -> None:
        """Measured duration of a loop of `steps` steps (time-based schedules adapt to it)."""
        if steps > 0:
            with self._lock:
                self._step_secs = seconds / steps
