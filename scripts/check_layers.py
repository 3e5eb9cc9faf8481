"""Checks the package's module graph: layers, circles and reaches into private members.

Usage: python scripts/check_layers.py [--graph]

Rules (ARCHITECTURE.md, "Layers"):
  * an import never runs from a lower layer to a higher one: neither at module
    level nor inside a function (a deferred import is still a dependency),
    except the deferred ones listed in DEFERRED_UPWARD with their reason;
  * module-level imports form no circle;
  * no module imports another package's private (`_name`) module;
  * outside `estimator/tpu_estimator.py` (the facade), no code touches an
    underscore member of another object (`obj._x`; `self._x` and `cls._x` are
    the object's own; NamedTuple's `_replace/_fields/_asdict/_make` are public).

Exits 1 and lists every violation; `--graph` also prints the edges.
Imports inside functions and under `if TYPE_CHECKING:` are not module-level: they
make no edge of the graph (so no circle); those inside functions are checked for
layers too, those under `if TYPE_CHECKING:` (annotations only) are not.
The modules named by a `_LAZY` dict (a package's PEP 562 `__getattr__`, loading its
re-exported names on first access) are deferred imports, checked as those in functions.
"""

from __future__ import annotations

import ast
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = "tpu_estimator"

# Deferred (function-level) upward imports allowed, with the reason. The facade documents
# every entry point, export included; the exporter is built on the core one layer up.
DEFERRED_UPWARD = {
    ("tpu_estimator.estimator.tpu_estimator", "tpu_estimator.export.exporter"):
        "TPUEstimator.export_saved_model delegates to the exporter, loaded on first use",
}

# Lower numbers are lower layers. A module may import its own layer or below.
LAYERS = {
    "errors": 0,
    "version": 0,
    "api": 0,
    "metrics": 0,
    "model": 0,
    "parallel": 0,
    "checkpoint": 0,
    "paths": 0,
    "embedding": 0,
    "averaging": 0,
    "feeding": 1,
    "summary": 1,
    "loops": 1,
    "hooks": 2,
    "estimator": 3,
    "export": 4,
    "serving": 5,
    "__init__": 6,
}
PUBLIC_UNDERSCORE = {"_replace", "_fields", "_asdict", "_make", "_field_defaults"}
FACADE = f"{PACKAGE}/estimator/tpu_estimator.py"


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def layer_of(module: str) -> int:
    parts = module.split(".")
    if len(parts) == 1:
        return LAYERS["__init__"]
    return LAYERS[parts[1]]


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported(node: ast.Import | ast.ImportFrom, this: str, is_package: bool) -> list[str]:
    """The package's modules (or names in them) one import statement names."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.startswith(PACKAGE)]
    base = node.module or ""
    if node.level:
        anchor = this.split(".") if is_package else this.split(".")[:-1]
        anchor = anchor[: len(anchor) - node.level + 1]
        base = ".".join([*anchor, base] if base else anchor)
    if not base.startswith(PACKAGE):
        return []
    return [base, *(f"{base}.{a.name}" for a in node.names)]


def module_imports(tree: ast.Module, this: str, is_package: bool) -> list[str]:
    """Modules of the package imported at module level (not in functions, not TYPE_CHECKING)."""
    found: list[str] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found.extend(imported(node, this, is_package))
            elif isinstance(node, ast.If) and not _is_type_checking(node):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)

    visit(tree.body)
    return found


def function_imports(tree: ast.Module, this: str, is_package: bool) -> list[tuple[int, list[str]]]:
    """(line, modules) of the package imports inside functions: they run when the function does."""
    found: dict[int, list[str]] = {}
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    found.setdefault(node.lineno, imported(node, this, is_package))
    return sorted(found.items())


def lazy_imports(tree: ast.Module) -> list[tuple[int, list[str]]]:
    """(line, [module]) of each key of a module-level `_LAZY = {"module": names}` (a package's
    PEP 562 `__getattr__` imports them on first access): deferred imports, checked as such."""
    found: list[tuple[int, list[str]]] = []
    for node in tree.body:
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
                and any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in node.targets)):
            for key in node.value.keys:
                if isinstance(key, ast.Constant) and str(key.value).startswith(PACKAGE):
                    found.append((key.lineno, [key.value]))
    return found


def private_reaches(tree: ast.Module) -> list[tuple[int, str]]:
    """`obj._x` where obj is not `self`/`cls` (line, text)."""
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        name = node.attr
        if not name.startswith("_") or name.startswith("__") or name in PUBLIC_UNDERSCORE:
            continue
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            continue
        out.append((node.lineno, f"{ast.unparse(node.value)}.{name}"))
    return out


def check() -> tuple[list[str], list[tuple[str, str]]]:
    files = sorted((ROOT / PACKAGE).rglob("*.py"))
    modules = {module_name(f): f for f in files}
    edges: set[tuple[str, str]] = set()
    problems: list[str] = []
    for mod, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        rel = str(path.relative_to(ROOT))
        for target in module_imports(tree, mod, path.name == "__init__.py"):
            if target not in modules or target == mod:
                continue  # a name imported from a module, or the package itself
            if mod == target.rsplit(".", 1)[0] and path.name == "__init__.py":
                pass  # a package's __init__ re-exporting its own modules
            edges.add((mod, target))
            if layer_of(target) > layer_of(mod):
                problems.append(f"{rel}: upward import of {target} (layer {layer_of(target)} > {layer_of(mod)})")
            leaf = target.rsplit(".", 1)[-1]
            same_package = target.split(".")[:2] == mod.split(".")[:2]
            if leaf.startswith("_") and not leaf.startswith("__") and not same_package:
                problems.append(f"{rel}: imports the private module {target} of another package")
        deferred = function_imports(tree, mod, path.name == "__init__.py") + lazy_imports(tree)
        for line, targets in deferred:
            targets = [t for t in targets if t in modules]
            # `from pkg import mod` names pkg and pkg.mod: report the module, the most specific
            for target in [t for t in targets if not any(o.startswith(t + ".") for o in targets)]:
                if layer_of(target) > layer_of(mod) and (mod, target) not in DEFERRED_UPWARD:
                    problems.append(
                        f"{rel}:{line}: upward import inside a function of {target} "
                        f"(layer {layer_of(target)} > {layer_of(mod)})"
                    )
        if rel != FACADE:
            for line, text in private_reaches(tree):
                problems.append(f"{rel}:{line}: reaches into a private member: {text}")
    problems.extend(f"import circle: {' -> '.join(c)}" for c in circles(edges))
    return problems, sorted(edges)


def circles(edges: set[tuple[str, str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    graph: dict[str, list[str]] = {}
    for a, b in edges:
        graph.setdefault(a, []).append(b)
        graph.setdefault(b, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def main() -> int:
    problems, edges = check()
    if "--graph" in sys.argv:
        for a, b in edges:
            print(f"{a} -> {b}")
    for p in problems:
        print(p)
    print(f"{len(edges)} module-level imports, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
