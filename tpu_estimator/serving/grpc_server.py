"""The gRPC server (`--port`, TF Serving's 8500): `PredictionService` and `ModelService` on a thread pool.

Each call runs on one of `max_threads` threads (a batched call waits there
for its batch); at most `max_concurrent_rpcs` calls are accepted at once,
more are refused by grpc with RESOURCE_EXHAUSTED.

Example:
  >>> store = ModelStore('/tmp/export')
  >>> store.start()
  >>> with GrpcServer(store, 'my_model', port=0) as server:
  ...     channel = grpc.insecure_channel(server.target)
"""

from __future__ import annotations

import concurrent.futures
from typing import Any

import grpc

from tpu_estimator.serving.grpc_service import PredictionService
from tpu_estimator.serving.metrics import ServingMetrics
from tpu_estimator.serving.model_store import ModelStore

DEFAULT_MAX_THREADS = 32
_MAX_MESSAGE_BYTES = 64 << 20


class GrpcServer:
    """TF Serving's gRPC API for `model_name` on `host:port` (0: a free port); a context manager."""

    def __init__(self, store: ModelStore, model_name: str, *, host: str = "127.0.0.1", port: int = 0,
                 metrics: ServingMetrics | None = None, max_threads: int = DEFAULT_MAX_THREADS,
                 max_message_bytes: int = _MAX_MESSAGE_BYTES) -> None:
        if max_threads < 1:
            raise ValueError(f"--grpc_max_threads must be >= 1. Received: grpc_max_threads={max_threads}.")
        self.service = PredictionService(store, model_name, metrics)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_threads, thread_name_prefix="grpc")
        options = [("grpc.max_receive_message_length", max_message_bytes),
                   ("grpc.max_send_message_length", max_message_bytes),
                   ("grpc.so_reuseport", 0)]
        self._server = grpc.server(self._pool, handlers=self.service.handlers(), options=options,
                                   maximum_concurrent_rpcs=4 * max_threads)
        try:
            self.port = self._server.add_insecure_port(f"{host}:{port}")
        except RuntimeError:  # grpc's "Failed to bind"
            self.port = 0
        if self.port == 0:
            self._pool.shutdown(wait=False)
            raise OSError(f"Cannot listen for gRPC on {host}:{port} (--port): the port is taken or the "
                          "address is not local. Pick another --port.")
        self.host = host
        self.target = f"{host}:{self.port}"

    def start(self) -> "GrpcServer":
        self._server.start()
        return self

    def wait(self) -> None:
        self._server.wait_for_termination()

    def stop(self, grace: float = 5.0) -> None:
        self._server.stop(grace).wait()
        self._pool.shutdown(wait=False)

    def __enter__(self) -> "GrpcServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
