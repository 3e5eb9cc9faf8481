"""The seam for extra training state: `StateComponent`.

A component adds its own state to `TrainState.extras[component.name]` and
takes part in every place that state travels, without the core knowing what
it is:

| where                          | hook                     |
| ------------------------------ | ------------------------ |
| initialisation, warm start     | `init(state)`            |
| shardings of the state         | `specs(extra, specs)`    |
| the train step (after update)  | `after_step(extra, new)` |
| evaluate / predict / export    | `inference_variables`    |
| checkpoints                    | saved with the state; read as `<name>/<variable>` |

Optional hooks, each called only for a component that has it (`hasattr`):

| where | hook | (first user) |
| ----- | ---- | ------------ |
| the loss, inside the differentiated function | `scale_loss(extra, loss)` | loss scale |
| the gradients (averaged over replicas), before the optimizer's update | `gradients(extra, grads) -> (grads, apply, extra)` | loss scale |
| input_fn's features on the feeder thread (checks, dtypes) | `host_features(features) -> features` | embedding |
| in every program, before model_fn | `split(extra, features) -> (features, inputs)` | embedding |
|  | `activations(extra, inputs) -> {feature: array}` (merged into model_fn's features; differentiated in training) | embedding |
| model_fn's initialisation trace | `placeholders(features) -> features` (what `split` + `activations` would give) | embedding |
| the train step, after `gradients` | `update(extra, inputs, act_grads, step) -> extra` | embedding |
| the per-replica programs (`shard_map` in/out specs; default replicated) | `replica_specs(extra)` | embedding |
| restore: a raw (numpy) restore needed? (another device count, layout) | `restore_plan(saved_meta, read) -> bool` (`read` reads a part of it as numpy) | embedding |
| restore: its state read from the checkpoint into this topology's shards (the raw restore leaves it out) | `from_checkpoint(saved_meta, read, open_rows, *, with_slots) -> extra` (`open_rows(leaf)` reads chosen rows of a saved array) | embedding |
| warm start: its trainable variables (`<name>/<key>`), as shapes (nothing read) | `warm_start_variables(extra) -> {key: ShapeDtypeStruct}` | embedding |
|  | `warm_started(extra, values) -> extra` (values: arrays, or the source reader's row sources: `VariableReader.rows`) | embedding |
| export: what the export's variables carry under `<name>` | `export_state(raw_extra)` | embedding |
| export: the component for a one-device export | `on_one_device() -> component` | embedding |

`gradients` sees the gradients of the (scaled) loss as `(params' grads,
{component: activations' grads})`, and returns the gradients to apply, a
boolean scalar `apply` (False vetoes the step's update: parameters,
optimizer state and the state that `update` hooks return stay as they were;
the step still counts) and its new state. `apply` must be the same on every
replica. In evaluation, prediction and export the state of a component with
`activations` travels in the programs' variables under its name
(`program_variables`, `forward_inputs`).

A component with `optional = True` (the loss scale) may be missing from a
checkpoint: it then starts from `init(state)` of the restored state, in
training and in evaluation, prediction and export, instead of being an error
naming its setting.

Restoring onto another device count needs nothing of a component whose
state is shaped like the parameters (it is restored by shape and sharding,
as the parameters are); one whose storage depends on the device count (the
embedding tables' row order) says so with `restore_plan` and reads its
state with `from_checkpoint` (each device's rows alone: no whole table on a host). Variables that are not named by their path in the
state (whole tables from sharded storage) are read by a reader registered
with the component (`estimator/components.variable_readers`,
checkpoint/variables.py). The core holds the components of a run in
`BoundModel.components`; they are registered in one place
(`estimator/components.py`) from the user's settings.

`init(state)` runs again after warm start or a Scaffold's init_fn, with the
state's current `extras`: a component whose state does not derive from the
parameters (the tables) returns `state.extras[name]` when it is there.
tests/extras/test_seam.py has a toy component with the program hooks (a small
table looked up by a feature) in thirty lines.

Example, a component that counts the steps (`counter/count` in checkpoints):

    @dataclasses.dataclass(frozen=True)
    class StepCounter:
        name: str = "counter"
        setting: str = "TPUConfig.count_steps"

        def init(self, state):
            return {"count": jnp.zeros((), jnp.int32)}

        def specs(self, extra, state_specs):
            return {"count": P()}

        def after_step(self, extra, state):
            return {"count": extra["count"] + 1}

        def inference_variables(self, extra, variables):
            return variables
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

from jax.sharding import PartitionSpec as P

from tpu_estimator.api.checks import message
from tpu_estimator.model.state import TrainState

PyTree = Any  # nested dicts / lists of arrays


@runtime_checkable
class StateComponent(Protocol):
    """One kind of extra training state (see the module docstring).

    Attributes:
      name: the key of its state in `TrainState.extras`, and the prefix of its
        variable names (`<name>/<variable>`) in checkpoints.
      setting: the user's setting that adds it, named in error messages
        (e.g. "TPUConfig.moving_average_decay").
    """

    name: str
    setting: str

    def init(self, state: TrainState) -> PyTree:
        """Its state for `state` (fresh, warm-started or changed by a Scaffold's init_fn)."""
        ...

    def specs(self, extra: PyTree, state_specs: TrainState) -> PyTree:
        """The PartitionSpecs of its state (shapes in `extra`), given the TrainState's others."""
        ...

    def after_step(self, extra: PyTree, state: TrainState) -> PyTree:
        """Its state after a training step that produced `state` (inside the program)."""
        ...

    def inference_variables(self, extra: PyTree, variables: dict[str, Any]) -> dict[str, Any]:
        """The Flax variables that evaluation, prediction and export use."""
        ...


Components = Sequence[StateComponent]


def init_extras(components: Components, state: TrainState) -> dict[str, PyTree] | None:
    """`TrainState.extras` for `state`: None without components (a state as before)."""
    if not components:
        return None
    return {c.name: c.init(state) for c in components}


def extras_specs(components: Components, extras: Mapping[str, PyTree] | None, state_specs: TrainState) -> Any:
    if not components or extras is None:
        return None
    return {c.name: c.specs(extras[c.name], state_specs) for c in components}


def after_step(components: Components, state: TrainState) -> TrainState:
    """`state` (just updated by a train step) with each component's state advanced."""
    if not components or state.extras is None:
        return state
    return state.replace(extras={c.name: c.after_step(state.extras[c.name], state) for c in components})


def scale_loss(components: Components, extras: Mapping[str, PyTree] | None, loss: Any) -> Any:
    """`loss` as it is differentiated: through each component's optional `scale_loss`."""
    for c in components:
        if hasattr(c, "scale_loss") and extras is not None:
            loss = c.scale_loss(extras[c.name], loss)
    return loss


def gradients(
    components: Components, extras: Mapping[str, PyTree] | None, grads: PyTree
) -> tuple[PyTree, Any, dict[str, PyTree] | None]:
    """(gradients to apply, `apply` (None: always), extras) through each component's
    optional `gradients` hook; a step applies its update only if every hook says so."""
    apply = None
    if extras is None:
        return grads, apply, None
    extras = dict(extras)
    for c in components:
        if hasattr(c, "gradients"):
            grads, ok, extras[c.name] = c.gradients(extras[c.name], grads)
            apply = ok if apply is None else apply & ok
    return grads, apply, extras


def is_optional(component: StateComponent) -> bool:
    """Whether a checkpoint may lack the component's state (it then starts from `init`)."""
    return bool(getattr(component, "optional", False))


def inference_variables(
    components: Components, extras: Mapping[str, PyTree] | None, variables: dict[str, Any]
) -> dict[str, Any]:
    """The variables evaluation, prediction and export use (each component in turn).

    Raises:
      ValueError: a component's state is missing (a checkpoint written without its setting).
    """
    for c in components:
        if (extras is None or c.name not in extras) and is_optional(c):
            continue  # (its variables are the ones given)
        if extras is None or c.name not in extras:
            raise ValueError(
                message(
                    f"The checkpoint has no {c.name!r} state: it was written without {c.setting}.",
                    f"{c.setting} set, saved state {sorted(extras or {}) or 'without extras'}",
                    f"Unset {c.setting} to use this checkpoint's weights.",
                )
            )
        variables = c.inference_variables(extras[c.name], variables)
    return variables


def _with(components: Components, hook: str) -> list[StateComponent]:
    return [c for c in components if hasattr(c, hook)]


def host_features(components: Components) -> Callable[[Any], Any] | None:
    """input_fn's features through each component's `host_features` (None: none has one)."""
    fns = [c.host_features for c in _with(components, "host_features")]  # type: ignore[attr-defined]
    if not fns:
        return None

    def apply(features: Any) -> Any:
        for fn in fns:
            features = fn(features)
        return features

    return apply


def split(
    components: Components, extras: Mapping[str, PyTree] | None, features: Any
) -> tuple[Any, dict[str, Any]]:
    """(model_fn's other features, {component: its inputs}) through each `split` hook."""
    inputs: dict[str, Any] = {}
    for c in _with(components, "split"):
        if extras is not None and c.name in extras:
            features, inputs[c.name] = c.split(extras[c.name], features)  # type: ignore[attr-defined]
    return features, inputs


def activations(
    components: Components, extras: Mapping[str, PyTree] | None, inputs: Mapping[str, Any]
) -> dict[str, dict[str, Any]]:
    """{component: its activations} of `split`'s inputs (merged into model_fn's features)."""
    return {
        c.name: c.activations(extras[c.name], inputs[c.name])  # type: ignore[attr-defined]
        for c in _with(components, "activations") if c.name in inputs
    }


def merged(features: Any, acts: Mapping[str, dict[str, Any]]) -> Any:
    """model_fn's features: `features` with every component's activations."""
    if not acts:
        return features
    out = dict(features)
    for a in acts.values():
        out.update(a)
    return out


def placeholders(components: Components, features: Any) -> Any:
    """The features model_fn sees, for its initialisation trace (no state exists yet)."""
    for c in _with(components, "placeholders"):
        features = c.placeholders(features)  # type: ignore[attr-defined]
    return features


def update(
    components: Components, extras: Mapping[str, PyTree] | None, inputs: Mapping[str, Any],
    act_grads: Mapping[str, Any], step: Any,
) -> tuple[dict[str, PyTree] | None, tuple[str, ...]]:
    """(extras after each `update` hook, the names updated: what a vetoed step keeps)."""
    if extras is None:
        return None, ()
    out, names = dict(extras), []
    for c in _with(components, "update"):
        if c.name in inputs:
            out[c.name] = c.update(out[c.name], inputs[c.name], act_grads[c.name], step)  # type: ignore[attr-defined]
            names.append(c.name)
    return out, tuple(names)


def replica_specs(components: Components, extras: Mapping[str, PyTree] | None) -> Any:
    """The per-replica `shard_map` specs of `extras`: each `replica_specs` hook's, else whole
    on every replica."""
    if extras is None:
        return None
    hooks = {c.name: c for c in _with(components, "replica_specs")}
    return {
        name: hooks[name].replica_specs(x) if name in hooks else P()  # type: ignore[attr-defined]
        for name, x in extras.items()
    }


def program_variables(
    components: Components, extras: Mapping[str, PyTree] | None, variables: dict[str, Any]
) -> dict[str, Any]:
    """What evaluation and prediction programs take: `inference_variables`, plus the state
    of each component with `activations` under its name (`forward_inputs` takes it out)."""
    variables = inference_variables(components, extras, variables)
    for c in _with(components, "activations"):
        if extras is not None and c.name in extras:
            variables = {**variables, c.name: extras[c.name]}
    return variables


def variables_replica_specs(components: Components, variables: Any) -> Any:
    """The per-replica specs of `program_variables`: whole, but the components' state."""
    if not isinstance(variables, dict):
        return P()
    hooks = {c.name: c for c in _with(components, "replica_specs")}
    if not any(name in variables for name in hooks):
        return P()
    return {
        name: hooks[name].replica_specs(x) if name in hooks else P()  # type: ignore[attr-defined]
        for name, x in variables.items()
    }


def forward_inputs(components: Components, variables: Any, features: Any) -> tuple[Any, Any]:
    """(Flax variables, model_fn's features) of a forward pass on `program_variables` (an
    export's too): each component with `activations` whose state they carry takes its
    inputs out of the features and gives its activations."""
    owned = [c for c in _with(components, "activations") if isinstance(variables, dict) and c.name in variables]
    if not owned:
        return variables, features
    variables = dict(variables)
    extras = {c.name: variables.pop(c.name) for c in owned}
    features, inputs = split(owned, extras, features)
    return variables, merged(features, activations(owned, extras, inputs))


def on_one_device(components: Components) -> tuple[StateComponent, ...]:
    """The components as a one-device export runs them (`on_one_device` hooks)."""
    return tuple(
        c.on_one_device() if hasattr(c, "on_one_device") else c  # type: ignore[attr-defined]
        for c in components
    )


def export_state(components: Components, extras: Mapping[str, PyTree] | None) -> dict[str, Any]:
    """{component: what an export's variables carry} of a raw checkpoint's `extras`
    (`export_state` hooks: whole embedding tables)."""
    return {
        c.name: c.export_state((extras or {}).get(c.name))  # type: ignore[attr-defined]
        for c in _with(components, "export_state")
    }
