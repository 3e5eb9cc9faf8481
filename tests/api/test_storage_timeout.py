"""RunConfig(storage_timeout_s) and TPU_ESTIMATOR_STORAGE_TIMEOUT_S (tpu_estimator/storage.py).
The deadline itself is tested against the GCS emulator in tests/cloud/test_store_away.py."""

from __future__ import annotations

import threading

import pytest

import tpu_estimator as te
from tpu_estimator import storage


@pytest.fixture(autouse=True)
def _unset(monkeypatch):
    monkeypatch.delenv(storage.ENV, raising=False)
    yield
    storage.set_timeout_s(None)


def test_default_env_and_setting_in_that_order(monkeypatch):
    assert storage.timeout_s() == storage.DEFAULT_S == 120
    monkeypatch.setenv(storage.ENV, "45")
    assert storage.timeout_s() == 45
    storage.set_timeout_s(7)
    assert storage.timeout_s() == 7
    assert te.RunConfig().storage_timeout_s is None
    assert te.RunConfig(storage_timeout_s=30).replace(save_summary_steps=5).storage_timeout_s == 30


@pytest.mark.parametrize("value", [0, 0.5, -3, "soon", True, float("inf")])
def test_runconfig_rejects_a_bad_deadline(value):
    with pytest.raises(ValueError, match=r"`storage_timeout_s` must be a number of seconds >= 1.*"
                                         r"Received: storage_timeout_s="):
        te.RunConfig(storage_timeout_s=value)


def test_a_bad_environment_value_names_the_variable(monkeypatch):
    monkeypatch.setenv(storage.ENV, "ten")
    with pytest.raises(ValueError, match="TPU_ESTIMATOR_STORAGE_TIMEOUT_S='ten'"):
        storage.timeout_s()


def test_the_estimator_sets_it_for_the_process(tmp_path):
    te.TPUEstimator(lambda features, labels, mode: None,
                    config=te.RunConfig(model_dir=str(tmp_path), storage_timeout_s=9),
                    train_batch_size=8)
    assert storage.timeout_s() == 9


def test_local_paths_are_waited_for_without_probes():
    assert storage.bounded(lambda: 5, uri="/tmp/x", what="x") == 5
    done = threading.Event()
    threading.Timer(0.05, done.set).start()
    storage.wait_for(done, uri="/tmp/x", what="x")
    assert done.is_set()


def test_an_error_of_the_call_is_raised_as_it_is():
    with pytest.raises(KeyError, match="boom"):
        storage.bounded(lambda: {}["boom"], uri="/tmp/x", what="x")
