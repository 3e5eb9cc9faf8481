"""tpu_estimator: TPUEstimator's model_fn/input_fn API on JAX, Flax, Optax and Orbax.

This module only re-exports; the code lives in the subpackages (ARCHITECTURE.md).

The names are loaded on first use (PEP 562 `__getattr__`): `import tpu_estimator`
imports no dependency, `tpu_estimator.RunConfig` only api/, and Orbax, the
summary writer, export and serving load when a program first needs them.
"""

import importlib as _importlib
import typing as _typing

from tpu_estimator.version import __version__ as __version__

if _typing.TYPE_CHECKING:  # what type checkers and readers see; at run time `__getattr__` loads them
    # --- configs (api/) ---
    from tpu_estimator.api.mode_keys import ModeKeys as ModeKeys
    from tpu_estimator.api.run_config import ClusterConfig as ClusterConfig
    from tpu_estimator.api.run_config import RunConfig as RunConfig
    from tpu_estimator.api.tpu_config import InputPipelineConfig as InputPipelineConfig
    from tpu_estimator.api.tpu_config import TPUConfig as TPUConfig

    # --- specs and export outputs (api/) ---
    from tpu_estimator.api.export_output import (
        DEFAULT_SERVING_SIGNATURE_DEF_KEY as DEFAULT_SERVING_SIGNATURE_DEF_KEY,
    )
    from tpu_estimator.api.export_output import ClassificationOutput as ClassificationOutput
    from tpu_estimator.api.export_output import ExportOutput as ExportOutput
    from tpu_estimator.api.export_output import PredictOutput as PredictOutput
    from tpu_estimator.api.export_output import RegressionOutput as RegressionOutput
    from tpu_estimator.api.scaffold import Scaffold as Scaffold
    from tpu_estimator.api.serving_input import ServingInputReceiver as ServingInputReceiver
    from tpu_estimator.api.serving_input import TensorSpec as TensorSpec
    from tpu_estimator.api.serving_input import (
        build_raw_serving_input_receiver_fn as build_raw_serving_input_receiver_fn,
    )
    from tpu_estimator.api.serving_input import (
        build_parsing_serving_input_receiver_fn as build_parsing_serving_input_receiver_fn,
    )
    from tpu_estimator.api.example_parsing import FixedLenFeature as FixedLenFeature
    from tpu_estimator.api.example_parsing import VarLenFeature as VarLenFeature
    from tpu_estimator.api.spec import EstimatorSpec as EstimatorSpec
    from tpu_estimator.api.spec import TPUEstimatorSpec as TPUEstimatorSpec

    # --- the user's functions (typing.Protocols: api/contracts.py, api/spec.py) ---
    from tpu_estimator.api.contracts import HostCallFn as HostCallFn
    from tpu_estimator.api.contracts import InputFn as InputFn
    from tpu_estimator.api.contracts import MetricFn as MetricFn
    from tpu_estimator.api.spec import ModelFn as ModelFn

    # --- hooks (hooks/) ---
    from tpu_estimator.hooks import CheckpointSaverListener as CheckpointSaverListener
    from tpu_estimator.hooks import RunContext as RunContext
    from tpu_estimator.hooks import SessionRunArgs as SessionRunArgs
    from tpu_estimator.hooks import SessionRunHook as SessionRunHook
    from tpu_estimator.hooks import SessionRunValues as SessionRunValues

    # --- metrics ---
    from tpu_estimator import metrics as metrics

    # --- engine (estimator/) ---
    from tpu_estimator.estimator.tpu_estimator import Estimator as Estimator
    from tpu_estimator.estimator.tpu_estimator import TPUEstimator as TPUEstimator
    from tpu_estimator.errors import CheckpointStorageError as CheckpointStorageError
    from tpu_estimator.errors import DamagedCheckpointError as DamagedCheckpointError
    from tpu_estimator.errors import HostLostError as HostLostError
    from tpu_estimator.errors import NanLossDuringTrainingError as NanLossDuringTrainingError
    from tpu_estimator.errors import PreemptedError as PreemptedError
    from tpu_estimator.parallel.input_context import InputContext as InputContext
    from tpu_estimator.estimator.variables import list_variables as list_variables
    from tpu_estimator.loops.compiles import count_compiles as count_compiles
    from tpu_estimator.estimator.variables import load_variable as load_variable
    from tpu_estimator.checkpoint.iterator import checkpoints_iterator as checkpoints_iterator

    # --- export and serving ---
    from tpu_estimator.export.inference import (
        ExportSavedModelApiVersion as ExportSavedModelApiVersion,
    )
    from tpu_estimator.export.inference import inference_on_tpu as inference_on_tpu
    from tpu_estimator.export.loader import load_exported as load_exported
    from tpu_estimator.export.receivers import SupervisedInputReceiver as SupervisedInputReceiver

    # --- around the loop ---
    from tpu_estimator import summary as summary
    from tpu_estimator.hooks import CheckpointSaverHook as CheckpointSaverHook
    from tpu_estimator.hooks import LoggingTensorHook as LoggingTensorHook
    from tpu_estimator.hooks import NanTensorHook as NanTensorHook
    from tpu_estimator.hooks import ProfilerHook as ProfilerHook
    from tpu_estimator.hooks import StepCounterHook as StepCounterHook
    from tpu_estimator.hooks import StopAtStepHook as StopAtStepHook
    from tpu_estimator.hooks import SummarySaverHook as SummarySaverHook
    from tpu_estimator.hooks import make_early_stopping_hook as make_early_stopping_hook
    from tpu_estimator.hooks import stop_if_higher_hook as stop_if_higher_hook
    from tpu_estimator.hooks import stop_if_lower_hook as stop_if_lower_hook
    from tpu_estimator.hooks import stop_if_no_decrease_hook as stop_if_no_decrease_hook
    from tpu_estimator.hooks import stop_if_no_increase_hook as stop_if_no_increase_hook
    from tpu_estimator.checkpoint.warm_start import WarmStartSettings as WarmStartSettings
    from tpu_estimator.checkpoint.tf_checkpoint import (
        suggest_tf_variable_mapping as suggest_tf_variable_mapping,
    )
    from tpu_estimator.estimator.progress import set_progress as set_progress
    from tpu_estimator.estimator.exporters import BestExporter as BestExporter
    from tpu_estimator.estimator.exporters import Exporter as Exporter
    from tpu_estimator.estimator.exporters import FinalExporter as FinalExporter
    from tpu_estimator.estimator.exporters import LatestExporter as LatestExporter
    from tpu_estimator.estimator.train_and_evaluate import EvalSpec as EvalSpec
    from tpu_estimator.estimator.train_and_evaluate import TrainSpec as TrainSpec
    from tpu_estimator.estimator.train_and_evaluate import train_and_evaluate as train_and_evaluate

    # --- scale ---
    from tpu_estimator.parallel.distributed import initialize_cluster as initialize_cluster

    # --- large embeddings (tf.estimator.tpu.experimental / tf.tpu.experimental names) ---
    from tpu_estimator import embedding as embedding
    from tpu_estimator.embedding import AdagradParameters as AdagradParameters
    from tpu_estimator.embedding import AdamParameters as AdamParameters
    from tpu_estimator.embedding import EmbeddingConfigSpec as EmbeddingConfigSpec
    from tpu_estimator.embedding import FeatureConfig as FeatureConfig
    from tpu_estimator.embedding import FtrlParameters as FtrlParameters
    from tpu_estimator.embedding import (
        StochasticGradientDescentParameters as StochasticGradientDescentParameters,
    )
    from tpu_estimator.embedding import TableConfig as TableConfig

