"""A hook that keeps the training state after the last loop (shared by tests and the
scripts they run as processes, which have the repository root on their path)."""

from __future__ import annotations

import tpu_estimator as te


class FinalState(te.SessionRunHook):
    """Keeps the training state after the last loop (hooks may fetch "state")."""

    state = None

    def before_run(self, run_context):
        return te.SessionRunArgs("state")

    def after_run(self, run_context, run_values):
        self.state = run_values.results
