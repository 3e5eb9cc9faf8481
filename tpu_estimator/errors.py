"""The exceptions the engine raises on purpose (beyond `ValueError`/`TypeError` for bad arguments)."""

from __future__ import annotations

__all__ = [
    "CheckpointStorageError",
    "DamagedCheckpointError",
    "HostLostError",
    "NanLossDuringTrainingError",
    "PreemptedError",
]


class NanLossDuringTrainingError(RuntimeError):
    """The training loss became NaN or infinite (as TF's `NanLossDuringTrainingError`).

    Raised by `train()` at the loop boundary where a non-finite loss was
    seen, unless a `NanTensorHook(fail_on_nan_loss=False)` asks to keep
    going; the newest checkpoint saved before it is kept.
    """


class CheckpointStorageError(OSError):
    """`model_dir` cannot hold checkpoints: it is not a writable directory, or a save failed.

    Raised by `train()` before training starts (a probe file is written and
    deleted), or from the save that failed; the message names the path and
    the fix. An `OSError`, so `except OSError` still catches it.
    """


class DamagedCheckpointError(ValueError):
    """A checkpoint's files are not those that were saved (missing, empty, truncated, changed).

    The message names the step directory, each damaged file and the newest
    intact step, and how to continue (delete the step directory, pass
    `checkpoint_path=` to the intact step, or set
    `RunConfig(fall_back_to_intact_checkpoint=True)`).
    """


class PreemptedError(RuntimeError):
    """A preemption notice (SIGTERM) stopped `evaluate()` or `predict()` before its end.

    Raised at the first loop boundary after the notice, on every process at
    the same one (several processes agree through JAX's preemption sync
    point). Nothing was written: evaluate() records no metrics (partial ones
    would be silently wrong), predict()'s generator stops with it. The
    checkpoint is untouched; run the call again in the new job. `train()` is
    not an error when preempted: it saves and returns (`TPUEstimator.preempted`).
    """



class HostLostError(RuntimeError):
    """Another process of a multi-process job stopped (killed, crashed, its machine lost).

    Every survivor logs this message, naming the lost process, as soon as it is
    known (at once for a process killed outright, after
    `ClusterConfig.lost_host_timeout_s` for one gone silent), and raises it from
    train/evaluate/predict when their collective fails. JAX itself then ends
    the survivors within `lost_host_timeout_s` (SIGABRT from its coordination
    service; nothing public lets Python stop that). The newest committed
    checkpoint is intact: restart every process to resume from it.
    """
