"""The server's Prometheus metrics, under TF Serving's names, and `--monitoring_config_file`.

Served as Prometheus text (prometheus-client's exposition) at the path of
`prometheus_config { enable: true path: "..." }` on the REST port:

| metric | kind | labels |
| --- | --- | --- |
| `:tensorflow:serving:request_count` | counter (untyped: no `_total`, as TF Serving names it) | model_name, API, entrypoint (REST/GRPC), status (OK, INVALID_ARGUMENT, NOT_FOUND ...) |
| `:tensorflow:serving:request_latency` | histogram, microseconds | model_name, API, entrypoint |
| `:tensorflow:serving:batching:processed_batch_size` | histogram, rows of each batch run | |
| `:tensorflow:serving:batching:padding_size` | histogram, padding rows of each batch | |
| `:tensorflow:serving:batching:queue_rows` | gauge, rows queued now (ours) | |
| `:tensorflow:cc:saved_model:load_attempt_count` | counter (untyped) | model_path, status (success/fail) |
| `:tensorflow:cc:saved_model:load_latency` | counter (untyped), microseconds of successful loads | model_path |

The load series are kept for the newest `KEPT_MODEL_PATHS` model paths (each
version is a path: TF Serving keeps a series per version forever, a registry
that grows with every hot reload).

Each server has its own registry (no process-global state).
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterator

from google.protobuf import text_format
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric

from tpu_estimator.paths import as_uri
from tpu_estimator.serving.tf_serving_proto import MonitoringConfig

DEFAULT_PATH = "/monitoring/prometheus/metrics"
_LATENCY_BUCKETS = tuple(10 * 1.8**i for i in range(33))  # TF Serving's: 10 us * 1.8^i
_SIZE_BUCKETS = tuple(2**i for i in range(13))
KEPT_MODEL_PATHS = 64  # model paths with load series (one path per version)


def read_monitoring_config(path: str) -> str | None:
    """The Prometheus path a `--monitoring_config_file` enables (None: disabled)."""
    from etils import epath

    uri = as_uri(path, arg="monitoring_config_file")
    try:
        text = epath.Path(uri).read_text()
    except OSError as e:
        raise ValueError(f"--monitoring_config_file={path!r} cannot be read ({e}); give a text file "
                         f"such as: prometheus_config {{ enable: true path: \"{DEFAULT_PATH}\" }}") from e
    config = MonitoringConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as e:
        raise ValueError(f"--monitoring_config_file={path!r} is not a MonitoringConfig in text format: {e}. "
                         f"Expected e.g.: prometheus_config {{ enable: true path: \"{DEFAULT_PATH}\" }}") from e
    prometheus = config.prometheus_config
    if not prometheus.enable:
        return None
    route = prometheus.path or DEFAULT_PATH
    if not route.startswith("/") or route.startswith("/v1/"):
        raise ValueError(f"--monitoring_config_file={path!r}: prometheus_config.path must start with '/' and "
                         f"not be under /v1/ (the model API). Received: path={route!r}.")
    return route


class _Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        i = next((i for i, b in enumerate(self.buckets) if value <= b), len(self.buckets))
        self.counts[i] += 1
        self.total += value

    def family_buckets(self) -> list[tuple[str, float]]:
        out, running = [], 0
        for le, n in zip([*map(repr, map(float, self.buckets)), "+Inf"], self.counts):
            running += n
            out.append((le, running))
        return out


class ServingMetrics:
    """Counts and histograms the servers record; `exposition()` is the Prometheus text."""

    def __init__(self, queue_rows: Callable[[], int] = lambda: 0) -> None:
        self._lock = threading.Lock()
        self._requests: dict[tuple[str, str, str, str], int] = {}
        self._latency: dict[tuple[str, str, str], _Histogram] = {}
        self._batch = _Histogram(_SIZE_BUCKETS)
        self._padding = _Histogram(_SIZE_BUCKETS)
        self._loads: dict[tuple[str, str], int] = {}
        self._load_us: dict[str, float] = {}
        self.queue_rows = queue_rows  # set once the store exists
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def request(self, model: str, api: str, entrypoint: str, status: str, seconds: float) -> None:
        with self._lock:
            key = (model, api, entrypoint, status)
            self._requests[key] = self._requests.get(key, 0) + 1
            self._latency.setdefault((model, api, entrypoint), _Histogram(_LATENCY_BUCKETS)).observe(seconds * 1e6)

    def batch(self, rows: int, padded: int) -> None:
        with self._lock:
            self._batch.observe(rows)
            self._padding.observe(padded - rows)

    def load(self, model_path: str, ok: bool, seconds: float) -> None:
        with self._lock:
            key = (model_path, "success" if ok else "fail")
            self._loads[key] = self._loads.get(key, 0) + 1
            if ok:
                self._load_us[model_path] = self._load_us.get(model_path, 0.0) + seconds * 1e6
            paths = dict.fromkeys(path for path, _ in self._loads)  # first loaded first
            for path in list(paths)[:-KEPT_MODEL_PATHS]:
                for status in ("success", "fail"):
                    self._loads.pop((path, status), None)
                self._load_us.pop(path, None)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            yield _untyped(":tensorflow:serving:request_count", "The number of requests, by model, API and status.",
                           ("model_name", "API", "entrypoint", "status"), self._requests)
            latency = HistogramMetricFamily(":tensorflow:serving:request_latency",
                                            "Request latency in microseconds.",
                                            labels=("model_name", "API", "entrypoint"))
            for key, h in sorted(self._latency.items()):
                latency.add_metric(list(key), h.family_buckets(), h.total)
            yield latency
            for name, h, text in ((":tensorflow:serving:batching:processed_batch_size", self._batch,
                                   "Rows of each batch run."),
                                  (":tensorflow:serving:batching:padding_size", self._padding,
                                   "Padding rows added to each batch run.")):
                family = HistogramMetricFamily(name, text)
                family.add_metric([], h.family_buckets(), h.total)
                yield family
            yield _untyped(":tensorflow:cc:saved_model:load_attempt_count", "Model loads, by path and status.",
                           ("model_path", "status"), self._loads)
            yield _untyped(":tensorflow:cc:saved_model:load_latency",
                           "Microseconds spent in successful model loads.", ("model_path",),
                           {(k,): v for k, v in self._load_us.items()})
        queue = GaugeMetricFamily(":tensorflow:serving:batching:queue_rows", "Rows waiting in the request queues.")
        queue.add_metric([], self.queue_rows())
        yield queue

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def _untyped(name: str, text: str, labels: tuple[str, ...], values: dict[tuple[str, ...], Any]) -> Metric:
    """A counter under its exact name (prometheus-client would add `_total` to a typed counter)."""
    family = Metric(name, text, "unknown")
    for key, value in sorted(values.items()):
        family.add_sample(name, dict(zip(labels, key)), value)
    return family
