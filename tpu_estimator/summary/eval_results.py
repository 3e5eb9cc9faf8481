"""What `evaluate()` records in `eval_dir`: event-file scalars and a JSON-lines log.

The log (`eval_dir/eval_results.jsonl`, one `{"global_step": .., metric: ..}`
per evaluation) is what early-stopping hooks and `BestExporter` read; no
TensorBoard needed to read it back. On an object store (`gs://`), which cannot
append, each evaluation rewrites the log whole (read, add the row, write one
object): one evaluator per `eval_dir`, as with the event files.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

import jax
import numpy as np

from tpu_estimator.paths import as_path, is_local
from tpu_estimator.storage import bounded
from tpu_estimator.summary.writer import write_scalars

RESULTS_FILE = "eval_results.jsonl"


def _plain(value: Any) -> Any:
    arr = np.asarray(value)
    if arr.ndim == 0 and np.issubdtype(arr.dtype, np.number):
        return arr.item()
    return None


def record_eval(eval_dir: str, step: int, results: Mapping[str, Any]) -> None:
    """Writes the scalar results of one evaluation at `step` (process 0 only).

    Raises:
      CheckpointStorageError: an object store did not answer for `storage_timeout_s`.
    """
    if jax.process_index() != 0:
        return
    write_scalars(eval_dir, step, {k: v for k, v in results.items() if k != "global_step"})
    row = {k: _plain(v) for k, v in results.items()}
    row = {k: v for k, v in row.items() if v is not None}
    row["global_step"] = int(step)
    line = json.dumps(row) + "\n"
    path = as_path(eval_dir, arg="eval_dir") / RESULTS_FILE
    if is_local(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write(line)
    else:  # (gcsfs' own retries take ~31 s and more: the deadline is storage_timeout_s)
        bounded(lambda: path.write_text((path.read_text() if path.exists() else "") + line),
                uri=str(path), what=f"writing {RESULTS_FILE}")


def read_eval_results(eval_dir: str) -> dict[int, dict[str, float]]:
    """{global_step: results} of every evaluation recorded in `eval_dir` (the latest per step).

    Raises:
      CheckpointStorageError: an object store did not answer for `storage_timeout_s`.
    """
    path = as_path(eval_dir, arg="eval_dir") / RESULTS_FILE
    text = bounded(lambda: path.read_text() if path.exists() else "", uri=str(path),
                   what=f"reading {RESULTS_FILE}")
    out: dict[int, dict[str, float]] = {}
    for line in text.splitlines():
        line = line.strip()
        if line:
            row = json.loads(line)
            out[int(row["global_step"])] = row
    return dict(sorted(out.items()))
