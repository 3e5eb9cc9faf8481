"""What `evaluate()` records in `eval_dir`: event-file scalars and a JSON-lines log.

The log (`eval_dir/eval_results.jsonl`, one `{"global_step": .., metric: ..}`
per evaluation) is what early-stopping hooks and `BestExporter` read; no
TensorBoard needed to read it back.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

import jax
import numpy as np

from tpu_estimator.summary.writer import write_scalars

RESULTS_FILE = "eval_results.jsonl"


def _plain(value: Any) -> Any:
    arr = np.asarray(value)
    if arr.ndim == 0 and np.issubdtype(arr.dtype, np.number):
        return arr.item()
    return None


def record_eval(eval_dir: str, step: int, results: Mapping[str, Any]) -> None:
    """Writes the scalar results of one evaluation at `step` (process 0 only)."""
    if jax.process_index() != 0:
        return
    write_scalars(eval_dir, step, {k: v for k, v in results.items() if k != "global_step"})
    row = {k: _plain(v) for k, v in results.items()}
    row = {k: v for k, v in row.items() if v is not None}
    row["global_step"] = int(step)
    with open(os.path.join(eval_dir, RESULTS_FILE), "a") as f:
        f.write(json.dumps(row) + "\n")


def read_eval_results(eval_dir: str) -> dict[int, dict[str, float]]:
    """{global_step: results} of every evaluation recorded in `eval_dir` (the latest per step)."""
    path = os.path.join(eval_dir, RESULTS_FILE)
    out: dict[int, dict[str, float]] = {}
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                row = json.loads(line)
                out[int(row["global_step"])] = row
    return dict(sorted(out.items()))
