"""What each imported package adds to a process's resident memory, measured as it loads.

    with ImportMemory() as imports:
        ...  # imports (at start-up or lazily, inside calls)
    imports.by_package()  # {"jax": 131.0, "tensorstore": 14.2, ...} MB: each package's own
    imports.roots()       # {"tensorboardX": 23.0, ...}: imports begun outside any other, with
                          # all they loaded (what importing each cost the process)

A finder first on `sys.meta_path` wraps each module's loader: VmRSS is read before
and after the module is created (an extension's shared library is mapped then) and
executed. A module's own share is that difference less what the modules it imported
meanwhile took; the shares are summed per top-level package. An import begun outside any
other (at a module's top level or lazily in a function) is a root: its figure counts all
it loaded that was not loaded yet. Only this process's
imports are seen, and only while the block is open; memory that another thread
allocates during an import is counted to that import (imports at start-up run alone).
"""

from __future__ import annotations

import collections
import importlib.abc
import sys

from memory import status_mb  # (benchmarks/memory.py: /proc/self/status fields in MB)


class _Measured(importlib.abc.Loader):
    """A loader that forwards to `inner`, measuring the resident memory its create/exec add."""

    def __init__(self, inner, owner: "ImportMemory", top: str) -> None:
        self.inner, self.owner, self.top = inner, owner, top

    def __getattr__(self, name):  # get_data, get_resource_reader, is_package ...
        return getattr(self.inner, name)

    def create_module(self, spec):
        return self.owner.measure(self.top, lambda: self.inner.create_module(spec))

    def exec_module(self, module):
        return self.owner.measure(self.top, lambda: self.inner.exec_module(module))


class ImportMemory(importlib.abc.MetaPathFinder):
    """Resident memory per top-level package, as modules load while the block is open."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = collections.defaultdict(float)
        self.rooted: dict[str, float] = collections.defaultdict(float)
        self._children: list[float] = []  # per open measurement: what nested imports took
        self._tops: list[str] = []  # per open measurement: its top-level package
        self._busy = False

    def find_spec(self, fullname, path, target=None):
        if self._busy:
            return None
        self._busy = True
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._busy = False
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _Measured(spec.loader, self, fullname.split(".")[0])
        return spec

    def measure(self, top: str, fn):
        before = status_mb("VmRSS")
        self._children.append(0.0)
        self._tops.append(top)
        try:
            return fn()
        finally:
            nested = self._children.pop()
            self._tops.pop()
            took = status_mb("VmRSS") - before
            self.totals[top] += took - nested
            if self._children:
                self._children[-1] += took
            if not self._tops:  # a root: imported from code that is no import
                self.rooted[top] += took

    def by_package(self) -> dict[str, float]:
        """{top-level package: MB}, largest first."""
        return dict(sorted(self.totals.items(), key=lambda kv: -kv[1]))

    def roots(self) -> dict[str, float]:
        """{top-level package of a root import: MB with all it loaded}, largest first."""
        return dict(sorted(self.rooted.items(), key=lambda kv: -kv[1]))

    def __enter__(self) -> "ImportMemory":
        sys.meta_path.insert(0, self)
        return self

    def __exit__(self, *exc) -> None:
        sys.meta_path.remove(self)
