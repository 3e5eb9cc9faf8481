"""Variable names: the slash-joined paths of a Flax variables dict, as users see them.

`params` variables are named by their path alone (`Dense_0/kernel`); other
collections keep theirs as a prefix (`batch_stats/BatchNorm_0/mean`); the
global step is `global_step`. `get_variable_names()`, `tpu_estimator.list_variables`
and warm start use these. Saved variables are read as numpy arrays without a
model or a mesh (a checkpoint from any device count).
"""

from __future__ import annotations

from typing import Any, Iterable

import jax
import numpy as np

from tpu_estimator.checkpoint.numpy_read import restore_state_numpy, state_metadata
from tpu_estimator.embedding.layout import saved_layouts
from tpu_estimator.model.state import EMBEDDING

GLOBAL_STEP = "global_step"


def variable_name(path: Any) -> str:
    """The name of the leaf at a `tree_flatten_with_path` path."""
    keys = [str(getattr(p, "key", getattr(p, "idx", p))) for p in path]
    return "/".join(keys[1:] if keys and keys[0] == "params" else keys)


def flatten(variables: Any) -> dict[str, Any]:
    """{name: leaf} of a Flax variables dict (`{'params': ..., other collections}`)."""
    return {variable_name(p): leaf for p, leaf in jax.tree_util.tree_flatten_with_path(variables)[0]}


def state_variable_name(path: Any) -> str | None:
    """The variable name of a saved TrainState leaf (params, collections, step, and a
    component's state as `<component>/<its path>`, e.g. `moving_average/Dense_0/kernel`);
    None for others."""
    keys = [str(getattr(p, "key", getattr(p, "idx", p))) for p in path]
    if keys and keys[0] in ("params", "collections", "extras"):
        return "/".join(keys[1:])
    return GLOBAL_STEP if keys == ["step"] else None


def _variable_leaves(tree: Any) -> list[tuple[Any, str, Any]]:
    """(path, name, leaf) of the variables of a saved state (or of its metadata)."""
    out = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        name = state_variable_name(path)
        if name is not None:
            out.append((path, name, leaf))
    return out


def checkpoint_shapes(checkpoint_path: str) -> dict[str, tuple[int, ...]]:
    """{name: shape} of the variables of checkpoint `<model_dir>/<step>`, `global_step`
    and whole embedding tables included; reads no array but the tables' layouts."""
    meta = state_metadata(checkpoint_path)
    shapes = {name: tuple(leaf.shape) for _, name, leaf in _variable_leaves(meta)}
    tables = _embedding_names(checkpoint_path, meta)
    shapes.update({name: (layout.vocabulary_size, *leaf.shape[1:]) for name, (layout, leaf, _) in tables.items()})
    return shapes


def checkpoint_variables(
    checkpoint_path: str, names: Iterable[str] | None = None
) -> dict[str, np.ndarray]:
    """The variables of checkpoint `<model_dir>/<step>` by name, plus `global_step`, and the
    embedding tables and their slots whole (`embedding/<table>`, `embedding/<table>/<slot>`).

    Read as numpy arrays on any device count; the optimizer state is not read.
    `names` reads only those (names the checkpoint lacks are left out).
    """
    wanted = None if names is None else set(names)
    meta = state_metadata(checkpoint_path)
    subtree: dict[str, Any] = {}
    for path, name, leaf in _variable_leaves(meta):
        if wanted is None or name in wanted:
            _put(subtree, [getattr(p, "key", getattr(p, "idx", p)) for p in path], leaf)
    tables = {
        name: entry for name, entry in _embedding_names(checkpoint_path, meta).items()
        if wanted is None or name in wanted
    }
    for _, leaf, keys in tables.values():
        _put(subtree, keys, leaf)
    if not subtree:
        return {}
    raw = restore_state_numpy(checkpoint_path, subtree)
    out = {name: np.asarray(leaf) for _, name, leaf in _variable_leaves(raw)}
    for name, (layout, _, keys) in tables.items():
        node = raw
        for key in keys:
            node = node[key]
        out[name] = layout.to_logical(node)
    return out


def _put(tree: dict[str, Any], keys: list[Any], leaf: Any) -> None:
    node = tree
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    node[keys[-1]] = leaf


def embedding_layout(checkpoint_path: str, meta: dict[str, Any]) -> dict[str, np.ndarray]:
    """The saved `EmbeddingState.layout` of checkpoint `<model_dir>/<step>` (whose
    `state_metadata` is `meta`): table -> int32 `[vocabulary_size, shards, strategy]`;
    empty without embedding tables. Reads only these small arrays."""
    saved = (meta.get(EMBEDDING) or {}).get("layout")
    if not saved:
        return {}
    return dict(restore_state_numpy(checkpoint_path, {EMBEDDING: {"layout": saved}})[EMBEDDING]["layout"])


def _embedding_names(checkpoint_path: str, meta: dict[str, Any]) -> dict[str, tuple[Any, Any, list[str]]]:
    """name -> (row layout, saved metadata, path in the state) of each embedding table and slot
    (`embedding/<table>`, `embedding/<table>/<slot>`); reads the small layout arrays."""
    saved = meta.get(EMBEDDING) or {}
    layouts = saved_layouts(embedding_layout(checkpoint_path, meta))
    out = {}
    for table, leaf in (saved.get("tables") or {}).items():
        out[f"{EMBEDDING}/{table}"] = (layouts[table], leaf, [EMBEDDING, "tables", table])
        for slot, slot_leaf in ((saved.get("slots") or {}).get(table) or {}).items():
            out[f"{EMBEDDING}/{table}/{slot}"] = (layouts[table], slot_leaf, [EMBEDDING, "slots", table, slot])
    return out
