"""`Runtime`: one mode's layout, bound model_fn, compiled programs and state loading.

The core keeps one Runtime per (mode, batch size), so a second call of
`train()`/`evaluate()`/`predict()` reuses the compiled programs.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Any, Callable, Protocol

import jax
import numpy as np

from tpu_estimator.api.checks import message
from tpu_estimator.api.mode_keys import ModeKeys
from tpu_estimator.checkpoint.manager import CheckpointRef
from tpu_estimator.checkpoint.numpy_read import restore_state_numpy, state_metadata
from tpu_estimator.checkpoint.row_reads import opener
from tpu_estimator.checkpoint.variables import Readers, flatten, reader_at, saved_state, variable_name
from tpu_estimator.checkpoint.warm_start import apply_warm_start
from tpu_estimator.feeding.device import aligned_empty
from tpu_estimator.feeding.host_batches import HostBatch
from tpu_estimator.feeding.host_memory import trim
from tpu_estimator.loops import evaluate as eval_loops
from tpu_estimator.loops import predict as predict_loops
from tpu_estimator.loops import train as train_loops
from tpu_estimator.loops.accumulate import micro_batch_size
from tpu_estimator.loops.train import Traced
from tpu_estimator.model import components
from tpu_estimator.model.spec_view import SpecView
from tpu_estimator.model.state import TrainState
from tpu_estimator.loops.replica import Placement
from tpu_estimator.parallel import partitioning
from tpu_estimator.parallel.layout import DataLayout

if TYPE_CHECKING:
    from tpu_estimator.api.run_config import RunConfig
    from tpu_estimator.model.module import BoundModel
    from tpu_estimator.parallel.mesh import Topology

log = logging.getLogger("tpu_estimator")


class RuntimeOwner(Protocol):
    """What a Runtime reads from the object that keeps it (the estimator's `Core`): the
    Runtime names this, not the Core, so neither module imports the other."""

    @property
    def config(self) -> RunConfig: ...

    @property
    def topology(self) -> Topology: ...

    @property
    def use_tpu(self) -> bool: ...

    @property
    def warm_start_from(self) -> Any: ...

    @property
    def variable_readers(self) -> Readers: ...

    def bind(self, mode: str, *, batch_size: int | None = None) -> BoundModel: ...

    def view(self, mode: str) -> Callable[[Any], SpecView]: ...


class Runtime:
    """Programs and state handling of one mode.

    `spec` is the SpecView of model_fn's trace in this mode (`prepare()`
    keeps `InitProgram.trace`'s return value, traced once per runtime): its hooks, metric_fn,
    host_call_fn and scaffold are what the drivers use on the host.
    """

    def __init__(self, core: RuntimeOwner, mode: str, layout: DataLayout) -> None:
        self.core = core
        self.mode = mode
        self.layout = layout
        batch = layout.per_replica_batch_size if layout.global_batch_size else None
        k = core.config.tpu_config.gradient_accumulation_steps
        if mode == ModeKeys.TRAIN and k > 1 and batch is not None:
            batch = micro_batch_size(batch, k)  # model_fn sees micro-batches (loops/accumulate.py)
        self.model = core.bind(mode, batch_size=batch)
        self.example_model = core.bind(mode, batch_size=1)
        self.view = core.view(mode)
        self.traced: Traced | None = None  # model_fn's trace in this mode (set by prepare)
        self._programs: dict[str, Callable[..., Any]] = {}
        self.input_specs: Any = None  # input_partition_dims as PartitionSpecs (set by prepare)
        self.batch_axes: Any = None  # each input's batch axis (set by prepare)

    def program(self, kind: str) -> Callable[..., Any]:
        """The jitted program `kind`, built once and cached."""
        if kind not in self._programs:
            topo = self.core.topology
            place = self.placement
            builders = {
                "init": lambda: train_loops.init_program(
                    self.model, self.view, topo, self.core.config.seed, self.mode == ModeKeys.TRAIN,
                    shardings=self._state_shardings,
                ),
                "scan": lambda: train_loops.scan_program(self.model, self.view, topo, place),
                "step": lambda: train_loops.step_program(self.model, self.view, topo, place),
                "eval": lambda: eval_loops.eval_program(
                    self.model, self.view, topo, per_example=False, placement=place, metric_fn=self._metric_fn
                ),
                "eval_examples": lambda: eval_loops.eval_program(
                    self.example_model, self.view, topo, per_example=True, placement=place
                ),
                "eval_scan": lambda: eval_loops.eval_scan_program(
                    self.model, self.view, topo, place, metric_fn=self._metric_fn
                ),
                "predict": lambda: predict_loops.predict_program(self.model, self.view, topo, place),
                "predict_scan": lambda: predict_loops.predict_scan_program(self.model, self.view, topo, place),
            }
            self._programs[kind] = builders[kind]()
        return self._programs[kind]

    @property
    def _metric_fn(self) -> Callable[..., Any] | None:
        spec = self.spec
        return None if spec is None else spec.metric_fn

    @property
    def placement(self) -> Placement:
        """How the programs place outputs, inputs and state (see `loops.replica.Placement`)."""
        topo = self.core.topology
        if self.layout.replicated_input:
            outputs = "first"
        else:
            outputs = "gather" if topo.num_hosts > 1 else "concat"
        init = self._programs.get("init")
        state = getattr(init, "state_shardings", None)
        specs = None if state is None else jax.tree.map(lambda s: s.spec, state)
        return Placement(outputs, inputs=self.input_specs, state=specs, batch_axes=self.batch_axes)

    def _state_shardings(self, abstract: Any, metadata: Any) -> Any:
        tpu = self.core.config.tpu_config
        specs = partitioning.state_specs(
            abstract, self.core.topology, rules=getattr(tpu, "partition_rules", None),
            metadata=metadata, logical_rules=getattr(tpu, "logical_axis_rules", None),
            fsdp=getattr(tpu, "parameter_sharding", "replicated") == "fsdp",
        )
        specs = specs.replace(extras=components.extras_specs(self.model.components, abstract.extras, specs))
        return partitioning.named(specs, self.core.topology)

    def program_variables(self, state: TrainState) -> dict[str, Any]:
        """What the evaluation and prediction programs take (the components' choice of
        variables, e.g. the averaged weights; the embedding tables under their name)."""
        return components.program_variables(self.model.components, state.extras, state.variables)

    # --- state -----------------------------------------------------------------

    def trace(self, batch: HostBatch, axes: Any) -> Traced:
        """Traces model_fn's initialisation on the first replica's share of `batch`."""
        return self.program("init").trace(*self.replica_sample(batch, axes))

    def prepare(self, batch: HostBatch, axes: Any) -> SpecView:
        """Before the first program: learns the input layout and traces model_fn once (the
        spec's host-side parts: hooks, metric_fn, ...). Returns the spec."""
        if self.batch_axes is None:
            self.batch_axes = axes
        dims = self.core.config.tpu_config.input_partition_dims
        if dims is not None and self.core.use_tpu and self.input_specs is None:
            sample = self.replica_sample(batch, axes)
            self.input_specs = partitioning.input_specs(dims, sample, axes, self.core.topology)
        if self.traced is None:
            self.traced = self.trace(batch, axes)
        return self.traced.spec

    @property
    def spec(self) -> SpecView | None:
        """The spec of model_fn's trace in this mode (None before `prepare`)."""
        return None if self.traced is None else self.traced.spec

    def replica_sample(self, batch: HostBatch, axes: Any) -> tuple[Any, Any]:
        """The first replica's share of a host batch (in TRAIN its first micro-batch): what
        model_fn sees, for initialisation."""
        n = self.layout.per_replica_batch_size if self.layout.global_batch_size else batch.num_real
        if self.mode == ModeKeys.TRAIN:  # a micro-batch with gradient_accumulation_steps
            n = micro_batch_size(n, self.core.config.tpu_config.gradient_accumulation_steps)
        labels = None if self.mode == ModeKeys.PREDICT else batch.labels
        tree = (batch.features, labels)
        axes = (axes[0], None if labels is None else axes[1])
        return jax.tree.map(lambda a, x: np.take(x, np.arange(n), axis=a), axes, tree)

    def load_state(self, batch: HostBatch, axes: Any, ref: CheckpointRef | None) -> TrainState:
        """The state at checkpoint `ref`, or a fresh initialisation (None)."""
        self.prepare(batch, axes)
        init = self.program("init")
        sample = self.replica_sample(batch, axes)
        train = self.mode == ModeKeys.TRAIN
        if ref is None:
            return self._after_init(init(*sample))
        abstract = self.traced.abstract  # what restoring checks model_fn's names against
        tree = state_metadata(ref.path)  # read once for every check
        meta, where = saved_state(tree)
        saved = self._saved_extras(ref, meta)
        comps = self.model.components
        dropped = bool(saved - {c.name for c in comps})  # a setting turned off
        fresh = [c for c in comps if c.name not in saved]  # optional ones, absent
        moved = any(w != ("extras", n) for n, w in where.items())  # an older checkpoint's layout
        if train and not dropped and not fresh and not moved and not self._needs_raw(ref, meta, where):
            return ref.checkpointer.restore(ref.step, abstract)
        # components that read their saved state into this topology's shards themselves
        # (each device's rows of the embedding tables): the raw restore leaves them out
        direct = [c for c in comps if hasattr(c, "from_checkpoint") and c.name in saved]
        if direct:
            unread = [where[c.name] for c in direct] + ([] if train or "opt_state" not in tree else [("opt_state",)])
            raw, _ = saved_state(_restore_without(ref.path, tree, unread))
        else:
            raw, _ = saved_state(ref.checkpointer.restore_raw(ref.step, leave_out=() if train else ("opt_state",)))
        if fresh:  # their state starts from `init` of the restored state
            base = _fill(abstract.replace(extras=None), raw)
            started = {c.name: jax.device_get(c.init(base)) for c in fresh}
            raw = {**raw, "extras": {**dict(raw.get("extras") or {}), **started}}
        # components whose saved state is rebuilt for this topology (embedding tables)
        # (aligned: XLA:CPU keeps the buffers); opened only when a component reads its rows
        rows = opener(ref.path, empty=aligned_empty, release=trim) if direct else None
        rebuilt = {
            c.name: c.from_checkpoint(  # type: ignore[attr-defined]
                meta["extras"][c.name], reader_at(ref.path, where[c.name]), rows, with_slots=train
            )
            for c in direct
        }
        shardings = init.state_shardings.replace(extras=_without(init.state_shardings.extras, rebuilt))
        if train:  # a component's state left out or rebuilt
            state = _fill(abstract.replace(extras=_without(abstract.extras, rebuilt)), raw)
            return _with(jax.device_put(state, shardings), rebuilt)
        variables = self._select_variables(
            {"params": abstract.params, **abstract.collections},
            {"params": raw["params"], **dict(raw.get("collections") or {})},
        )
        state = TrainState(
            params=variables.pop("params"),
            collections=variables,
            opt_state=None,
            step=np.asarray(raw["step"], np.int32),
            rng=np.asarray(raw["rng"], np.uint32),
            extras=None if abstract.extras is None else _fill(
                _without(abstract.extras, rebuilt), raw.get("extras") or {}
            ),
        )
        return _with(jax.device_put(state, shardings), rebuilt)

    def _needs_raw(self, ref: CheckpointRef, meta: dict[str, Any], where: dict[str, Any]) -> bool:
        """Whether a component's saved state must be rebuilt for this run (`restore_plan`: the
        embedding tables saved on another device count or partition strategy)."""
        return any(
            c.restore_plan(meta["extras"][c.name], reader_at(ref.path, where[c.name]))  # type: ignore[attr-defined]
            for c in self.model.components if hasattr(c, "restore_plan")
        )

    def _saved_extras(self, ref: CheckpointRef, meta: dict[str, Any]) -> set[str]:
        """The components whose state the checkpoint holds; each of this run's must be there
        (but optional ones: model/components.py).

        Raises:
          ValueError: a component's state is missing (naming the setting that added it).
        """
        saved = set(meta.get("extras") or {})
        for c in self.model.components:
            if c.name not in saved and not components.is_optional(c):
                raise ValueError(
                    message(
                        f"Checkpoint {ref.path} has no {c.name!r} state: it was written without "
                        f"{c.setting}.",
                        f"{c.setting} set, checkpoint state {sorted(saved) or 'without extras'}",
                        f"Unset {c.setting} to use this checkpoint, or start a new model_dir with "
                        "warm_start_from=<this checkpoint> (the new state starts from its weights).",
                    )
                )
        return saved

    def _select_variables(self, needed: Any, saved: Any) -> dict[str, Any]:
        """The saved variables this mode's model_fn builds (a train-only head may be left out).

        Raises:
          ValueError: a needed variable is missing from the checkpoint or has another shape.
        """
        have = flatten(saved)
        need = flatten(needed)
        missing = sorted(n for n in need if n not in have)
        reshaped = sorted(n for n in need if n in have and np.shape(have[n]) != tuple(need[n].shape))
        if missing or reshaped:
            raise ValueError(
                message(
                    f"model_fn in mode {self.mode!r} builds variables that the checkpoint does not "
                    "have, or has with other shapes.",
                    f"missing {missing}, other shape {reshaped}; the checkpoint has {sorted(have)}",
                    "Layers created only in some modes shift the automatic names of later layers: "
                    "pass name='...' to such layers (and to the ones after them).",
                )
            )
        return dict(jax.tree_util.tree_map_with_path(lambda p, _: have[variable_name(p)], needed))

    def _after_init(self, state: TrainState) -> TrainState:
        """Applies `warm_start_from` (to the variables and to the components' `warm_start_variables`:
        what they warm-start, a checkpoint's embedding tables read by rows),
        then the Scaffold's init_fn (called on the host), to fresh variables; then builds the
        optimizer state and the components' state from the parameters training starts from
        (an optimizer whose state holds parameter values, e.g. an EMA, must see these)."""
        sh = self.program("init").state_shardings
        warm = self.core.warm_start_from
        comps = [c for c in self.model.components if hasattr(c, "warm_start_variables")]
        offered = {} if warm is None else {
            c.name: c.warm_start_variables(state.extras[c.name]) for c in comps  # type: ignore[attr-defined]
        }
        readers = self.core.variable_readers
        # a checkpoint's tables read by rows, as a restore reads them (aligned blocks, trimmed)
        open_rows = functools.partial(opener, empty=aligned_empty, release=trim)
        state, started = apply_warm_start(
            state, warm, {"params": sh.params, **sh.collections}, offered, readers, open_rows
        )
        if started:
            state = _with(state, {
                c.name: c.warm_started(state.extras[c.name], started[c.name])  # type: ignore[attr-defined]
                for c in comps
            })
        scaffold = self.spec.host_scaffold() if self.spec is not None else None
        init_fn = getattr(scaffold, "init_fn", None)
        if init_fn is not None:
            variables = dict(init_fn(jax.device_get(state.variables)))
            params = variables.pop("params", state.params)
            collections = {**state.collections, **variables}
            state = state.replace(
                params=jax.device_put(params, sh.params),
                collections=jax.device_put(collections, self.core.topology.replicated()),
            )
        tx = self.spec.train_op if self.spec is not None else None
        if state.opt_state is not None and tx is not None and (warm is not None or init_fn is not None):
            state = state.replace(opt_state=jax.jit(tx.init, out_shardings=sh.opt_state)(state.params))
        if state.extras is not None and (warm is not None or init_fn is not None):
            extras = jax.jit(lambda s: components.init_extras(self.model.components, s), out_shardings=sh.extras)
            state = state.replace(extras=extras(state))
        return state


def _without(extras: Any, names: Any) -> Any:
    """`extras` (None, or by component name) with the state of `names` left out (None)."""
    if extras is None:
        return None
    return {k: (None if k in names else v) for k, v in extras.items()}


def _with(state: TrainState, extras: dict[str, Any]) -> TrainState:
    """`state` with the components' state `extras` put in."""
    if not extras:
        return state
    return state.replace(extras={**state.extras, **extras})


def _restore_without(checkpoint_path: str, tree: dict[str, Any], leave_out: list[tuple[str, ...]]) -> Any:
    """The state saved in `checkpoint_path` (metadata `tree`) as numpy, but for the subtrees
    at the paths `leave_out` (read by their components)."""
    for path in leave_out:
        tree = _pruned(tree, path)
    return restore_state_numpy(checkpoint_path, tree)


def _pruned(tree: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    """`tree` without the subtree at `path`, nor the dicts that leaves empty (Orbax reads none)."""
    head, *rest = path
    inner = _pruned(dict(tree[head]), tuple(rest)) if rest else {}
    return {k: v for k, v in tree.items() if k != head} | ({head: inner} if inner else {})


def _fill(abstract: Any, raw: Any) -> Any:
    """`abstract`'s structure with the values of the same paths in a raw restore (nested
    dicts and lists, as Orbax writes any pytree)."""

    def value(path: Any, _: Any) -> Any:
        node = raw
        for key in path:
            k = getattr(key, "key", getattr(key, "idx", getattr(key, "name", key)))
            node = node[int(k)] if isinstance(node, (list, tuple)) else node[k if k in node else str(k)]
        return node

    return jax.tree_util.tree_map_with_path(value, abstract)
