"""Checks the package's module graph: floors, circles and reaches into private members.

Usage: python scripts/check_layers.py [--graph]

The floors are the table of ARCHITECTURE.md's "Layers" section (the one source of
truth: this script reads it). Each row names packages of `tpu_estimator/` (`api`) or
single modules (`api.checks`, on a floor of their own); a module belongs to the most
specific row that names it or a package above it; `__init__` is the package's own
`__init__.py`. Rules:
  * every import, at module level, inside a function, under `if TYPE_CHECKING:` or
    named by a package's lazy `_LAZY` table (PEP 562), runs from a row to a row on a
    LOWER floor (imports within a row are free);
  * each row is on its real floor: 0 if it imports no other row, else one above the
    highest row it imports (a floor set too high is reported as well as one too low);
  * there is no import circle between modules, counting the same four kinds of import
    (`from pkg import mod` counts as an import of `mod`);
  * no module imports another package's private (`_name`) module;
  * outside `estimator/tpu_estimator.py` (the facade), no code touches an
    underscore member of another object (`obj._x`; `self._x` and `cls._x` are
    the object's own; NamedTuple's `_replace/_fields/_asdict/_make` are public).

Exits 1 and lists every violation; `--graph` also prints the edges and each row's floor.
"""

from __future__ import annotations

import ast
import dataclasses
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = "tpu_estimator"
PUBLIC_UNDERSCORE = {"_replace", "_fields", "_asdict", "_make", "_field_defaults"}
FACADE = f"{PACKAGE}/estimator/tpu_estimator.py"
# Circles another change is breaking, with who breaks them. An entry whose circle no longer
# exists is reported: remove it then. Keep this empty otherwise.
BEING_BROKEN: dict[tuple[str, str], str] = {}
# A floor row of ARCHITECTURE.md's table: `<floor>  <name>, <name>  <what it is>`.
_ROW = re.compile(r"^\s*(\d+)\s+([\w.]+(?:,\s*[\w.]+)*)(?:\s{2,}.*)?$")


@dataclasses.dataclass(frozen=True)
class Import:
    """One import of a package module: where it is, what it names, and how it runs."""

    line: int
    target: str
    kind: str  # "module level", "inside a function", "under TYPE_CHECKING", "lazy (_LAZY)"


def read_floors(architecture: pathlib.Path) -> dict[str, int]:
    """{row name: floor} from the first fenced block of the "## Layers" section."""
    text = architecture.read_text()
    section = text.split("\n## Layers", 1)
    if len(section) < 2 or "```" not in section[1]:
        raise SystemExit(f"{architecture}: no '## Layers' section with a fenced floors table; add it back.")
    block = section[1].split("```", 2)[1]
    floors: dict[str, int] = {}
    for line in block.splitlines():
        match = _ROW.match(line)
        if match:
            for name in match.group(2).split(","):
                floors[name.strip()] = int(match.group(1))
    if not floors:
        raise SystemExit(f"{architecture}: the '## Layers' table has no '<floor>  <names>' row.")
    return floors


def module_name(path: pathlib.Path, root: pathlib.Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def row_of(module: str, floors: dict[str, int]) -> str | None:
    """The most specific row naming `module` or a package above it (None: no row)."""
    if module == PACKAGE:
        return "__init__" if "__init__" in floors else None
    parts = module.split(".")[1:]
    for n in range(len(parts), 0, -1):
        name = ".".join(parts[:n])
        if name in floors:
            return name
    return None


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


def imports_of(tree: ast.Module, this: str, is_package: bool, modules: set[str]) -> list[Import]:
    """Every import of a package module in `tree`, with how it runs. `from pkg import mod`
    names pkg and pkg.mod: the most specific module is the one reported."""
    found: list[Import] = []

    def add(node: ast.Import | ast.ImportFrom, kind: str) -> None:
        targets = [t for t in imported(node, this, is_package) if t in modules and t != this]
        for target in [t for t in targets if not any(o.startswith(t + ".") for o in targets)]:
            found.append(Import(node.lineno, target, kind))

    def visit(nodes: list[ast.AST], kind: str) -> None:
        for node in nodes:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                add(node, kind)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(list(ast.iter_child_nodes(node)), "inside a function")
            elif isinstance(node, ast.If) and _is_type_checking(node):
                visit(node.body, "under TYPE_CHECKING")
                visit(node.orelse, kind)
            else:
                visit(list(ast.iter_child_nodes(node)), kind)

    visit(tree.body, "module level")
    for node in tree.body:  # a package's PEP 562 `_LAZY = {"module": names}`: loaded on first access
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
                and any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in node.targets)):
            for key in node.value.keys:
                if isinstance(key, ast.Constant) and key.value in modules:
                    found.append(Import(key.lineno, key.value, "lazy (_LAZY)"))
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


