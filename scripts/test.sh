#!/usr/bin/env bash
# Creates .venv (if needed), installs the package with its test extras, runs the suite.
# The tests set XLA_FLAGS themselves (tests/conftest.py): 8 fake CPU devices.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
exec .venv/bin/python -m pytest -q "$@"
