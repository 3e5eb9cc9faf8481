"""`tpu-estimator` on the base install (no `serve` extra): `--help` works, `serve` says what to install.

Each check runs the console script's entry point (read from pyproject.toml) in a
fresh interpreter where the `serve` extra's modules cannot be imported:
`sys.modules[name] = None` makes `import name` raise ImportError, as on a
machine without the package.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SERVE_EXTRA = ("starlette", "uvicorn", "h11")


def run_cli(args: list[str], *, blocked: tuple[str, ...] = SERVE_EXTRA) -> subprocess.CompletedProcess:
    target = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["tpu-estimator"]
    module, function = target.split(":")
    code = (
        "import sys\n"
        f"for name in {blocked!r}: sys.modules[name] = None\n"
        f"from {module} import {function} as main\n"
        "sys.exit(main())\n"
    )
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


@pytest.mark.parametrize("args", [["--help"], ["serve", "--help"]])
def test_help_works_without_the_serve_extra(args):
    done = run_cli(args)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert "usage: tpu-estimator" in done.stdout
    assert ("--model_base_path" if "serve" in args else "serve") in done.stdout


@pytest.mark.parametrize("missing", SERVE_EXTRA)
def test_serve_without_the_extra_says_what_to_install(missing, tmp_path):
    done = run_cli(["serve", "--model_base_path", str(tmp_path)], blocked=(missing,))
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    assert f"({missing} is missing)" in done.stderr
    assert "pip install 'tpu_estimator[serve]'" in done.stderr


def test_blocking_is_real(tmp_path):
    """The same probe with nothing blocked passes the extras check: it stops at the next one (a bad
    version policy, exit 2 before anything is served), so the tests above see the block."""
    done = run_cli(["serve", "--model_base_path", str(tmp_path), "--model_version_policy", "bogus"],
                   blocked=())
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "pip install" not in done.stderr
    assert "tpu-estimator serve:" in done.stderr and "bogus" in done.stderr
