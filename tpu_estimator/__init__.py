"""tpu_estimator: TPUEstimator's model_fn/input_fn API on JAX, Flax, Optax and Orbax.

This module only re-exports; the code lives in the subpackages (ARCHITECTURE.md).
"""

# --- configs (api/) ---
from tpu_estimator.api.mode_keys import ModeKeys as ModeKeys
from tpu_estimator.api.run_config import ClusterConfig as ClusterConfig
from tpu_estimator.api.run_config import RunConfig as RunConfig
from tpu_estimator.api.tpu_config import InputPipelineConfig as InputPipelineConfig
from tpu_estimator.api.tpu_config import TPUConfig as TPUConfig

# --- specs and export outputs (api/) ---

# --- hooks (hooks/) ---

# --- metrics ---

# --- engine (estimator/) ---

__version__ = "0.1.0"
