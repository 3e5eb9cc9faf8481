#!/usr/bin/env bash
# Creates .venv (if needed), installs the package, runs the digits example on 8 CPU devices.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
if .venv/bin/python -c 'import tpu_estimator, sklearn, httpx, uvicorn' >/dev/null 2>&1; then
  quiet=-q  # installed before: only refresh the editable install
else
  echo "Installing tpu_estimator with the examples' packages (JAX, Flax, Optax, Orbax, scikit-learn," \
       "the model server) into .venv: about a minute on the first run."
  quiet=
fi
# shellcheck disable=SC2086  # $quiet is one flag or nothing
.venv/bin/python -m pip install $quiet --disable-pip-version-check -e '.[examples]'
exec .venv/bin/python examples/digits.py "$@"
