"""Preemption: a SIGTERM stops `train()` at the next loop boundary, with the step saved;
`evaluate()` and `predict()` stop there with `PreemptedError`, nothing written.

SIGTERM is what schedulers send before taking the machines away (TPU
maintenance events, spot VMs, `kubectl delete`, SLURM preemption). While
`train()` runs, a `Watch` notices it, and the host loop asks `reached()`
once per loop boundary; when it says True, the loop saves that step (with
the input position), runs the hooks' and listeners' `end`, and `train()`
returns with `preempted=True`. `evaluate()` and `predict()` ask at each of
their loop boundaries too and raise `PreemptedError` (`Watch.error`):
partial metrics would be silently wrong, so none are recorded.

One process: a Python SIGTERM handler that only records the signal (a
second SIGTERM while the checkpoint is written changes nothing), installed
for the duration of `train()` from the main thread and the previous handler
restored after. A SIGTERM recorded but never acted on (it came after the
last boundary of an evaluate(), or while predict()'s generator was suspended
and it is then closed) is delivered again to the previous handler when the
call ends, so the scheduler's notice is never lost. Elsewhere
(`signal.signal` works only on the main thread) none is installed.

Several processes (`jax.distributed`): the coordination service owns
SIGTERM: `jax.distributed.initialize` installs a C++ handler (its preemption
service) that tells every process. A Python handler would replace it, and
restoring "the previous" one from Python would leave SIGTERM's default
action, so none is installed; each process asks JAX's preemption sync
point (`multihost_utils.reached_preemption_sync_point`) at each loop
boundary instead. The service agrees on the boundary after the furthest
process's last one, so every process stops at the same step. Its counter
must go up by one per call on every process: it counts loop boundaries of
this process (over all train() calls), which every process passes alike.
"""

from __future__ import annotations

import itertools
import logging
import signal
import threading
from types import FrameType
from typing import Any, Literal

import jax
from jax.experimental import multihost_utils

from tpu_estimator.errors import PreemptedError

log = logging.getLogger("tpu_estimator")

# Loop boundaries this process has passed (the preemption sync point's call counter).
_boundaries = itertools.count(1)


def _how() -> Literal["sync", "none", "signal"]:
    """"sync": JAX's preemption service; "none": several processes without it; "signal":
    a Python handler (one process)."""
    if jax.distributed.is_initialized() and jax.config.jax_enable_preemption_service:
        return "sync"
    if jax.process_count() > 1:
        return "none"
    return "signal"


class Watch:
    """Notices a preemption notice while `train()` runs (a context manager around it).

    Example:
      >>> with Watch() as watch:
      ...     for step in range(2, 10, 2):  # loop boundaries
      ...         if watch.reached():
      ...             break  # save `step`, then return
    """

    def __init__(self, *, redeliver: bool = False) -> None:
        self.how = _how()
        self._redeliver = redeliver
        self._acted = False
        self._signalled = threading.Event()
        self._previous: Any = None
        self._installed = False

    def __enter__(self) -> "Watch":
        if self.how == "none":
            log.warning(
                "Several processes without JAX's preemption service "
                "(jax_enable_preemption_service=False): a SIGTERM ends the processes unsaved."
            )
        elif self.how == "signal":
            if threading.current_thread() is threading.main_thread():
                self._previous = signal.signal(signal.SIGTERM, self._record)
                self._installed = True
            else:
                log.debug("train() runs off the main thread: no SIGTERM handler (Python allows "
                          "one only there); a SIGTERM has its usual effect.")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed and threading.current_thread() is not threading.main_thread():
            log.warning("The SIGTERM handler of a call cannot be removed off the main thread (a "
                        "generator closed by another thread): it stays until the process ends.")
            return
        if self._installed:
            # None: the previous handler was not set from Python; SIG_DFL is Python's view of it.
            signal.signal(signal.SIGTERM, self._previous if self._previous is not None else signal.SIG_DFL)
            self._installed = False
            if self._redeliver and self._signalled.is_set() and not self._acted:
                log.warning("A SIGTERM came after the last loop boundary: delivered to the previous handler.")
                signal.raise_signal(signal.SIGTERM)

    def _record(self, signum: int, frame: FrameType | None) -> None:
        """The handler: records only (the loop acts at its next boundary)."""
        self._signalled.set()

    @property
    def signalled(self) -> bool:
        """True once this process's handler recorded a SIGTERM (even after the last loop)."""
        return self._signalled.is_set()

    def reached(self) -> bool:
        """Asked at each loop boundary, on every process: True to stop and save there."""
        if self.how == "sync":
            reached = bool(multihost_utils.reached_preemption_sync_point(next(_boundaries)))
        else:
            reached = self._signalled.is_set()
        self._acted = self._acted or reached
        return reached

    @staticmethod
    def error(call: str, *, batches: int, global_step: int) -> PreemptedError:
        """The `PreemptedError` evaluate()/predict() raise at the boundary where `reached()`
        said True (estimator/engine.py asks, the mode's policy raises)."""
        log.warning("Preemption notice: %s stops after %d batches.", call, batches)
        return PreemptedError(
            f"{call} was preempted (SIGTERM) after {batches} batches of the checkpoint at "
            f"global step {global_step}; nothing was written"
            + (" (no metrics recorded: partial ones would be wrong)" if call.startswith("evaluate") else "")
            + ". Run it again in the new job: the checkpoint is unchanged."
        )
