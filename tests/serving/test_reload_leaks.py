"""Hot reloads leave nothing behind: versions loaded, warmed up, served and unloaded by the
model store keep the process's JAX `Exported` objects, live arrays, batcher threads and file
descriptors constant; a reloaded export shares its deserialized function, never its weights;
glibc's freed pages are trimmed once an unloaded version is really freed; the load metrics
keep series for a bounded number of versions."""

import gc
import os
import shutil
import threading
import time
import weakref

import jax
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tpu_estimator.checkpoint import flat_io
from tpu_estimator.export.loader import load_exported
from tpu_estimator.serving.metrics import KEPT_MODEL_PATHS, ServingMetrics
from tpu_estimator.serving import model_store
from tpu_estimator.serving.model_store import ModelStore

ROW = {"x": np.asarray([[1, 2, 3, 4]], np.float32)}


@pytest.fixture
def versions(export_base, tmp_path):
    """A base directory with version 1 (a copy of the test export); `add()` copies the newest
    to the next version, renamed into place as an exporter commits it."""
    src = os.path.join(export_base, sorted(os.listdir(export_base))[0])
    base = tmp_path / "base"
    base.mkdir()
    shutil.copytree(src, base / "1")

    def add():
        newest = max(int(n) for n in os.listdir(base) if n.isdigit())
        shutil.copytree(base / str(newest), tmp_path / "staging")
        os.rename(tmp_path / "staging", base / str(newest + 1))
        return newest + 1

    return str(base), add


def _batcher_threads():
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("batcher-"))


def _census(store):
    current = f"batcher-{store.loaded_versions[-1]}-"
    deadline = time.monotonic() + 10  # an unloaded version's batcher workers end after its queue
    while any(not t.startswith(current) for t in _batcher_threads()) and time.monotonic() < deadline:
        time.sleep(0.05)
    gc.collect()
    return {
        "exported": sum(isinstance(o, jax.export.Exported) for o in gc.get_objects()),
        "live_arrays": len(jax.live_arrays()),
        "batcher_threads": len(_batcher_threads()),
        "fds": len(os.listdir("/proc/self/fd")),
    }


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open files in /proc/self/fd (Linux)")
def test_reloads_leave_nothing_behind(versions):
    base, add = versions
    metrics = ServingMetrics()
    store = ModelStore(base, poll_seconds=0, version_policy="latest:1", events=metrics,
                       batching_flags={"max_batch_size": 2})
    store.start()
    try:
        def cycle():
            version = add()
            assert store.reload() and store.loaded_versions == [version]
            (future,) = store.get().batchers["serving_default"].submit(ROW, 1)
            assert future.result(timeout=60)["logits"].shape[0] == 1

        cycle()  # warm-up: the first reload's one-time caches
        before = _census(store)
        for _ in range(4):
            cycle()
        after = _census(store)
    finally:
        store.stop()
    assert after == before, (before, after)
    loads = metrics.registry.get_sample_value(":tensorflow:cc:saved_model:load_attempt_count",
                                              {"model_path": os.path.join(base, "6"), "status": "success"})
    assert loads == 1


def test_a_reloaded_export_shares_its_function_not_its_weights(versions):
    base, add = versions
    add()
    first, second = (load_exported(os.path.join(base, v)) for v in ("1", "2"))
    path = os.path.join(base, "2")
    variables = first.manifest["variables"]
    flat = flat_io.load(path, variables["file"], variables.get("dtypes"))
    flat_io.save({k: v * 2 for k, v in flat.items()}, path, variables["file"])  # new weights, same function
    doubled = load_exported(path)
    sig = "serving_default"
    assert first.signatures[sig].exported is second.signatures[sig].exported is doubled.signatures[sig].exported
    np.testing.assert_array_equal(first.signatures[sig](ROW)["logits"], second.signatures[sig](ROW)["logits"])
    assert not np.allclose(first.signatures[sig](ROW)["logits"], doubled.signatures[sig](ROW)["logits"])


def test_load_series_are_kept_for_the_newest_model_paths():
    metrics = ServingMetrics()  # each version is a model path: a series per reload, for ever, unless bounded
    for v in range(KEPT_MODEL_PATHS + 10):
        metrics.load(f"/models/m/{v}", v % 2 == 0, 0.5)
    metrics.load("/models/m/20", True, 0.5)  # a kept path counts on
    families = {f.name: f for f in text_string_to_metric_families(metrics.exposition().decode())}
    attempts = {(s.labels["model_path"], s.labels["status"]): s.value
                for s in families[":tensorflow:cc:saved_model:load_attempt_count"].samples}
    kept = range(10, KEPT_MODEL_PATHS + 10)
    assert set(attempts) == {(f"/models/m/{v}", "success" if v % 2 == 0 else "fail") for v in kept}
    assert attempts[("/models/m/20", "success")] == 2
    latency = {s.labels["model_path"]: s.value for s in families[":tensorflow:cc:saved_model:load_latency"].samples}
    assert latency == {f"/models/m/{v}": 1e6 if v == 20 else 5e5 for v in kept if v % 2 == 0}


def test_memory_is_trimmed_once_the_unloaded_version_is_freed(versions, monkeypatch):
    base, add = versions
    store = ModelStore(base, poll_seconds=0, version_policy="latest:1", batching_flags={"max_batch_size": 2})
    store.start()
    old = weakref.ref(store.get().model)
    trims = []
    monkeypatch.setattr(model_store, "trim", lambda: trims.append(old() is None))
    try:
        held = store.get()  # a request still running on the old version
        (future,) = held.batchers["serving_default"].submit(ROW, 1)
        add()
        assert store.reload()
        assert trims == []  # the old version is still in use: nothing freed yet
        assert future.result(timeout=60)["logits"].shape == (1, 3)
        del held
        assert not store.reload()  # the next poll: freed now, trimmed once
        assert trims == [True]
        assert not store.reload()
        assert trims == [True]
    finally:
        store.stop()
