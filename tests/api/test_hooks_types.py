"""SessionRunHook and friends: no-op defaults, SessionRunArgs rules, RunContext."""

import pytest

import tpu_estimator.hooks as hooks_pkg
from tpu_estimator import (
    CheckpointSaverListener,
    RunContext,
    SessionRunArgs,
    SessionRunHook,
    SessionRunValues,
)


def test_hook_methods_are_no_ops():
    hook = SessionRunHook()
    ctx = RunContext()
    assert hook.begin() is None
    assert hook.after_create_session(session=object(), coord=None) is None
    assert hook.before_run(ctx) is None
    assert hook.after_run(ctx, SessionRunValues(results=None)) is None
    assert hook.end(session=object()) is None


def test_listener_methods_are_no_ops():
    listener = CheckpointSaverListener()
    assert listener.begin() is None
    assert listener.before_save(object(), 10) is None
    assert listener.after_save(object(), 10) is None  # not True: training goes on
    assert listener.end(object(), 10) is None


def test_subclass_overrides():
    class StopAfter(SessionRunHook):
        def before_run(self, run_context):
            return SessionRunArgs({"l": "loss", "s": ["global_step"]})

        def after_run(self, run_context, run_values):
            if run_values.global_step >= 10:
                run_context.request_stop()

    hook, ctx = StopAfter(), RunContext(session="estimator")
    args = hook.before_run(ctx)
    values = SessionRunValues(args.resolve({"loss": 0.5, "global_step": 10}), global_step=10)
    assert values.results == {"l": 0.5, "s": [10]}
    hook.after_run(ctx, values)
    assert ctx.stop_requested and ctx.session == "estimator"


@pytest.mark.parametrize(
    "fetches, results",
    [
        ("loss", 1.0),
        (["loss", "global_step"], [1.0, 7]),
        (("loss",), (1.0,)),
        ({"a": "loss", "b": ("global_step", "loss")}, {"a": 1.0, "b": (7, 1.0)}),
        ([], []),
    ],
)
def test_session_run_args_resolve_keeps_structure(fetches, results):
    args = SessionRunArgs(fetches)
    assert args.fetches == fetches and args.feed_dict is None and args.options is None
    assert args.resolve({"loss": 1.0, "global_step": 7}) == results


def test_session_run_args_unknown_name():
    with pytest.raises(
        ValueError, match="asks for 'accuracy'.*available=\\['global_step', 'loss'\\]"
    ):
        SessionRunArgs(["loss", "accuracy"]).resolve({"loss": 1.0, "global_step": 1})


@pytest.mark.parametrize("fetches", [None, 3, object(), ["loss", 3], {"a": None}, {"loss"}])
def test_session_run_args_bad_fetches(fetches):
    with pytest.raises(TypeError, match="`fetches` must be a name.*Received: fetches"):
        SessionRunArgs(fetches)


def test_session_run_args_rejects_feed_dict():
    with pytest.raises(ValueError, match="feed_dict=.*not supported.*Feed data through input_fn"):
        SessionRunArgs("loss", feed_dict={"x": 1})


def test_session_run_args_is_a_namedtuple():
    args = SessionRunArgs("loss", None, "opts")
    fetches, feed_dict, options = args
    assert (fetches, feed_dict, options) == ("loss", None, "opts")
    assert args._replace(fetches="global_step").fetches == "global_step"


def test_session_run_values_fields():
    values = SessionRunValues({"loss": 1.0}, global_step=5)
    assert values.results == {"loss": 1.0}
    assert values.options is None and values.run_metadata is None and values.global_step == 5


def test_run_context():
    args = SessionRunArgs("loss")
    ctx = RunContext(args, session="est")
    assert ctx.original_args is args and ctx.session == "est"
    assert not ctx.stop_requested
    ctx.request_stop()
    ctx.request_stop()
    assert ctx.stop_requested
    with pytest.raises(AttributeError):
        ctx.stop_requested = False


def test_hooks_package_exports():
    names = {
        "CheckpointSaverListener",
        "RunContext",
        "SessionRunArgs",
        "SessionRunHook",
        "SessionRunValues",
    }
    assert names <= set(hooks_pkg.__all__)
    for name in names:
        assert getattr(hooks_pkg, name) is not None