def check(root: pathlib.Path | None = None) -> tuple[list[str], list[tuple[str, str]]]:
    """(problems, module edges) of the package under `root` against `root/ARCHITECTURE.md`."""
    root = ROOT if root is None else root
    architecture = root / "ARCHITECTURE.md"
    floors = read_floors(architecture)
    files = sorted((root / PACKAGE).rglob("*.py"))
    modules = {module_name(f, root): f for f in files}
    edges: set[tuple[str, str]] = set()
    row_edges: dict[str, set[str]] = {}
    problems: list[str] = []
    for mod, path in modules.items():
        rel = str(path.relative_to(root))
        row = row_of(mod, floors)
        if row is None:
            problems.append(
                f"{rel}: {mod} has no floor: add its package (or it) to the table of {architecture.name}'s "
                "'Layers' section"
            )
        tree = ast.parse(path.read_text(), str(path))
        for imp in imports_of(tree, mod, path.name == "__init__.py", set(modules)):
            edges.add((mod, imp.target))
            target_row = row_of(imp.target, floors)
            leaf = imp.target.rsplit(".", 1)[-1]
            same_package = imp.target.split(".")[:2] == mod.split(".")[:2]
            if leaf.startswith("_") and not leaf.startswith("__") and not same_package:
                problems.append(f"{rel}:{imp.line}: imports the private module {imp.target} of another package")
            if row is None or target_row is None or target_row == row:
                continue
            row_edges.setdefault(row, set()).add(target_row)
            if floors[target_row] >= floors[row]:
                problems.append(
                    f"{rel}:{imp.line}: import {imp.kind} of {imp.target} goes "
                    f"{'up' if floors[target_row] > floors[row] else 'sideways'}: {target_row} is on floor "
                    f"{floors[target_row]}, {row} on {floors[row]} ({architecture.name}, 'Layers'); an import "
                    "only goes to a lower floor: pass what the callee needs (a value, a Protocol) instead"
                )
        if rel != FACADE:
            for line, text in private_reaches(tree):
                problems.append(f"{rel}:{line}: reaches into a private member: {text}")
    used = {row_of(m, floors) for m in modules}
    for name in floors:
        if name not in used:
            problems.append(f"{architecture.name}: the 'Layers' row {name!r} names no module of {PACKAGE}/: remove it")
    real = real_floors({r: row_edges.get(r, set()) for r in floors if r in used})
    for name, floor in sorted(real.items(), key=lambda item: (item[1], item[0])):
        if floors[name] != floor:
            problems.append(
                f"{architecture.name}: {name} is on floor {floors[name]} in 'Layers', but what it imports puts it "
                f"on floor {floor}: write {floor} (a row's floor is 0, or one above the highest row it imports)"
            )
    found = [tuple(c) for c in circles(edges)]
    problems.extend(f"import circle: {' -> '.join(c)}" for c in found if c not in BEING_BROKEN)
    problems.extend(
        f"scripts/check_layers.py: BEING_BROKEN lists the circle {' -> '.join(c)}, which is gone: remove it"
        for c in BEING_BROKEN if c not in found and all(m in modules for m in c)
    )
    return problems, sorted(edges)


def real_floors(graph: dict[str, set[str]]) -> dict[str, int]:
    """Each row's real floor (the longest chain of imports below it); {} if the rows import in a
    circle (then the upward imports are reported, and no floor is right)."""
    if circles({(a, b) for a, targets in graph.items() for b in targets}):
        return {}
    floors: dict[str, int] = {}

    def floor(row: str) -> int:
        if row not in floors:
            floors[row] = 1 + max((floor(t) for t in graph.get(row, ())), default=-1)
        return floors[row]

    for row in graph:
        floor(row)
    return floors


def circles(edges: set[tuple[str, str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    graph: dict[str, list[str]] = {}
    for a, b in sorted(edges):
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
    for circle, why in BEING_BROKEN.items():
        print(f"note: import circle {' -> '.join(circle)} left to another change ({why})")
    if "--graph" in sys.argv:
        for a, b in edges:
            print(f"{a} -> {b}")
    for p in problems:
        print(p)
    print(f"{len(edges)} imports between modules (all kinds), {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
