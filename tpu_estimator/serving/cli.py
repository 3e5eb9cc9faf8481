"""`tpu-estimator serve --model_base_path DIR --model_name NAME --port 8500 --rest_api_port 8501`: the model server.

Flags are spelled, and mean, what TF Serving's `tensorflow_model_server`'s
do: `--port` is the gRPC port, `--rest_api_port` the REST port (0 turns
either off). The older spellings (a positional EXPORT_DIR_BASE,
`--poll_seconds`) remain as aliases.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Sequence

from tpu_estimator.api.checks import message
# Only what needs no `serve` extra at import: `--help` works on the base install.
from tpu_estimator.serving.defaults import DEFAULT_MAX_BODY_BYTES


def _sizes(text: str) -> list[int]:
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints, got {text!r}") from e


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes"):
        return True
    if text.lower() in ("0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tpu-estimator", description="tpu_estimator tools.")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="Serve the exports under --model_base_path over "
                       "TensorFlow Serving's REST API, reloading newer exports as they appear.")
    s.add_argument("export_dir_base", nargs="?", default=None,
                   help="The same as --model_base_path (an older spelling).")
    s.add_argument("--model_base_path", default=None, help="Directory of the exports (numeric "
                   "version directories): local, or gs://bucket/dir (needs gcsfs: pip install "
                   "'tpu_estimator[gcs]').")
    s.add_argument("--model_name", default="default")
    s.add_argument("--host", default="127.0.0.1", help="Interface to bind (default: loopback only).")
    s.add_argument("--port", dest="grpc_port", type=int, default=8500,
                   help="gRPC port of tensorflow.serving.PredictionService and ModelService "
                   "(default 8500; 0: no gRPC).")
    s.add_argument("--rest_api_port", dest="port", type=int, default=8501,
                   help="REST port (default 8501; 0: no REST API, no probes, no metrics).")
    s.add_argument("--grpc_max_threads", type=int, default=None,
                   help="Threads serving gRPC calls (default 32).")
    s.add_argument("--monitoring_config_file", default=None,
                   help="TF Serving's MonitoringConfig in text format, e.g. 'prometheus_config { enable: "
                   "true path: \"/monitoring/prometheus/metrics\" }': Prometheus metrics at that path "
                   "on the REST port.")
    s.add_argument("--model_version_policy", default="latest:1",
                   help="Versions to serve: 'latest:N' (the N newest), 'specific:V1,V2' or 'all' "
                   "(default latest:1).")
    s.add_argument("--tags", default=None, help="Tag set to serve, e.g. 'serve' or 'serve,tpu' "
                   "(default: 'serve,tpu' on an accelerator when exported, else 'serve').")
    s.add_argument("--enable_batching", type=_bool, default=True)
    s.add_argument("--max_batch_size", type=int, default=None,
                   help="Overrides the inference_on_tpu setting (default 32).")
    s.add_argument("--batch_timeout_micros", type=int, default=None)
    s.add_argument("--num_batch_threads", type=int, default=None)
    s.add_argument("--allowed_batch_sizes", type=_sizes, default=None)
    s.add_argument("--max_enqueued_batches", type=int, default=None,
                   help="Batches of max_batch_size rows that may wait (default 10); a request that "
                   "does not fit is answered 503 with Retry-After. Without batching: requests in flight.")
    s.add_argument("--file_system_poll_wait_seconds", "--poll_seconds", dest="poll_seconds", type=float,
                   default=1.0, help="How often to look for new exports (0: never).")
    s.add_argument("--max_body_bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                   help=f"Largest request body; larger ones get 413 (default {DEFAULT_MAX_BODY_BYTES}).")
    s.add_argument("--log_level", default="info")
    return p


def _base_path(p: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    given = {v for v in (args.export_dir_base, args.model_base_path) if v is not None}
    if len(given) != 1:
        p.error(message("One export directory: --model_base_path DIR (or the positional EXPORT_DIR_BASE).",
                        f"--model_base_path={args.model_base_path!r}, EXPORT_DIR_BASE={args.export_dir_base!r}"))
    return given.pop()


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    args.export_dir_base = _base_path(p, args)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    try:
        import h11  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn
        import grpc  # noqa: F401
        import prometheus_client  # noqa: F401
    except ImportError as e:
        print(
            f"tpu-estimator serve needs the serving extras ({e.name} is missing): "
            "pip install 'tpu_estimator[serve]'",
            file=sys.stderr,
        )
        return 2

    from tpu_estimator.serving.app import create_app
    from tpu_estimator.paths import as_uri
    from tpu_estimator.serving.grpc_server import DEFAULT_MAX_THREADS, GrpcServer
    from tpu_estimator.serving.metrics import ServingMetrics, read_monitoring_config
    from tpu_estimator.serving.model_store import ModelStore
    from tpu_estimator.serving.server import uvicorn_config
    from tpu_estimator.serving.version_policy import VersionPolicy

    if args.port == 0 and args.grpc_port == 0:
        p.error("Serve on a port: --port (gRPC) or --rest_api_port (REST) must be non-zero. "
                "Received: --port=0 --rest_api_port=0.")
    try:
        as_uri(args.export_dir_base, arg="model_base_path")
        policy = VersionPolicy.parse(args.model_version_policy)
        metrics_path = (read_monitoring_config(args.monitoring_config_file)
                        if args.monitoring_config_file else None)
        metrics = ServingMetrics()
        store = ModelStore(
        args.export_dir_base,
            tags=args.tags.split(",") if args.tags else None,
            enable_batching=args.enable_batching,
            batching_flags={
                "max_batch_size": args.max_batch_size,
                "batch_timeout_micros": args.batch_timeout_micros,
                "num_batch_threads": args.num_batch_threads,
                "allowed_batch_sizes": args.allowed_batch_sizes,
                "max_enqueued_batches": args.max_enqueued_batches,
            },
            poll_seconds=args.poll_seconds,
            version_policy=policy,
            events=metrics,
        )
        metrics.queue_rows = store.queued_rows
        grpc_server = None
        if args.grpc_port:
            grpc_server = GrpcServer(store, args.model_name, host=args.host, port=args.grpc_port, metrics=metrics,
                                     max_threads=args.grpc_max_threads or DEFAULT_MAX_THREADS)
    except (TypeError, ValueError, OSError) as e:
        print(f"tpu-estimator serve: {e}", file=sys.stderr)
        return 2
    if grpc_server is not None:
        grpc_server.start()
        logging.getLogger("tpu_estimator.serving").info("gRPC API on %s.", grpc_server.target)
    try:
        if args.port:
            app = create_app(store, args.model_name, max_body_bytes=args.max_body_bytes, metrics=metrics,
                             metrics_path=metrics_path)
            config = uvicorn_config(app, host=args.host, port=args.port, log_level=args.log_level.lower())
            uvicorn.Server(config).run()
        else:
            store.start()
            try:
                grpc_server.wait()
            except KeyboardInterrupt:
                pass
            finally:
                store.stop()
    finally:
        if grpc_server is not None:
            grpc_server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
