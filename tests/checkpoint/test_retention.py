"""Which steps a staged save deletes: Orbax's preservation policies (checkpoint/retention.py)."""

from __future__ import annotations

import datetime

from tpu_estimator.checkpoint.retention import to_delete

HOUR = 3600.0


def test_the_newest_max_to_keep_steps_stay():
    saved = {s: 1000.0 + s for s in (0, 4, 8, 12, 16)}
    assert to_delete(saved, max_to_keep=2, keep_time=None) == [0, 4, 8]
    assert to_delete(saved, max_to_keep=5, keep_time=None) == []
    assert to_delete(saved, max_to_keep=None, keep_time=None) == []  # keep every step


def test_keep_time_also_keeps_one_step_per_interval():
    # saved at 0, 0.5, 1.0, 1.6, 2.0, 2.1 hours: one per hour stays (0, 1.0, 2.0), and the newest 2
    times = [0.0, 0.5, 1.0, 1.6, 2.0, 2.1]
    saved = {i * 10: t * HOUR for i, t in enumerate(times)}
    assert to_delete(saved, max_to_keep=2, keep_time=datetime.timedelta(hours=1)) == [10, 30]
