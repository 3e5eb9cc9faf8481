"""Choosing how a training loop runs: one `lax.scan` program, or one program per step.

Measured here (benchmarks/train_throughput.py, XLA:CPU): a 784-512-512-10 MLP
trains faster with one jitted step per dispatch than inside `lax.scan`, and a
small CNN ~28x faster; tiny models gain from scan, whose per-step cost has no
dispatch. So "auto" measures: on the CPU backend the first loop runs step by
step and times the steps after the first (compiling) one; when a step takes
longer than `DISPATCH_BOUND_SECS` the dispatch overhead is negligible and
"step" stays, otherwise "scan" takes over. Other backends use "scan".
"""

from __future__ import annotations

import threading

import jax

# A step longer than this makes the host's per-dispatch cost (~0.1 ms) negligible.
DISPATCH_BOUND_SECS = 0.002


class LoopStrategy:
    """The current strategy, shared by the feeder thread and the host loop."""

    def __init__(self, setting: str, backend: str | None = None) -> None:
        backend = backend or jax.default_backend()
        self._lock = threading.Lock()
        if setting != "auto":
            self._value: str | None = setting
        else:
            self._value = "scan" if backend != "cpu" else None  # None: measure first

    @property
    def current(self) -> str:
        """'scan' or 'step' (while undecided, 'step': that is how it measures)."""
        with self._lock:
            return self._value or "step"

    @property
    def measuring(self) -> bool:
        with self._lock:
            return self._value is None

    def observe(self, steps: int, seconds: float) -> None:
        """Decides from `steps` timed single-step dispatches (compilation excluded)."""
        with self._lock:
            if self._value is None and steps > 0:
                self._value = "step" if seconds / steps > DISPATCH_BOUND_SECS else "scan"
