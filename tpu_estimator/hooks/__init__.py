"""Hooks around the host loop: `SessionRunHook`, `CheckpointSaverListener`."""

from tpu_estimator.hooks.listener import CheckpointSaverListener as CheckpointSaverListener
from tpu_estimator.hooks.session_run_hook import RunContext as RunContext
from tpu_estimator.hooks.session_run_hook import SessionRunArgs as SessionRunArgs
from tpu_estimator.hooks.session_run_hook import SessionRunHook as SessionRunHook
from tpu_estimator.hooks.session_run_hook import SessionRunValues as SessionRunValues

__all__ = [
    "CheckpointSaverListener",
    "RunContext",
    "SessionRunArgs",
    "SessionRunHook",
    "SessionRunValues",
]
