"""What the process has seen of a store (tpu_estimator/store_health.py): the runs of
failures from which the storage deadline counts, on a clock the test moves. (Against the
GCS emulator, slow and away: tests/cloud/test_store_away.py.)"""

from __future__ import annotations

import types

import pytest

from tpu_estimator import store_health

STORE = "fake-store-for-test_store_health"
GAP = 3.0  # a wait's gap (storage._gap) in these tests


@pytest.fixture()
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(store_health, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    store_health.answered(STORE)
    yield now
    store_health.answered(STORE)


def test_the_run_starts_at_the_first_failure_seen_and_any_answer_ends_it(clock):
    assert store_health.away_since(STORE, gap=GAP) is None
    store_health.failed(STORE, gap=GAP)  # seen at 1000
    clock[0] = 1002
    store_health.failed(STORE, gap=GAP)
    assert store_health.away_since(STORE, gap=GAP) == 1000
    assert store_health.failing_since(STORE) == 1000
    assert store_health.last_failure(STORE) == 1002
    store_health.answered(STORE)
    assert store_health.away_since(STORE, gap=GAP) is None
    assert store_health.failing_since(STORE) is None
    assert store_health.last_answer(STORE) == 1002


def test_a_failure_long_after_the_last_one_starts_a_new_run(clock):
    """A stale failure (no answer since, e.g. the last probe of a wait that then ended) is
    no evidence that the store stayed away until a new failure: the count starts again."""
    store_health.failed(STORE, gap=GAP)  # 1000
    clock[0] = 1010  # 10 s later: more than a wait's gap, less than the clients'
    assert store_health.away_since(STORE, gap=GAP) is None  # not seen away lately
    store_health.failed(STORE, gap=GAP)
    assert store_health.away_since(STORE, gap=GAP) == 1010
    assert store_health.failing_since(STORE) == 1000  # a client's retries may be 16 s apart
    clock[0] = 1010 + store_health.CLIENT_GAP + 1
    store_health.failed(STORE, gap=GAP)
    assert store_health.away_since(STORE, gap=GAP) == clock[0]
    assert store_health.failing_since(STORE) == clock[0]


def test_stores_are_named_by_scheme():
    assert store_health.store_of("gs://b/x") == store_health.store_of("GCS://b") == "gs"
    assert store_health.store_of("s3://b/x/y") == "s3"
