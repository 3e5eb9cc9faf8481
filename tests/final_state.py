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

    def params_by_name(self) -> dict:
        """The kept state's parameters as numpy arrays, by their checkpoint names
        ("Dense_0/kernel")."""
        import jax
        import numpy as np

        params = jax.tree.map(np.asarray, jax.device_get(self.state.params))
        return {"/".join(str(k.key) for k in path): v for path, v in jax.tree_util.tree_flatten_with_path(params)[0]}
