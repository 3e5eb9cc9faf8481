"""`suggest_keywords`: a misspelled keyword argument of a config or the estimator gets a
"did you mean" (difflib), where Python says only "unexpected keyword argument".

A class decorator that wraps `__init__` (a dataclass's generated one too: put it
above `@dataclasses.dataclass`). The wrapper checks the keyword names and calls
the original; `inspect.signature`, `dataclasses.replace`, pickling and copying
see the class as before.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import reprlib
from typing import Any, Sequence, TypeVar

from tpu_estimator.api.checks import message

T = TypeVar("T", bound=type)

_KEYWORD_KINDS = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def unknown_keyword_message(owner: str, keyword: str, value: Any, allowed: Sequence[str]) -> str:
    """`owner() got an unexpected keyword argument 'x'. Received: x=... . Did you mean 'y'?`"""
    close = difflib.get_close_matches(keyword, allowed, n=1, cutoff=0.6)
    fix = (f"Did you mean {close[0]!r}?" if close
           else "Its keyword arguments are: " + ", ".join(allowed) + ".")
    return message(f"{owner}() got an unexpected keyword argument {keyword!r}.",
                   f"{keyword}={reprlib.repr(value)}", fix)


def suggest_keywords(cls: T) -> T:
    """Makes `cls(...)` raise TypeError with a "did you mean" for an unknown keyword argument.

    Args:
      cls: A class defining `__init__` itself (one taking `**kwargs` is returned unchanged).

    Returns:
      `cls`, its `__init__` wrapped.
    """
    init = cls.__dict__.get("__init__")
    if init is None:
        raise TypeError(message("suggest_keywords needs a class that defines __init__ itself.",
                                f"cls={cls.__qualname__}"))
    parameters = list(inspect.signature(init).parameters.values())[1:]  # without self
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return cls
    allowed = [p.name for p in parameters if p.kind in _KEYWORD_KINDS]
    known = frozenset(allowed)

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        for keyword, value in kwargs.items():
            if keyword not in known:
                raise TypeError(unknown_keyword_message(type(self).__name__, keyword, value, allowed))
        init(self, *args, **kwargs)

    cls.__init__ = __init__  # type: ignore[misc]
    return cls
