"""`SessionRunHook` and its companions, as in `tf.estimator.SessionRunHook`.

There is no `tf.Session` here. A "run" is one call of the compiled loop
(`iterations_per_loop` steps on the device); hooks see the host side of it:

* `begin()` once before the first loop, `end(session)` once after the last.
* `after_create_session(session, coord)` once the variables exist
  (initialised or restored). `session` is the estimator's core (there is
  no `tf.Session`): read `session.model_dir`, `config`, `params`,
  `global_step`, `latest_checkpoint()`; `coord` is None.
* `before_run(run_context)` may return `SessionRunArgs(fetches)`, naming
  values of the step outputs (e.g. `'loss'`, `'global_step'`); after the
  loop, `after_run(run_context, run_values)` receives them in
  `run_values.results`, with the same structure as the fetches.
* `run_context.request_stop()` asks the estimator to stop after this loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, NamedTuple, Protocol, Sequence, TypeAlias, Union

from tpu_estimator.api.checks import message
from tpu_estimator.api.contracts import PyTree
from tpu_estimator.api.export_output import describe

if TYPE_CHECKING:
    from tpu_estimator.api.run_config import RunConfig

# What `SessionRunArgs` fetches: a name, or nested lists, tuples and dicts of names.
Fetches: TypeAlias = Union[str, Sequence["Fetches"], Mapping[str, "Fetches"]]


class Session(Protocol):
    """What hooks and listeners receive as `session` (there is no `tf.Session`): the
    estimator's core, read through these members."""

    @property
    def model_dir(self) -> str: ...

    @property
    def config(self) -> RunConfig: ...

    @property
    def params(self) -> Mapping[str, Any]: ...

    @property
    def global_step(self) -> int: ...

    def latest_checkpoint(self) -> str | None: ...


class SessionRunHook:
    """Base class of hooks that run around each loop of `train`/`evaluate`/`predict`.

    Every method is a no-op; override the ones you need.

    Example:
      >>> class PrintLoss(SessionRunHook):
      ...     def before_run(self, run_context):
      ...         return SessionRunArgs('loss')
      ...     def after_run(self, run_context, run_values):
      ...         print(run_values.global_step, run_values.results)
    """

    def begin(self) -> None:
        """Called once before the first loop; the variables may not exist yet."""

    def after_create_session(self, session: Session, coord: None) -> None:
        """Called once the variables exist. `session` is the estimator's core; `coord` is None."""

    def before_run(self, run_context: "RunContext") -> "SessionRunArgs | None":
        """Called before each loop; return `SessionRunArgs` to fetch named outputs."""
        return None

    def after_run(self, run_context: "RunContext", run_values: "SessionRunValues") -> None:
        """Called after each loop with the fetched values."""

    def end(self, session: Session) -> None:
        """Called once at the end, unless an exception stops the run. `session`: the estimator's core."""


def _check_fetches(fetches: object, path: str) -> None:
    if isinstance(fetches, str):
        return
    if isinstance(fetches, (list, tuple)):
        for i, f in enumerate(fetches):
            _check_fetches(f, f"{path}[{i}]")
        return
    if isinstance(fetches, Mapping):
        for k, f in fetches.items():
            _check_fetches(f, f"{path}[{k!r}]")
        return
    raise TypeError(
        message(
            "`fetches` must be a name (str), or a list, tuple or dict of names, of values "
            "the step outputs (e.g. 'loss', 'global_step').",
            f"{path}={describe(fetches)}",
            "Refer to values by name, e.g. SessionRunArgs(['loss', 'global_step']).",
        )
    )


def _fill(fetches: Fetches, values: Mapping[str, PyTree]) -> PyTree:
    if isinstance(fetches, str):
        if fetches not in values:
            raise ValueError(
                message(
                    f"SessionRunArgs asks for {fetches!r}, which the step does not output.",
                    f"available={sorted(values)}",
                )
            )
        return values[fetches]
    if isinstance(fetches, Mapping):
        return {k: _fill(f, values) for k, f in fetches.items()}
    filled = [_fill(f, values) for f in fetches]
    return filled if isinstance(fetches, list) else tuple(filled)


class _SessionRunArgs(NamedTuple):
    fetches: Fetches
    feed_dict: None = None
    options: object = None


class SessionRunArgs(_SessionRunArgs):
    """What a hook's `before_run` asks of the next loop.

    Args:
      fetches: A name, or a (nested) list, tuple or dict of names, of values
        the step outputs, e.g. `'loss'` or `{'step': 'global_step'}`.
      feed_dict: Must be None: a compiled step has nothing to feed. Kept so
        that hooks written for TF construct unchanged.
      options: Ignored; kept for compatibility.

    Raises:
      TypeError: if `fetches` holds something other than names.
      ValueError: if `feed_dict` is given.
    """

    __slots__ = ()

    def __new__(cls, fetches: Fetches, feed_dict: None = None, options: object = None) -> "SessionRunArgs":
        _check_fetches(fetches, "fetches")
        if feed_dict is not None:
            raise ValueError(
                message(
                    "SessionRunArgs(feed_dict=...) is not supported: the compiled step has no "
                    "placeholders to feed.",
                    f"feed_dict={describe(feed_dict)}",
                    "Feed data through input_fn; pass feed_dict=None.",
                )
            )
        return super().__new__(cls, fetches, feed_dict, options)

    def resolve(self, values: Mapping[str, PyTree]) -> PyTree:
        """The fetches with each name replaced by `values[name]` (same structure).

        Raises:
          ValueError: naming the missing fetch and the available names.
        """
        return _fill(self.fetches, values)


class SessionRunValues(NamedTuple):
    """What `after_run` receives.

    Attributes:
      results: The fetched values, with the structure of `SessionRunArgs.fetches`
        (None if the hook fetched nothing).
      options: Always None; kept for compatibility.
      run_metadata: Always None; kept for compatibility.
      global_step: The global step reached by the loop.
    """

    results: PyTree
    options: None = None
    run_metadata: None = None
    global_step: int | None = None


class RunContext:
    """Context of one loop, passed to `before_run`/`after_run`.

    Args:
      original_args: The `SessionRunArgs` of the run itself, if any.
      session: The estimator's core (there is no `tf.Session`; see `SessionRunHook`).
    """

    def __init__(self, original_args: SessionRunArgs | None = None, session: Session | None = None) -> None:
        self._original_args = original_args
        self._session = session
        self._stop_requested = False

    @property
    def original_args(self) -> SessionRunArgs | None:
        return self._original_args

    @property
    def session(self) -> Session | None:
        """The estimator's core: `model_dir`, `config`, `params`, `global_step`, ..."""
        return self._session

    def request_stop(self) -> None:
        """Asks the estimator to stop once the current loop is done."""
        self._stop_requested = True

    @property
    def stop_requested(self) -> bool:
        return self._stop_requested
