"""The layout of an export directory and its JSON manifest.

```
<export_dir_base>/<timestamp>/
  manifest.json                     signatures, tags, platforms, specs, versions
  variables/variables.safetensors   the weights (flat names: 'params/Dense_0/kernel')
  functions/<tags>/<signature>.jaxexport   serialized `jax.export.Exported` (StableHLO)
  functions/<tags>/<signature>.mlir        as_text=True only: the lowered module
  assets.extra/                     files from `assets_extra`
  saved_model.pb                    with TensorFlow installed only (export/saved_model.py): a TF
  variables/variables.index         SavedModel of the same signatures for TF Serving,
  variables/variables.data-*        saved_model_cli and tf.saved_model.load
```

The manifest's `saved_model` entry describes the SavedModel (its TensorFlow
version, `stablehlo_target`: the StableHLO version its programs are serialized
at, tag sets and signatures), or is null when none was written.

On local disk the directory is written under a hidden temporary name and
renamed when complete. On an object store (`gs://`), which has no atomic
rename, the files are written in place and `manifest.json` last: the manifest
is the commit marker, and `load_exported`, the serving model store and the
checkpoint reader treat a `<timestamp>` directory without one as no export.

Every serialized function is called as `fn(variables, inputs)` where
`variables` is the flat dict of the safetensors file and `inputs` the dict of
named input arrays; it returns the dict of named outputs. A signature with an
`example_parsing` entry takes serialized tf.Examples (`examples`), parsed on
the host into those inputs before the call.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from etils import epath

from tpu_estimator.api.checks import message
from tpu_estimator.api.serving_input import EXAMPLES_KEY, ParsingServingInputReceiver
from tpu_estimator.checkpoint.flat_io import MANIFEST_FILE as MANIFEST_FILE
from tpu_estimator.checkpoint.flat_io import VARIABLES_FILE as VARIABLES_FILE

FORMAT = "tpu_estimator.export"
FORMAT_VERSION = 1
FUNCTIONS_DIR = "functions"
ASSETS_EXTRA_DIR = "assets.extra"

SERVING = "serve"
TPU = "tpu"
TRAINING = "train"
EVAL = "eval"
CPU_PLATFORMS = ("cpu",)
ACCELERATOR_PLATFORMS = ("cuda", "tpu")

TRAIN_METHOD_NAME = "tensorflow/supervised/training"
EVAL_METHOD_NAME = "tensorflow/supervised/eval"


def tags_key(tags: Any) -> str:
    """A tag set as a stable string: ('serve', 'tpu') -> 'serve,tpu' (order-insensitive)."""
    if isinstance(tags, str):
        tags = [t for t in tags.split(",") if t]
    return ",".join(sorted(set(tags)))


def function_path(tags: Any, signature: str, suffix: str = ".jaxexport") -> str:
    return "/".join((FUNCTIONS_DIR, tags_key(tags).replace(",", "+"), signature + suffix))


def spec_json(shape: Any, dtype: Any) -> dict[str, Any]:
    """{'dtype': 'float32', 'shape': [None, 4]}; non-integer (symbolic) dims become None."""
    dims = [int(d) if isinstance(d, (int, np.integer)) else None for d in shape]
    return {"dtype": np.dtype(dtype).name, "shape": dims}


def example_parsing_json(receiver: Any) -> dict[str, Any]:
    """A signature's `example_parsing` entry (parsing receivers only, else {}).

    `{"example_parsing": {"input": "examples", "features": {...}}}`: clients send
    serialized tf.Examples as `input`; the loader and the server parse them with
    `features` (api/example_parsing.py's JSON form) into the function's inputs.
    """
    if not isinstance(receiver, ParsingServingInputReceiver):
        return {}
    return {"example_parsing": {"input": EXAMPLES_KEY, "features": receiver.example_spec.to_json()}}


def read_manifest(export_dir: str) -> dict[str, Any]:
    """The manifest of one export directory; ValueError if it is not one."""
    path = epath.Path(export_dir) / MANIFEST_FILE
    if not path.is_file():
        raise ValueError(
            message(
                "Expected an export directory holding manifest.json (written by export_saved_model).",
                f"path={str(export_dir)!r}",
                "Pass the <export_dir_base>/<timestamp> directory that export_saved_model returned.",
            )
        )
    manifest = json.loads(path.read_text())
    if manifest.get("format") != FORMAT or manifest.get("format_version", 0) > FORMAT_VERSION:
        raise ValueError(
            message(
                f"Expected a {FORMAT} manifest of format_version <= {FORMAT_VERSION}.",
                f"format={manifest.get('format')!r}, format_version={manifest.get('format_version')!r}",
                "Upgrade tpu_estimator to load this export.",
            )
        )
    return manifest


def write_manifest(export_dir: str, manifest: dict[str, Any]) -> None:
    """Writes `manifest.json` as one object (on an object store: the export's commit marker)."""
    (epath.Path(export_dir) / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def find_meta_graph(manifest: dict[str, Any], tags: Any) -> dict[str, Any]:
    """The meta graph exported with exactly this tag set; ValueError listing those present."""
    key = tags_key(tags)
    for graph in manifest["meta_graphs"]:
        if tags_key(graph["tags"]) == key:
            return graph
    present = [sorted(g["tags"]) for g in manifest["meta_graphs"]]
    raise ValueError(
        message(
            f"Expected one of the exported tag sets: {present}.",
            f"tags={sorted(key.split(',')) if key else []}",
            "Pass one of those as `tags`, e.g. tags=('serve',) for the CPU program.",
        )
    )
