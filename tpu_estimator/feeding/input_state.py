"""The position of a checkpointable input pipeline (grain iterators and the like).

An iterator with `get_state()` / `set_state(state)` (grain's `DatasetIterator`
and `DataLoaderIterator`) is checkpointable: its state is saved with each
checkpoint and restored on resume, so a resumed run reads exactly the
batches an uninterrupted one would. Other iterables restart from the
beginning of what `input_fn` returns, as in the original.
"""

from __future__ import annotations

import base64
from typing import Any, Mapping, Protocol, TypeGuard

_BYTES = "__bytes_base64__"


class Checkpointable(Protocol):
    """An iterator whose position can be saved and restored (grain's iterators)."""

    def get_state(self) -> object: ...

    def set_state(self, state: Any) -> None: ...  # what get_state returned (its own format)


def is_checkpointable(iterator: object) -> TypeGuard[Checkpointable]:
    return callable(getattr(iterator, "get_state", None)) and callable(
        getattr(iterator, "set_state", None)
    )


def get_input_state(iterator: object) -> dict[str, object] | None:
    """The iterator's state as JSON-able data, or None if it has none."""
    if not is_checkpointable(iterator):
        return None
    state = iterator.get_state()
    if isinstance(state, bytes):
        return {_BYTES: base64.b64encode(state).decode("ascii")}
    return {"state": state}


def set_input_state(iterator: object, saved: Mapping[str, Any] | None) -> bool:
    """Restores `saved` (from `get_input_state`) into the iterator; False if not possible."""
    if saved is None or not is_checkpointable(iterator):
        return False
    if _BYTES in saved:
        iterator.set_state(base64.b64decode(saved[_BYTES]))
    else:
        iterator.set_state(saved["state"])
    return True