# Each public name -> the module that defines it (`metrics`, `summary`: the subpackages).
_LAZY = {
    "tpu_estimator.api.mode_keys": ("ModeKeys",),
    "tpu_estimator.api.run_config": ("ClusterConfig", "RunConfig"),
    "tpu_estimator.api.tpu_config": ("InputPipelineConfig", "TPUConfig"),
    "tpu_estimator.api.export_output": (
        "DEFAULT_SERVING_SIGNATURE_DEF_KEY",
        "ClassificationOutput",
        "ExportOutput",
        "PredictOutput",
        "RegressionOutput",
    ),
    "tpu_estimator.api.scaffold": ("Scaffold",),
    "tpu_estimator.api.serving_input": (
        "ServingInputReceiver",
        "TensorSpec",
        "build_raw_serving_input_receiver_fn",
        "build_parsing_serving_input_receiver_fn",
    ),
    "tpu_estimator.api.example_parsing": ("FixedLenFeature", "VarLenFeature"),
    "tpu_estimator.api.spec": ("EstimatorSpec", "ModelFn", "TPUEstimatorSpec"),
    "tpu_estimator.api.contracts": ("HostCallFn", "InputFn", "MetricFn"),
    "tpu_estimator.hooks": (
        "CheckpointSaverListener",
        "RunContext",
        "SessionRunArgs",
        "SessionRunHook",
        "SessionRunValues",
        "CheckpointSaverHook",
        "LoggingTensorHook",
        "NanTensorHook",
        "ProfilerHook",
        "StepCounterHook",
        "StopAtStepHook",
        "SummarySaverHook",
        "make_early_stopping_hook",
        "stop_if_higher_hook",
        "stop_if_lower_hook",
        "stop_if_no_decrease_hook",
        "stop_if_no_increase_hook",
    ),
    "tpu_estimator.metrics": ("metrics",),
    "tpu_estimator.estimator.tpu_estimator": ("Estimator", "TPUEstimator"),
    "tpu_estimator.errors": (
        "CheckpointStorageError",
        "DamagedCheckpointError",
        "HostLostError",
        "NanLossDuringTrainingError",
        "PreemptedError",
    ),
    "tpu_estimator.parallel.input_context": ("InputContext",),
    "tpu_estimator.estimator.variables": ("list_variables", "load_variable"),
    "tpu_estimator.checkpoint.iterator": ("checkpoints_iterator",),
    "tpu_estimator.loops.compiles": ("count_compiles",),
    "tpu_estimator.export.inference": ("ExportSavedModelApiVersion", "inference_on_tpu"),
    "tpu_estimator.export.loader": ("load_exported",),
    "tpu_estimator.export.receivers": ("SupervisedInputReceiver",),
    "tpu_estimator.summary": ("summary",),
    "tpu_estimator.checkpoint.warm_start": ("WarmStartSettings",),
    "tpu_estimator.checkpoint.tf_checkpoint": ("suggest_tf_variable_mapping",),
    "tpu_estimator.estimator.progress": ("set_progress",),
    "tpu_estimator.estimator.exporters": (
        "BestExporter",
        "Exporter",
        "FinalExporter",
        "LatestExporter",
    ),
    "tpu_estimator.estimator.train_and_evaluate": ("EvalSpec", "TrainSpec", "train_and_evaluate"),
    "tpu_estimator.parallel.distributed": ("initialize_cluster",),
    "tpu_estimator.embedding": (
        "embedding",
        "AdagradParameters",
        "AdamParameters",
        "EmbeddingConfigSpec",
        "FeatureConfig",
        "FtrlParameters",
        "StochasticGradientDescentParameters",
        "TableConfig",
    ),
}
_MODULE_OF = {name: module for module, names in _LAZY.items() for name in names}


