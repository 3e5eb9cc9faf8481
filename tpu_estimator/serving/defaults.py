"""The server's defaults that the CLI shows in `--help`: importable without the `serve` extra."""

DEFAULT_MAX_BODY_BYTES = 64 << 20
