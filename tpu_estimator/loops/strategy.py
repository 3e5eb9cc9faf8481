"""Choosing how a loop runs: one `lax.scan` program, or one program per step.

"auto" decides once per estimator, before its first loop, from what is known
then: the backend, `iterations_per_loop` and the primitives of model_fn's
trace (`Traced.primitives`). Never by timing, so a decision cannot flip
between machines or recompile in the middle of training:

- `iterations_per_loop=1`: "step" (a loop is one step; a scan of one adds nothing);
- not XLA:CPU (TPU, GPU): "scan", the on-device loop of the original;
- XLA:CPU and the model convolves: "step" for training. XLA:CPU runs a
  CNN's training step ~25x slower inside `lax.scan`'s while loop than as a
  program of its own (benchmarks/RESULTS.md: 33 vs 880 examples/sec); the
  slow part is the convolutions' gradient. Evaluation and prediction (forward
  only) run "step" on one device and "scan" on several: on the CNN benchmark
  a program per batch was 2-10% faster than the on-device loop with one
  device, and 10-20% slower with 8 (each program is dispatched to every
  device; benchmarks/RESULTS.md, "Inference loops of a CNN on XLA:CPU");
- XLA:CPU otherwise: "scan" (no per-step dispatch; measured as fast or faster
  on the MLP benchmark).

The choice is logged once and readable as `TPUEstimator.loop_strategy`
(training's) and `LoopStrategy.inference` (evaluation's and prediction's);
the user's "scan" or "step" always wins, for both.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Iterable, Iterator

import jax

log = logging.getLogger("tpu_estimator")

# Primitives that XLA:CPU runs far slower inside a while loop (lax.scan) than outside.
SLOW_IN_CPU_LOOPS = frozenset({"conv_general_dilated"})


def equations(jaxpr: Any) -> Iterator[Any]:
    """Every equation of `jaxpr` (a Jaxpr or ClosedJaxpr), nested ones included (inside pjit,
    custom_vjp, cond, scan, ...)."""
    todo = [jaxpr]
    while todo:
        j = todo.pop()
        j = getattr(j, "jaxpr", j)  # ClosedJaxpr -> Jaxpr
        for eqn in getattr(j, "eqns", ()):
            yield eqn
            for value in eqn.params.values():
                items = value if isinstance(value, (tuple, list)) else (value,)
                todo.extend(v for v in items if hasattr(v, "eqns") or hasattr(getattr(v, "jaxpr", None), "eqns"))


def primitives_of(jaxpr: Any) -> frozenset[str]:
    """Names of every primitive in `jaxpr`, nested ones included (`equations`)."""
    return frozenset(eqn.primitive.name for eqn in equations(jaxpr))


def choose(
    backend: str,
    iterations_per_loop: int | None,
    primitives: Iterable[str],
    *,
    training: bool = True,
    devices: int = 1,
) -> tuple[str, str]:
    """"auto"'s rule: (strategy, why). `iterations_per_loop` None: a time-based loop;
    `training` False: the rule of evaluation and prediction loops (no gradients);
    `devices`: how many devices each program runs on.

    >>> choose("cpu", 100, {"dot_general", "conv_general_dilated"})[0]
    'step'
    >>> choose("cpu", 100, {"dot_general"})[0], choose("tpu", 100, {"conv_general_dilated"})[0]
    ('scan', 'scan')
    >>> choose("gpu", 1, {"dot_general"})[0]
    'step'
    >>> choose("cpu", 100, {"conv_general_dilated"}, training=False)[0]
    'step'
    >>> choose("cpu", 100, {"conv_general_dilated"}, training=False, devices=8)[0]
    'scan'
    """
    if iterations_per_loop == 1:
        return "step", "iterations_per_loop=1: a loop is one step"
    if backend != "cpu":
        return "scan", f"backend {backend!r}: iterations_per_loop steps in one on-device program"
    slow = ", ".join(sorted(SLOW_IN_CPU_LOOPS.intersection(primitives)))
    if slow and training:
        return "step", f"XLA:CPU runs the gradient of {slow} far slower inside lax.scan: one program per step"
    if slow and devices == 1:
        return "step", f"XLA:CPU, {slow} without gradients on one device: one program per batch"
    if slow:
        return "scan", f"XLA:CPU, {slow} without gradients on {devices} devices: iterations_per_loop batches in one program"
    return "scan", "XLA:CPU, no convolutions: iterations_per_loop steps in one program"


class LoopStrategy:
    """The strategy of one estimator: the user's setting, or "auto"'s decision (`decide`)."""

    def __init__(self, setting: str, backend: str | None = None) -> None:
        self.setting = setting
        self._backend = backend
        self._lock = threading.Lock()
        self._value: str | None = None if setting == "auto" else setting
        self._inference: str | None = self._value
        self._logged = False

    @property
    def decided(self) -> bool:
        with self._lock:
            return self._value is not None

    @property
    def current(self) -> str:
        """'scan' or 'step'; 'auto' until the first train/evaluate/predict call decides."""
        with self._lock:
            return self._value or "auto"

    @property
    def inference(self) -> str:
        """How evaluate() and predict() loops run: 'scan' or 'step' ('auto' until decided).
        The user's setting, or "auto"'s rule for loops without gradients (`choose`). With
        "scan" the feeder stacks a loop's batches on the host, as training's chunks (one
        process), so an on-device loop costs no copy inside the program."""
        with self._lock:
            return self._inference or "auto"

    def decide(self, iterations_per_loop: int | None, primitives: Iterable[str], devices: int = 1) -> str:
        """Decides once (later calls return the decision) and logs it; returns the strategy.
        `devices`: how many devices each program runs on (the estimator's mesh)."""
        with self._lock:
            if self._value is None:
                backend = self._backend or jax.default_backend()
                self._value, why = choose(backend, iterations_per_loop, primitives)
                self._inference, why_inference = choose(
                    backend, iterations_per_loop, primitives, training=False, devices=devices
                )
                if self._inference == self._value:
                    log.info("loop_strategy='auto' chose %r: %s.", self._value, why)
                else:
                    log.info(
                        "loop_strategy='auto' chose %r for training: %s; %r for evaluation and prediction: %s.",
                        self._value, why, self._inference, why_inference,
                    )
            elif not self._logged:
                log.info("loop_strategy=%r (set by TPUConfig).", self._value)
            self._logged = True
            return self._value