def __getattr__(name: str) -> _typing.Any:
    """Imports the module defining public `name` on first access, then caches the value."""
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    loaded = _importlib.import_module(module)
    value = loaded if module == f"{__name__}.{name}" else getattr(loaded, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "AdagradParameters",
    "AdamParameters",
    "BestExporter",
    "CheckpointSaverHook",
    "CheckpointSaverListener",
    "CheckpointStorageError",
    "ClassificationOutput",
    "ClusterConfig",
    "DEFAULT_SERVING_SIGNATURE_DEF_KEY",
    "DamagedCheckpointError",
    "EmbeddingConfigSpec",
    "Estimator",
    "EstimatorSpec",
    "EvalSpec",
    "ExportOutput",
    "ExportSavedModelApiVersion",
    "Exporter",
    "FeatureConfig",
    "FinalExporter",
    "FixedLenFeature",
    "FtrlParameters",
    "HostCallFn",
    "HostLostError",
    "InputContext",
    "InputFn",
    "InputPipelineConfig",
    "LatestExporter",
    "LoggingTensorHook",
    "MetricFn",
    "ModeKeys",
    "ModelFn",
    "NanLossDuringTrainingError",
    "NanTensorHook",
    "PredictOutput",
    "PreemptedError",
    "ProfilerHook",
    "RegressionOutput",
    "RunConfig",
    "RunContext",
    "Scaffold",
    "ServingInputReceiver",
    "SessionRunArgs",
    "SessionRunHook",
    "SessionRunValues",
    "StepCounterHook",
    "StochasticGradientDescentParameters",
    "StopAtStepHook",
    "SummarySaverHook",
    "SupervisedInputReceiver",
    "TPUConfig",
    "TPUEstimator",
    "TPUEstimatorSpec",
    "TableConfig",
    "TensorSpec",
    "TrainSpec",
    "VarLenFeature",
    "WarmStartSettings",
    "build_parsing_serving_input_receiver_fn",
    "build_raw_serving_input_receiver_fn",
    "checkpoints_iterator",
    "count_compiles",
    "embedding",
    "inference_on_tpu",
    "initialize_cluster",
    "list_variables",
    "load_exported",
    "load_variable",
    "make_early_stopping_hook",
    "metrics",
    "set_progress",
    "stop_if_higher_hook",
    "stop_if_lower_hook",
    "stop_if_no_decrease_hook",
    "stop_if_no_increase_hook",
    "suggest_tf_variable_mapping",
    "summary",
    "train_and_evaluate",
]
