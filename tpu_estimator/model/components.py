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

Two optional hooks, called only for a component that has them (the dynamic
loss scale of "mixed_float16", extras/loss_scale.py, is the first):

| where                                             | hook                         |
| ------------------------------------------------- | ---------------------------- |
| the loss, inside the differentiated function      | `scale_loss(extra, loss)`    |
| the gradients (averaged over replicas), before the optimizer's update | `gradients(extra, grads) -> (grads, apply, extra)` |

`gradients` sees the gradients of the (scaled) loss, both the parameters' and
the embedding activations', and returns the gradients to apply, a boolean
scalar `apply` (False vetoes the step's update: parameters, optimizer state
and embedding tables stay as they were; the step still counts) and its new
state. `apply` must be the same on every replica.

A component with `optional = True` (the loss scale) may be missing from a
checkpoint: it then starts from `init(state)` of the restored state, in
training and in evaluation, prediction and export, instead of being an error
naming its setting.

Restoring onto another device count needs nothing of a component whose
state is shaped like the parameters (it is restored by shape and sharding,
as the parameters are). The core holds the components of a run in
`BoundModel.components`; they are registered in one place
(`estimator/components.py`) from the user's settings.

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

from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

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
