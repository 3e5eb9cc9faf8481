"""The versions a server holds: those of a `VersionPolicy` under a base directory, hot-reloaded.

A background thread polls `export_dir_base`; the versions the policy wants
(default: the newest) among the complete exports (numeric directories holding
manifest.json; exports appear atomically) are loaded and warmed up (each
allowed batch size compiled) before the versions they replace are unloaded
(TF Serving's availability-preserving order). Requests already queued on an
unloaded version finish there. Each version's state is kept for TF Serving's
model status API.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import weakref
from typing import Any, Protocol, Sequence

import jax
import numpy as np
from etils import epath

from tpu_estimator.export import manifest as mf
from tpu_estimator.export.loader import ExportedModel, Signature, load_exported
from tpu_estimator.feeding.host_memory import trim
from tpu_estimator.paths import as_uri, join
from tpu_estimator.serving.batcher import Batcher, BatchingOptions, Gate
from tpu_estimator.serving.version_policy import VersionPolicy

log = logging.getLogger("tpu_estimator.serving")


def batchable(sig: Signature) -> bool:
    """Row-batchable: every input and output has a symbolic batch dimension."""
    specs = list(sig.inputs.values()) + list(sig.outputs.values())
    return all(s["shape"][:1] == [None] for s in specs)


@dataclasses.dataclass
class LoadedVersion:
    """One loaded export with a batcher per batchable signature (and a gate for unbatched calls)."""

    version: int
    model: ExportedModel
    options: BatchingOptions
    batchers: dict[str, Batcher]
    gate: Gate = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.gate = Gate(self.options.max_enqueued_batches)

    def close(self) -> None:
        for b in self.batchers.values():
            b.close()

    def join(self, timeout: float) -> None:
        """Waits (after `close()`) until the batchers have run what was queued and ended."""
        deadline = time.monotonic() + timeout
        for b in self.batchers.values():
            b.join(max(0.0, deadline - time.monotonic()))


def _drain(versions: list[LoadedVersion]) -> None:
    for lv in versions:
        lv.join(_DRAIN_SECONDS)


_KEPT_ENDED = 16  # unloaded or failed versions still reported by the status API
_DRAIN_SECONDS = 10.0  # how long a reload waits for an unloaded version's batchers to finish


@dataclasses.dataclass(frozen=True)
class VersionState:
    """A version's state as TF Serving reports it (LOADING, AVAILABLE or END here)."""

    state: str
    error: str = ""

    def as_json(self, version: int) -> dict[str, Any]:
        return {"version": str(version), "state": self.state,
                "status": {"error_code": "UNKNOWN" if self.error else "OK", "error_message": self.error}}


class StoreEvents(Protocol):
    """What a store reports (serving/metrics.py's ServingMetrics records it)."""

    def load(self, model_path: str, ok: bool, seconds: float) -> None: ...

    def batch(self, rows: int, padded: int) -> None: ...


