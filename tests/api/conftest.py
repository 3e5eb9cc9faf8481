"""Makes the repository importable when `tpu_estimator` is not pip-installed.

`.venv/bin/pytest` does not put the working directory on `sys.path` (unlike
`python -m pytest`); the proper fix is `pythonpath = ["."]` in pyproject's
pytest options or `pip install -e .`. Importing nothing else keeps the 8-device
XLA_FLAGS of tests/conftest.py effective.
"""

import pathlib
import sys

_ROOT = str(pathlib.Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
