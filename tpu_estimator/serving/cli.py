"""`tpu-estimator serve --model_base_path DIR --model_name NAME --rest_api_port 8501`: the model server.

Flags are spelled as TF Serving's `tensorflow_model_server` spells them; the
older spellings (a positional EXPORT_DIR_BASE, `--port`, `--poll_seconds`)
remain as aliases.
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
    s.add_argument("--rest_api_port", "--port", dest="port", type=int, default=8501)
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
    except ImportError as e:
        print(
            f"tpu-estimator serve needs the serving extras ({e.name} is missing): "
            "pip install 'tpu_estimator[serve]'",
            file=sys.stderr,
        )
        return 2

    from tpu_estimator.serving.app import create_app
    from tpu_estimator.paths import as_uri
    from tpu_estimator.serving.model_store import ModelStore
    from tpu_estimator.serving.server import uvicorn_config
    from tpu_estimator.serving.version_policy import VersionPolicy

    try:
        as_uri(args.export_dir_base, arg="model_base_path")
        policy = VersionPolicy.parse(args.model_version_policy)
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
        )
    except (TypeError, ValueError) as e:
        print(f"tpu-estimator serve: {e}", file=sys.stderr)
        return 2
    app = create_app(store, args.model_name, max_body_bytes=args.max_body_bytes)
    uvicorn.Server(uvicorn_config(app, host=args.host, port=args.port, log_level=args.log_level.lower())).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
