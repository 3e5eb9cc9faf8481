#!/usr/bin/env bash
# Creates .venv (if needed), installs the package, runs the digits example on 8 CPU devices.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[examples]'
exec .venv/bin/python examples/digits.py "$@"