class ModelStore:
    """Serves the versions `version_policy` picks under `base`; `get(version)` returns one."""

    def __init__(
        self,
        base: str,
        *,
        tags: Sequence[str] | None = None,
        enable_batching: bool = True,
        batching_flags: dict[str, Any] | None = None,
        poll_seconds: float = 1.0,
        warmup: bool = True,
        version_policy: VersionPolicy | str = VersionPolicy(),
        events: StoreEvents | None = None,
    ) -> None:
        self.base = as_uri(base, arg="export_dir_base")
        self.policy = (version_policy if isinstance(version_policy, VersionPolicy)
                       else VersionPolicy.parse(version_policy))
        self._tags = tags
        self._enabled = enable_batching
        self._flags = dict(batching_flags or {})
        BatchingOptions.create(None, **self._flags)  # bad flags fail here, not at the first load
        self._poll = poll_seconds
        self._warmup = warmup
        self.events = events
        self._loaded: dict[int, LoadedVersion] = {}  # replaced whole, never mutated: readers take no lock
        self._states: dict[int, VersionState] = {}
        self._failed: set[int] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._retired: list[weakref.ref] = []  # unloaded versions' models until they are freed

    # --- versions ------------------------------------------------------------

    def versions_on_disk(self) -> list[int]:
        """The committed exports under `base`: `<timestamp>` directories holding a manifest
        (on an object store the manifest is written last: its commit marker)."""
        base = epath.Path(self.base)
        try:
            names = [p.name for p in base.iterdir()]
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(int(n) for n in names if n.isdigit() and (base / n / mf.MANIFEST_FILE).is_file())

    @property
    def current(self) -> LoadedVersion | None:
        """The newest loaded version (None before the first load)."""
        return self.get()

    @property
    def loaded_versions(self) -> list[int]:
        return sorted(self._loaded)

    def get(self, version: int | None = None) -> LoadedVersion | None:
        """That loaded version, or the newest one for None; None if it is not loaded."""
        loaded = self._loaded
        if version is None:
            return loaded[max(loaded)] if loaded else None
        return loaded.get(version)

    @property
    def ready(self) -> bool:
        """A version is AVAILABLE (Kubernetes' readiness)."""
        return bool(self._loaded)

    def queued_rows(self) -> int:
        """Rows waiting in the batchers' queues plus unbatched calls waiting or running."""
        return sum(sum(b.waiting_rows for b in lv.batchers.values()) + lv.gate.held
                   for lv in self._loaded.values())

    def status(self, version: int | None = None) -> list[dict[str, Any]] | None:
        """TF Serving's `model_version_status` entries, newest first (None: `version` unknown)."""
        states = dict(self._states)
        if version is not None:
            return [states[version].as_json(version)] if version in states else None
        return [states[v].as_json(v) for v in sorted(states, reverse=True)]

    def reload(self) -> bool:
        """Loads the versions the policy wants that are not loaded, then unloads those it no
        longer wants; True if anything changed. A version that fails to load is skipped (and
        reported as END with its error) for good."""
        closed: list[LoadedVersion] = []
        with self._lock:
            changed = self._update(closed)
        _drain(closed)  # their queued requests finish there
        closed.clear()
        with self._lock:
            self._trim_when_freed()
        return changed

    def _update(self, closed: list[LoadedVersion]) -> bool:
        on_disk = self.versions_on_disk()
        wanted = self.policy.select([v for v in on_disk if v not in self._failed])
        if not wanted:  # nothing (usable) on disk: keep serving what is loaded
            return False
        changed = False
        while missing := sorted(set(wanted) - set(self._loaded), reverse=True):  # newest first
            for version in missing:
                changed |= self._load_one(version)
            wanted = self.policy.select([v for v in on_disk if v not in self._failed])  # after failures
        for version in sorted(set(self._loaded) - set(wanted)):
            old = self._loaded[version]
            self._loaded = {v: lv for v, lv in self._loaded.items() if v != version}
            old.close()
            self._retired.append(weakref.ref(old.model))
            closed.append(old)
            self._states[version] = VersionState("END")
            log.info("Unloaded version %d of %s.", version, self.base)
            changed = True
        self._prune()
        return changed

    def _trim_when_freed(self) -> None:
        """glibc keeps freed weights' pages in its arenas: once every unloaded version's model is
        freed (its batchers ended, the last request on it answered), `malloc_trim` hands them
        back. Trimming right after the unload came too early: the old batcher's worker still
        held the model (every time, under traffic), so its pages stayed (benchmarks/RESULTS.md)."""
        if not self._retired:
            return
        alive = [r for r in self._retired if r() is not None]
        if not alive:
            trim()
        self._retired = alive

    def _load_one(self, version: int) -> bool:
        self._states[version] = VersionState("LOADING")
        start = time.perf_counter()
        try:
            loaded = self._load(version)
        except Exception as e:
            log.exception("Failed to load version %d of %s.", version, self.base)
            if self.events is not None:
                self.events.load(join(self.base, str(version)), False, time.perf_counter() - start)
            self._failed.add(version)
            self._states[version] = VersionState("END", f"{type(e).__name__}: {e}")
            return False
        self._loaded = {**self._loaded, version: loaded}
        self._states[version] = VersionState("AVAILABLE")
        if self.events is not None:
            self.events.load(join(self.base, str(version)), True, time.perf_counter() - start)
        log.info("Serving version %d of %s.", version, self.base)
        return True

    def _prune(self) -> None:
        ended = sorted(v for v, s in self._states.items() if s.state == "END")
        for v in ended[:-_KEPT_ENDED]:
            del self._states[v]

    def _load(self, version: int) -> LoadedVersion:
        path = join(self.base, str(version))
        model = load_exported(path, self._choose_tags(path))
        options = BatchingOptions.create(model.batching, enabled=self._enabled, **self._flags)
        batchers = {}
        for name, sig in model.signatures.items():
            if not batchable(sig):
                continue
            if self._warmup:
                for size in options.allowed_batch_sizes:
                    sig({n: np.zeros([size] + s["shape"][1:], jax.numpy.dtype(s["dtype"]))
                         for n, s in sig.inputs.items()})
            if options.enabled:
                batchers[name] = Batcher(sig, options, name=f"{version}-{name}",
                                         on_batch=None if self.events is None else self.events.batch)
        return LoadedVersion(version, model, options, batchers)

    def _choose_tags(self, path: str) -> Sequence[str]:
        if self._tags is not None:
            return self._tags
        graphs = {mf.tags_key(g["tags"]) for g in mf.read_manifest(path)["meta_graphs"]}
        accelerator = jax.default_backend() in ("gpu", "cuda", "tpu")
        if accelerator and mf.tags_key(("serve", "tpu")) in graphs:
            return ("serve", "tpu")
        return ("serve",)

    # --- background polling ----------------------------------------------------

    def start(self) -> None:
        """Loads the versions of the policy now and starts polling for newer ones."""
        self.reload()
        if self._poll and self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._watch, name="model-store", daemon=True)
            self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(self._poll):
            try:
                self.reload()
            except Exception:  # never let the watcher die
                log.exception("Polling %s failed.", self.base)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        with self._lock:
            loaded, self._loaded = self._loaded, {}
            for lv in loaded.values():
                lv.close()
                self._states[lv.version] = VersionState("END")
