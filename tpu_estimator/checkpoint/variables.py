"""Variable names: the slash-joined paths of a Flax variables dict, as users see them.

`params` variables are named by their path alone (`Dense_0/kernel`); other
collections keep theirs as a prefix (`batch_stats/BatchNorm_0/mean`); the
global step is `global_step`. `get_variable_names()`, `tpu_estimator.list_variables`
and warm start use these. Saved variables are read as numpy arrays without a
model or a mesh (a checkpoint from any device count).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Protocol

import jax
import numpy as np

from tpu_estimator.checkpoint.numpy_read import restore_state_numpy, state_metadata

GLOBAL_STEP = "global_step"
EXTRAS = "extras"
_FIELDS = ("params", "collections", "opt_state", "step", "rng", EXTRAS)  # TrainState's, as saved

Read = Callable[[Any], Any]  # a part of a component's saved metadata -> those leaves as numpy


class VariableReader(Protocol):
    """Names and reads the variables of one component's saved state whose names are not its
    paths (the embedding tables: whole logical tables from sharded storage). `saved` is the
    metadata of the component's state; `read` reads a part of it as numpy."""

    def names(self, saved: Any) -> dict[str, tuple[Any, tuple[str, ...]]]:
        """name -> (its leaf's metadata, its path inside the component's state)."""
        ...

    def shapes(self, saved: Any, read: Read) -> dict[str, tuple[int, ...]]:
        """name -> the shape users see."""
        ...

    def logical(self, saved: Any, read: Read, stored: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """`stored` (name -> the leaf as saved) as users see the variables."""
        ...

    # Optional (warm start without whole tables): `rows(saved, read, open_rows, names) ->
    # {name: source}`, a source with the `shape` users see that its component reads by
    # rows (`open_rows(leaf)`: checkpoint/row_reads.py), e.g. embedding's `SavedTable`.


Readers = Mapping[str, Callable[[], VariableReader]]  # component name -> (lazily made) reader


def saved_state(tree: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, tuple[str, ...]]]:
    """(a saved state tree with every component's state under `extras`, component name ->
    where its state is saved). Checkpoints written before the embedding tables became a
    component (tpu_estimator 0.1.0) kept them at the top level, under their name."""
    tree = dict(tree)
    moved = {k: tree.pop(k) for k in list(tree) if k not in _FIELDS}
    where = {name: (EXTRAS, name) for name in dict(tree.get(EXTRAS) or {})}
    where.update({name: (name,) for name in moved})
    if moved:
        tree[EXTRAS] = {**dict(tree.get(EXTRAS) or {}), **moved}
    return tree, where


def reader_at(checkpoint_path: str, where: tuple[str, ...]) -> Read:
    """`read` for the component state saved at `where` in checkpoint `checkpoint_path`."""

    def read(part: Any) -> Any:
        tree = part
        for key in reversed(where):
            tree = {key: tree}
        raw = restore_state_numpy(checkpoint_path, tree)
        for key in where:
            raw = raw[key]
        return raw

    return read


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


def _variable_leaves(tree: Any, skip: Iterable[str] = ()) -> list[tuple[Any, str, Any]]:
    """(path, name, leaf) of the variables of a saved state (or of its metadata); the state of
    components in `skip` (named by their readers) left out."""
    skip = set(skip)
    out = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        keys = [str(getattr(p, "key", getattr(p, "idx", p))) for p in path]
        if len(keys) > 1 and keys[0] == EXTRAS and keys[1] in skip:
            continue
        name = state_variable_name(path)
        if name is not None:
            out.append((path, name, leaf))
    return out


def _readers(meta: dict[str, Any], readers: Readers | None) -> dict[str, VariableReader]:
    """The readers of the components whose state `meta` holds (made only for those)."""
    saved = dict(meta.get(EXTRAS) or {})
    return {name: make() for name, make in (readers or {}).items() if name in saved}


