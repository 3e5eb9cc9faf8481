"""Start-up cost: `import tpu_estimator` loads no dependency; each public name loads its own.

Orbax (with tensorstore), tensorboardX (histogram and image summaries only), the server
(starlette, uvicorn, httpx), grain, TensorFlow and protobuf load when a
checkpoint, a summary, an export, the server or a parsing receiver is first
used, not at import. Each check runs in a fresh interpreter: this process has
imported them all already.
"""

from __future__ import annotations

import ast
import importlib
import json
import pathlib
import subprocess
import sys

import pytest

import tpu_estimator

# Loaded only by the feature that needs it (never by `import tpu_estimator` or its names).
LATER = ["orbax", "tensorstore", "tensorboardX", "tensorboard", "starlette", "uvicorn", "httpx",
         "grain", "tensorflow"]


def loaded_after(code: str) -> dict:
    """Runs `code` in a fresh interpreter; returns its top-level modules and `tpu_estimator`'s."""
    probe = (
        f"{code}\nimport json, sys\n"
        "print(json.dumps({'top': sorted({m.split('.')[0] for m in sys.modules}),"
        " 'ours': sorted(m for m in sys.modules if m.startswith('tpu_estimator'))}))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_import_loads_no_dependency():
    loaded = loaded_after("import tpu_estimator")
    heavy = set(LATER) | {"jax", "flax", "optax", "numpy", "google", "safetensors"}
    assert heavy.isdisjoint(loaded["top"]), sorted(heavy & set(loaded["top"]))
    assert loaded["ours"] == ["tpu_estimator", "tpu_estimator.version"]


def test_every_public_name_resolves_without_the_later_dependencies():
    code = (
        "import tpu_estimator\n"
        "from tpu_estimator import *\n"
        "missing = [n for n in tpu_estimator.__all__ if n not in dir(tpu_estimator)]\n"
        "assert not missing, missing\n"
        "assert all(getattr(tpu_estimator, n) is globals()[n] for n in tpu_estimator.__all__)\n"
    )
    loaded = loaded_after(code)
    assert set(LATER).isdisjoint(loaded["top"]), sorted(set(LATER) & set(loaded["top"]))
    assert "tpu_estimator.serving.app" not in loaded["ours"]


def test_a_training_script_imports_no_checkpoint_or_summary_library():
    loaded = loaded_after(
        "import tpu_estimator as te\n"
        "te.TPUEstimator, te.RunConfig, te.TPUConfig, te.TPUEstimatorSpec, te.ModeKeys\n"
    )
    assert set(LATER).isdisjoint(loaded["top"]), sorted(set(LATER) & set(loaded["top"]))


def test_the_declared_imports_are_what_the_names_load():
    """The `if TYPE_CHECKING:` imports (what type checkers read) and the lazy loading agree."""
    tree = ast.parse(pathlib.Path(tpu_estimator.__file__).read_text())
    declared = [
        (node.module, alias.name, alias.asname or alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tpu_estimator")
        for alias in node.names
    ]
    assert len(declared) > 60
    for module, name, bound in declared:
        source = importlib.import_module(module)
        expected = (
            importlib.import_module(f"{module}.{name}") if module == "tpu_estimator" else getattr(source, name)
        )
        assert getattr(tpu_estimator, bound) is expected, (module, name)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchThing'"):
        tpu_estimator.NoSuchThing  # noqa: B018
