import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "export"))

import export_test_model as tm  # noqa: E402

from tpu_estimator.serving.model_store import ModelStore  # noqa: E402
from tpu_estimator.serving.server import ServerThread  # noqa: E402

MODEL = "mlp"


@pytest.fixture(scope="session")
def trained_est(tmp_path_factory):
    return tm.trained(str(tmp_path_factory.mktemp("export_model")))


@pytest.fixture(scope="session")
def export_base(trained_est, tmp_path_factory):
    base = tmp_path_factory.mktemp("serving_exports")
    trained_est.export_saved_model(str(base), tm.receiver_fn)
    return str(base)


@pytest.fixture(scope="module")
def server(export_base):
    store = ModelStore(export_base, batching_flags={"batch_timeout_micros": 20000}, poll_seconds=0)
    with ServerThread(store, MODEL, max_body_bytes=1 << 20) as s:
        yield s