def checkpoint_shapes(checkpoint_path: str, readers: Readers | None = None) -> dict[str, tuple[int, ...]]:
    """{name: shape} of the variables of checkpoint `<model_dir>/<step>`, `global_step`
    and the variables of components with `readers` (whole embedding tables) included; reads
    no array but what the readers need (the tables' layouts)."""
    meta, where = saved_state(state_metadata(checkpoint_path))
    found = _readers(meta, readers)
    shapes = {name: tuple(leaf.shape) for _, name, leaf in _variable_leaves(meta, found)}
    for comp, reader in found.items():
        shapes.update(reader.shapes(meta[EXTRAS][comp], reader_at(checkpoint_path, where[comp])))
    return shapes


def checkpoint_variables(
    checkpoint_path: str, names: Iterable[str] | None = None, readers: Readers | None = None
) -> dict[str, np.ndarray]:
    """The variables of checkpoint `<model_dir>/<step>` by name, plus `global_step`, and the
    variables of components with `readers` (the embedding tables and their slots whole:
    `embedding/<table>`, `embedding/<table>/<slot>`).

    Read as numpy arrays on any device count; the optimizer state is not read.
    `names` reads only those (names the checkpoint lacks are left out).
    """
    wanted = None if names is None else set(names)
    meta, where = saved_state(state_metadata(checkpoint_path))
    found = _readers(meta, readers)
    subtree: dict[str, Any] = {}
    plain: dict[str, list[Any]] = {}
    for path, name, leaf in _variable_leaves(meta, found):
        if wanted is None or name in wanted:
            plain[name] = _stored([getattr(p, "key", getattr(p, "idx", p)) for p in path], where)
            _put(subtree, plain[name], leaf)
    chosen: dict[str, dict[str, list[Any]]] = {}
    for comp, reader in found.items():
        for name, (leaf, inside) in reader.names(meta[EXTRAS][comp]).items():
            if wanted is None or name in wanted:
                chosen.setdefault(comp, {})[name] = [*where[comp], *inside]
                _put(subtree, chosen[comp][name], leaf)
    if not subtree:
        return {}
    raw = restore_state_numpy(checkpoint_path, subtree)
    out = {name: np.asarray(_at(raw, keys)) for name, keys in plain.items()}
    for comp, paths in chosen.items():
        stored = {name: _at(raw, keys) for name, keys in paths.items()}
        read = reader_at(checkpoint_path, where[comp])
        out.update(found[comp].logical(meta[EXTRAS][comp], read, stored))
    return out


def checkpoint_rows(
    checkpoint_path: str, names: Iterable[str], readers: Readers | None, open_rows: Callable[[Any], Any]
) -> dict[str, Any]:
    """name -> a source read by rows (the reader's `rows`: e.g. a saved embedding table) for
    the `names` of components whose readers have `rows`; other names are left out (read
    whole). `open_rows(leaf)` opens a saved array for row reads. Reads no array but what
    the readers need (the tables' layouts)."""
    wanted = set(names)
    meta, where = saved_state(state_metadata(checkpoint_path))
    out: dict[str, Any] = {}
    for comp, reader in _readers(meta, readers).items():
        if not hasattr(reader, "rows"):
            continue
        mine = [name for name in reader.names(meta[EXTRAS][comp]) if name in wanted]
        if mine:
            read = reader_at(checkpoint_path, where[comp])
            out.update(reader.rows(meta[EXTRAS][comp], read, open_rows, mine))
    return out


def _stored(keys: list[Any], where: Mapping[str, tuple[str, ...]]) -> list[Any]:
    """The saved path of a path of `saved_state`'s tree (a component's state may sit elsewhere)."""
    if len(keys) > 1 and keys[0] == EXTRAS and keys[1] in where:
        return [*where[keys[1]], *keys[2:]]
    return keys


def _at(tree: Any, keys: list[Any]) -> Any:
    for key in keys:
        tree = tree[key]
    return tree


def _put(tree: dict[str, Any], keys: list[Any], leaf: Any) -> None:
    node = tree
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    node[keys[-1]] = leaf
