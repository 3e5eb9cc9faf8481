"""The constructor checks of `TPUEstimator`, as the original made them."""

from __future__ import annotations

import logging
import os
import tempfile
from typing import Any

from tpu_estimator.api.checks import is_int, message
from tpu_estimator.api.run_config import RunConfig
from tpu_estimator.api.tpu_config import TPUConfig
from tpu_estimator.parallel.mesh import estimator_devices
from tpu_estimator.paths import as_uri

log = logging.getLogger("tpu_estimator")

RESERVED_PARAMS = ("batch_size", "context")


def check_config(config: Any) -> RunConfig:
    if config is None:
        raise ValueError(
            message(
                "TPUEstimator needs `config`.",
                "config=None",
                "Pass config=tpu_estimator.RunConfig(model_dir=..., tpu_config=TPUConfig(...)).",
            )
        )
    if not isinstance(config, RunConfig):
        raise TypeError(
            message("`config` must be a tpu_estimator.RunConfig.", f"config={type(config).__name__}")
        )
    return config


def check_params(params: Any) -> dict[str, Any]:
    """A copy of `params` ({} for None) without the reserved keys."""
    params = {} if params is None else params
    if not isinstance(params, dict):
        raise TypeError(message("`params` must be a dict or None.", f"params={type(params).__name__}"))
    reserved = [k for k in RESERVED_PARAMS if k in params]
    if reserved:
        raise ValueError(
            message(
                f"`params` must not contain the reserved keys {list(RESERVED_PARAMS)}; "
                "TPUEstimator sets params['batch_size'] itself.",
                f"params keys {reserved}",
                "Pass batch sizes as train_batch_size/eval_batch_size/predict_batch_size.",
            )
        )
    return dict(params)


def check_batch_sizes(use_tpu: bool, **sizes: Any) -> None:
    """Each batch size is a positive int or None; with use_tpu, train_batch_size is required."""
    for name, value in sizes.items():
        if value is not None and (not is_int(value) or value <= 0):
            raise ValueError(message(f"`{name}` must be a positive int.", f"{name}={value!r}"))
    if use_tpu and sizes.get("train_batch_size") is None:
        raise ValueError(
            message(
                "`train_batch_size` cannot be None when use_tpu is True.",
                "train_batch_size=None",
                "Pass the global training batch size, e.g. train_batch_size=256.",
            )
        )


def check_num_shards(tpu_config: TPUConfig, *, use_tpu: bool) -> None:
    """`TPUConfig.num_shards`, when set, must be the replica count found (as the original checked).

    The replicas are the devices (every host's; join the cluster first) divided by
    `num_cores_per_replica`. Without use_tpu (one CPU device) num_shards is ignored,
    as the original ignored it on CPU.
    """
    if tpu_config.num_shards is None or not use_tpu:
        return
    cores = tpu_config.cores_per_replica
    devices = len(estimator_devices(use_tpu=True))
    replicas = devices // cores
    if tpu_config.num_shards != replicas:
        raise ValueError(
            message(
                f"TPUConfig.num_shards must be the number of model replicas: {replicas} "
                f"({devices} devices found / num_cores_per_replica={cores}).",
                f"num_shards={tpu_config.num_shards} with {replicas} replicas on {devices} devices",
                f"Leave num_shards=None (every device is used) or set num_shards={replicas}; to use "
                "fewer devices, make only those visible to JAX (e.g. CUDA_VISIBLE_DEVICES) before it starts.",
            )
        )


def check_export_options(api_version: Any, embedding_config_spec: Any) -> None:
    if api_version not in (1, 2):
        raise ValueError(
            message(
                "`export_saved_model_api_version` must be 1 or 2.",
                f"export_saved_model_api_version={api_version!r}",
            )
        )
    from tpu_estimator.estimator.components import check_component_settings

    check_component_settings(embedding_config_spec=embedding_config_spec)


def agree_model_dir(arg: str | os.PathLike[str] | None, from_config: str | None) -> str:
    """The model directory as a URI (`gs://...` or an absolute local path): the argument and
    the config's must agree; neither: a temp dir."""
    if arg is not None and from_config is not None:
        if as_uri(arg, arg="model_dir") != as_uri(from_config, arg="config.model_dir"):
            raise ValueError(
                message(
                    "`model_dir` given to the estimator and in `config` must be the same.",
                    f"model_dir={arg!r}, config.model_dir={from_config!r}",
                    "Pass it in one place only.",
                )
            )
    chosen = arg if arg is not None else from_config
    if chosen is None:
        chosen = tempfile.mkdtemp(prefix="tpu_estimator_")
        log.warning("Using temporary folder as model directory: %s", chosen)
    return as_uri(chosen, arg="model_dir" if arg is not None else "config.model_dir")
