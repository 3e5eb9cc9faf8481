"""Which saved steps to delete: Orbax's own preservation policies, applied to our saves.

A staged save (checkpoint/staging.py) writes a step without Orbax's
`CheckpointManager`, which applied `keep_checkpoint_max` and
`keep_checkpoint_every_n_hours` itself; this module asks the same policies
(`LatestN`, `EveryNSeconds`, combined by `AnyPreservationPolicy`, as
`CheckpointManager` builds them from its options) which steps stay.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any, Mapping


@dataclasses.dataclass(frozen=True)
class _Info:
    """One step as Orbax's policies see it (its `PolicyCheckpointInfo` protocol)."""

    step: int
    time: datetime.datetime
    metrics: dict[str, Any] | None = None


def to_delete(
    saved: Mapping[int, float | None],
    *,
    max_to_keep: int | None,
    keep_time: datetime.timedelta | None,
) -> list[int]:
    """The steps of `saved` (step -> commit time in seconds since the epoch; None where
    unknown, allowed when `keep_time` is None) that neither policy keeps, oldest first.

    `max_to_keep=None` keeps every step (Orbax's `LatestN(None)`).
    """
    if max_to_keep is None or len(saved) <= max_to_keep:
        return []
    import orbax.checkpoint as ocp  # (imported here: see checkpoint/manager.py)

    policies = ocp.checkpoint_managers
    steps = sorted(saved)
    chosen: list[Any] = [policies.LatestN(n=max_to_keep)]
    if keep_time is not None:
        chosen.append(policies.EveryNSeconds(interval_secs=int(keep_time.total_seconds())))
    infos = [_Info(s, datetime.datetime.fromtimestamp(saved[s] or 0.0, tz=datetime.timezone.utc))
             for s in steps]
    keep = policies.AnyPreservationPolicy(chosen).should_preserve(
        infos, context=policies.PreservationContext()
    )
    return [s for s, k in zip(steps, keep) if not k]
