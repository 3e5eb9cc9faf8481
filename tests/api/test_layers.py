"""The package's module graph: floors read from ARCHITECTURE.md, no import circle, no reach
into private members."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def check_layers():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import check_layers
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    return check_layers


def test_module_graph_keeps_its_floors():
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "check_layers.py")], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert " 0 problems" in out.stdout


def test_the_floors_are_read_from_architecture_md(check_layers):
    floors = check_layers.read_floors(ROOT / "ARCHITECTURE.md")
    assert floors["api.checks"] == 0 and floors["__init__"] == max(floors.values())
    assert floors["api"] < floors["parallel"] < floors["loops"] < floors["estimator"] < floors["export"]
    assert floors["estimator.tpu_estimator"] > floors["export"]  # the facade loads the exporter


def _write(root: pathlib.Path, files: dict[str, str], table: str) -> None:
    for name, text in files.items():
        path = root / "tpu_estimator" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (root / "ARCHITECTURE.md").write_text(f"# A\n\n## Layers\n\n```\n{table}```\n")


def test_the_checker_finds_every_kind_of_upward_import_a_circle_and_a_private_reach(check_layers, tmp_path):
    table = "2  hooks, other  built-in hooks\n1  api  what the user hands in\n0  errors\n"
    _write(tmp_path, {
        "__init__.py": "", "errors.py": "", "api/__init__.py": "", "hooks/__init__.py": "", "other/__init__.py": "",
        "api/a.py": "from tpu_estimator.hooks import h\n",  # floor 1 -> 2 at module level
        "api/b.py": "def f():\n    from tpu_estimator.hooks import g\n",  # ... inside a function
        "api/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import tpu_estimator.hooks.h\n",
        "errors.py": "import tpu_estimator.api.c\n",  # floor 0 -> 1
        "hooks/h.py": "from tpu_estimator.hooks import g\nfrom tpu_estimator.other import o\n",  # sideways
        "hooks/g.py": "def f(x):\n    from tpu_estimator.hooks import h\n    return x._y\n",  # deferred circle
        "other/o.py": "",
        "stray/s.py": "",
    }, table)
    problems, _ = check_layers.check(tmp_path)
    text = "\n".join(problems)
    assert "tpu_estimator/api/a.py:1: import module level of tpu_estimator.hooks.h goes up: hooks is on floor 2" in text
    assert "tpu_estimator/api/b.py:2: import inside a function of tpu_estimator.hooks.g goes up" in text
    assert "tpu_estimator/api/c.py:3: import under TYPE_CHECKING of tpu_estimator.hooks.h goes up" in text
    assert "tpu_estimator/errors.py:1: import module level of tpu_estimator.api.c goes up" in text
    assert "tpu_estimator/hooks/h.py:2: import module level of tpu_estimator.other.o goes sideways" in text
    assert "import circle: tpu_estimator.hooks.g -> tpu_estimator.hooks.h" in text
    assert "tpu_estimator/hooks/g.py:3: reaches into a private member: x._y" in text
    assert "tpu_estimator.stray.s has no floor: add its package (or it) to the table" in text


def test_a_floor_set_too_high_or_naming_nothing_is_reported(check_layers, tmp_path):
    table = "3  hooks\n2  gone\n1  api, api.checks\n0  errors\n"
    _write(tmp_path, {
        "__init__.py": "", "errors.py": "", "api/__init__.py": "", "api/checks.py": "", "hooks/__init__.py": "",
        "hooks/h.py": "from tpu_estimator.api import checks\n",
    }, table)
    problems, _ = check_layers.check(tmp_path)
    text = "\n".join(problems)
    assert "hooks is on floor 3 in 'Layers', but what it imports puts it on floor 1: write 1" in text
    assert "api.checks is on floor 1 in 'Layers', but what it imports puts it on floor 0: write 0" in text
    assert "the 'Layers' row 'gone' names no module of tpu_estimator/: remove it" in text


def test_an_upward_import_planted_in_a_copy_of_the_package_is_reported(check_layers, tmp_path):
    shutil.copytree(ROOT / "tpu_estimator", tmp_path / "tpu_estimator", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "ARCHITECTURE.md", tmp_path / "ARCHITECTURE.md")
    assert check_layers.check(tmp_path)[0] == []
    paths = tmp_path / "tpu_estimator" / "paths.py"
    paths.write_text(paths.read_text() + "\n\ndef _planted():\n    from tpu_estimator.serving import app  # noqa\n")
    runtime = tmp_path / "tpu_estimator" / "estimator" / "runtime.py"
    runtime.write_text("from tpu_estimator.estimator import core\n" + runtime.read_text())
    problems, _ = check_layers.check(tmp_path)
    text = "\n".join(problems)
    assert "tpu_estimator/paths.py" in text and "inside a function of tpu_estimator.serving.app goes up" in text
    assert "import circle: tpu_estimator.estimator.core -> tpu_estimator.estimator.runtime" in text
