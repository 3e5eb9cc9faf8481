"""`checkpoints_iterator`: TF's `tf.train.checkpoints_iterator` over a model_dir's checkpoints.

The same loop as TF's (tensorflow/python/training/checkpoint_utils.py):
`wait_for_new_checkpoint` polls every second for a newest checkpoint other than
the last one yielded; `checkpoints_iterator` yields it, then waits at least
`min_interval_secs` from the yield before looking again. A checkpoint is a
committed Orbax step, `<model_dir>/<step>` (what `latest_checkpoint()`
returns): a step still being written is not seen until it is complete.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Callable, Iterator

from etils import epath

from tpu_estimator.api.checks import message, non_negative_number
from tpu_estimator.checkpoint.manager import Checkpointer
from tpu_estimator.paths import as_uri

log = logging.getLogger("tpu_estimator")

POLL_SECONDS = 1.0  # TF's wait_for_new_checkpoint(seconds_to_sleep=1)


class _Latest:
    """The newest checkpoint of one directory, read again on each call (the directory may
    not exist yet: a job that evaluates may start before the one that trains)."""

    def __init__(self, checkpoint_dir: str) -> None:
        self.directory = checkpoint_dir
        self._checkpointer: Checkpointer | None = None

    def __call__(self) -> str | None:
        if self._checkpointer is None:
            if not epath.Path(self.directory).is_dir():
                return None
            self._checkpointer = Checkpointer(self.directory, read_only=True)
        step = self._checkpointer.latest_step()
        return None if step is None else self._checkpointer.path(step)

    def close(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.close()


def wait_for_new_checkpoint(
    latest: Callable[[], str | None],
    last_checkpoint: str | None = None,
    seconds_to_sleep: float | None = None,
    timeout: float | None = None,
) -> str | None:
    """Polls `latest()` every `seconds_to_sleep` (default `POLL_SECONDS`) until it returns a
    path other than `last_checkpoint`; None once `timeout` seconds would pass (as TF's: it
    never sleeps past the timeout)."""
    if seconds_to_sleep is None:
        seconds_to_sleep = POLL_SECONDS
    log.info("Waiting for new checkpoint at %s", getattr(latest, "directory", latest))
    stop_time = None if timeout is None else time.monotonic() + timeout
    while True:
        path = latest()
        if path is not None and path != last_checkpoint:
            log.info("Found new checkpoint at %s", path)
            return path
        if stop_time is not None and time.monotonic() + seconds_to_sleep > stop_time:
            return None
        time.sleep(seconds_to_sleep)


def checkpoints_iterator(
    checkpoint_dir: str | os.PathLike[str],
    min_interval_secs: float = 0,
    timeout: float | None = None,
    timeout_fn: Callable[[], bool] | None = None,
) -> Iterator[str]:
    """Yields each new checkpoint of `checkpoint_dir` as it appears, as TF1's
    `tf.train.checkpoints_iterator` did: the loop of a continuous evaluation job.

    First the newest checkpoint already there (or the first one to appear), then
    each newer one once, as `<checkpoint_dir>/<step>` paths (what
    `TPUEstimator.latest_checkpoint()` returns and `evaluate(checkpoint_path=...)`
    takes). As in TF, only the newest checkpoint is looked at: one written and
    superseded while the caller was busy with the previous one is skipped.

    Args:
      checkpoint_dir: The model_dir that training writes (local or gs://...); it
        may not exist yet.
      min_interval_secs: The least time between two yields, in seconds (counted
        from the previous yield, so the caller's work counts toward it).
      timeout: Seconds to wait for a new checkpoint before giving up (None:
        forever).
      timeout_fn: Called when `timeout` passed without a new checkpoint: True ends
        the iteration, False waits another `timeout`. Without it, a timeout ends it.

    Yields:
      The paths of the new checkpoints, e.g. `'runs/mnist/1200'`.

    Raises:
      ValueError: `checkpoint_dir` is not a path, or `min_interval_secs`/`timeout` is
        negative.

    Example:
      >>> for path in tpu_estimator.checkpoints_iterator(model_dir, timeout=600,
      ...                                                timeout_fn=training_done):
      ...     print(est.evaluate(eval_input_fn, checkpoint_path=path))
    """
    directory = as_uri(checkpoint_dir, arg="checkpoint_dir")
    non_negative_number(min_interval_secs, "min_interval_secs")
    if timeout is not None:
        non_negative_number(timeout, "timeout")
    if timeout_fn is not None and not callable(timeout_fn):
        raise TypeError(message("`timeout_fn` must be a callable taking no argument, or None.",
                                f"timeout_fn={timeout_fn!r}"))
    return _iterate(_Latest(directory), min_interval_secs, timeout, timeout_fn)


def _iterate(
    latest: _Latest,
    min_interval_secs: float,
    timeout: float | None,
    timeout_fn: Callable[[], bool] | None,
) -> Iterator[str]:
    """The generator behind `checkpoints_iterator` (its arguments checked at the call, not at
    the first `next()`)."""
    checkpoint = None
    try:
        while True:
            new = wait_for_new_checkpoint(latest, checkpoint, timeout=timeout)
            if new is None:
                if timeout_fn is None:
                    log.info("Timed-out waiting for a checkpoint.")
                    return
                if timeout_fn():
                    return  # the caller says no more checkpoints will come
                continue
            start = time.monotonic()
            checkpoint = new
            yield checkpoint
            left = start + min_interval_secs - time.monotonic()
            if left > 0:
                time.sleep(left)
    finally:
        latest.close()
