"""Fixtures of the engine tests."""

from __future__ import annotations

import pytest

from tests.estimator.models import make_data


@pytest.fixture(scope="module")
def data():
    return make_data(1000)
