"""A summary write the storage refuses is our CheckpointStorageError naming the logdir."""

from __future__ import annotations

import re

import pytest

import tpu_estimator as te
from tpu_estimator.summary.writer import FileWriter


def test_a_refused_summary_write_is_a_storage_error_naming_the_logdir(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the logdir's folder goes")
    logdir = str(blocker / "events")
    writer = FileWriter(logdir)
    writer.scalar("loss", 1.0, step=1)
    with pytest.raises(te.CheckpointStorageError, match=re.escape(f"writing summaries to logdir={logdir!r} failed")):
        writer.flush()
    writer.close()
