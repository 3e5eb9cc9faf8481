"""`list_variables` / `load_variable` (public) with the registered components' readers, so
that a component's variables keep their names (`embedding/<table>`: whole tables).

The readers live with their components (estimator/components.py registers them);
checkpoint/reader.py does the reading.
"""

from __future__ import annotations

import os
import re

import numpy as np

from tpu_estimator.checkpoint import reader
from tpu_estimator.estimator.components import variable_readers


def list_variables(ckpt_dir_or_file: str | os.PathLike[str]) -> list[tuple[str, tuple[int, ...]]]:
    return reader.list_variables(ckpt_dir_or_file, readers=variable_readers())


def load_variable(ckpt_dir_or_file: str | os.PathLike[str], name: str) -> np.ndarray:
    return reader.load_variable(ckpt_dir_or_file, name, readers=variable_readers())


def load_variables(ckpt_dir_or_file: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """Every saved variable by name (`global_step` included when saved)."""
    return reader.load_variables(ckpt_dir_or_file, readers=variable_readers())


def _public(doc: str | None) -> str:
    """A reader's docstring without its `readers` argument (passed here)."""
    return re.sub(r"\n      readers: [^\n]*(\n        [^\n]*)*", "", doc or "")


list_variables.__doc__ = _public(reader.list_variables.__doc__)
load_variable.__doc__ = _public(reader.load_variable.__doc__)
