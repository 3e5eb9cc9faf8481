"""Every path a user hands in is a URI: a local path, `gs://bucket/dir`, or another
object store that `etils.epath` reaches through fsspec (`s3://`, `az://`, `hf://`).

`as_path(value, arg=...)` is where a user path enters the library: it checks
the type and the scheme (and that the scheme's package is installed), makes a
local path absolute, and returns an `epath.Path`; `as_uri` gives the same as
a string (what `model_dir`, `latest_checkpoint()` and `export_saved_model`
hand back). A path it cannot handle is an error naming the argument and the
fix, never a local folder named `gs:`.

Object stores have no atomic rename and no append: the writers above this
module (checkpoints through Orbax, exports, event files, `eval_results.jsonl`)
each commit by writing whole objects, a marker last (see docs/cluster.md).

Example:
  >>> as_uri('gs://bucket/run/', arg='model_dir')  # doctest: +SKIP
  'gs://bucket/run'
  >>> as_uri('/tmp/run/../m', arg='model_dir')
  '/tmp/m'
"""

from __future__ import annotations

import importlib.util
import os
import re
from typing import Any

from etils import epath

from tpu_estimator.api.checks import message

__all__ = ["as_path", "as_uri", "is_local", "join", "SCHEMES"]

# epath reads every URI through TensorFlow's tf.io.gfile whenever TensorFlow is importable;
# the library reaches object stores through fsspec (gcsfs for gs://) with or without TF,
# so one URI means one backend (the gcs extra, its listing cache setting, a GCS emulator's
# STORAGE_EMULATOR_HOST). Set before epath picks a backend (it decides once per process);
# a user's own EPATH_USE_TF wins.
os.environ.setdefault("EPATH_USE_TF", "false")

# scheme -> (the package epath's fsspec backend needs, the pip spec that installs it)
SCHEMES: dict[str, tuple[str, str]] = {
    "gs": ("gcsfs", "'tpu_estimator[gcs]' (or gcsfs)"),
    "s3": ("s3fs", "s3fs"),
    "az": ("adlfs", "adlfs"),
    "hf": ("huggingface_hub", "huggingface_hub"),
}
_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def _scheme(text: str) -> str | None:
    m = _URI.match(text)
    return m.group(1).lower() if m else None


def _has_package(scheme: str) -> bool:
    # With EPATH_USE_TF=true (the user's choice) and TensorFlow installed, epath reads the
    # object stores through tf.io.gfile instead of fsspec.
    package = SCHEMES[scheme][0]
    if importlib.util.find_spec(package) is not None:
        return True
    tf_gfile = os.environ.get("EPATH_USE_TF", "").lower() not in ("false", "no", "f", "0")
    return tf_gfile and importlib.util.find_spec("tensorflow") is not None


def as_uri(value: Any, *, arg: str) -> str:
    """`value` (str, bytes or PathLike) checked and normalised: `gs://b/d` or an absolute local path.

    Raises:
      TypeError: `value` is not a path (or is empty).
      ValueError: an unknown scheme, or one whose package is not installed.
    """
    if isinstance(value, bytes):
        value = os.fsdecode(value)
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
        raise TypeError(message(f"`{arg}` must be a non-empty path (a local path or gs://bucket/dir).",
                                f"{arg}={value!r}"))
    text = os.fspath(value)
    if isinstance(value, epath.Path):
        text = str(value)
    scheme = _scheme(text)
    if scheme is None:
        return os.path.abspath(os.path.expanduser(text))  # (a local path: os.path is right here)
    if scheme == "file":
        return os.path.abspath(text[len("file://"):])
    if scheme not in SCHEMES:
        raise ValueError(
            message(
                f"`{arg}` must be a local path or a URI of a supported scheme "
                f"({', '.join(s + '://' for s in SCHEMES)}).",
                f"{arg}={text!r}",
                "Use gs://bucket/dir for Google Cloud Storage, or a local (or mounted) directory.",
            )
        )
    if not _has_package(scheme):
        package, spec = SCHEMES[scheme]
        raise ValueError(
            message(
                f"`{arg}` on {scheme}:// needs the {package} package.",
                f"{arg}={text!r}, with {package} not installed",
                f"pip install {spec}",
            )
        )
    bucket_and_key = text[len(scheme) + 3:].strip("/")
    if not bucket_and_key:
        raise ValueError(message(f"`{arg}` must name a bucket.", f"{arg}={text!r}",
                                 f"Pass {scheme}://<bucket>/<dir>."))
    _fresh_listings(scheme)
    return f"{scheme}://" + re.sub("/+", "/", bucket_and_key)


def _fresh_listings(scheme: str) -> None:
    """Turns off fsspec's directory-listing cache for `scheme` (unless the user configured it).

    Another process writes what this one polls (an evaluator or a model server watching
    a model_dir or an export base): a cached listing would never show its new checkpoints
    or exports. Set before epath creates the filesystem (it keeps the first one)."""
    import fsspec.config

    for protocol in {scheme, "gcs" if scheme == "gs" else scheme}:
        fsspec.config.conf.setdefault(protocol, {}).setdefault("use_listings_cache", False)


def as_path(value: Any, *, arg: str) -> epath.Path:
    """`as_uri(value, arg=arg)` as an `epath.Path` (pathlib's API on local disk and object stores)."""
    return epath.Path(as_uri(value, arg=arg))


def is_local(uri: str | os.PathLike[str]) -> bool:
    """Whether a (normalised) path is on local disk, where rename and append are atomic."""
    return _scheme(str(uri) if isinstance(uri, epath.Path) else os.fspath(uri)) is None


def join(base: str | os.PathLike[str], *parts: str) -> str:
    """`base/part/...` as a string, for local paths and URIs alike."""
    return str(epath.Path(base).joinpath(*parts))


def process_running(pid: int) -> bool:
    """Whether local process `pid` still runs: a temporary directory named after it (a staged
    checkpoint, an export being written) is still in use and must not be removed."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # someone else's process
        return True
    return True
