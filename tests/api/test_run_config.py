"""RunConfig and ClusterConfig: every validation rule, defaults, replace()."""

import dataclasses
import json
import pathlib

import pytest

from tpu_estimator import ClusterConfig, RunConfig, TPUConfig
from tpu_estimator.api.run_config import ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID


def test_defaults():
    cfg = RunConfig()
    assert cfg.model_dir is None
    assert cfg.tpu_config == TPUConfig()
    assert cfg.save_checkpoints_secs == 600 and cfg.save_checkpoints_steps is None
    assert cfg.save_summary_steps == 100 and cfg.log_step_count_steps == 100
    assert cfg.keep_checkpoint_max == 5 and cfg.keep_checkpoint_every_n_hours == 10000
    assert cfg.seed == 0 and cfg.cluster is None


def test_checkpoint_secs_default_only_when_neither_given():
    assert RunConfig(save_checkpoints_steps=100).save_checkpoints_secs is None
    assert RunConfig(save_checkpoints_secs=60).save_checkpoints_steps is None
    both_none = RunConfig(save_checkpoints_steps=None, save_checkpoints_secs=None)
    assert both_none.save_checkpoints_secs is None and both_none.save_checkpoints_steps is None


def test_checkpoint_steps_and_secs_both_error():
    with pytest.raises(ValueError, match="at most one of `save_checkpoints_steps`.*Set the other"):
        RunConfig(save_checkpoints_steps=10, save_checkpoints_secs=60)


@pytest.mark.parametrize("value, error", [(0, ValueError), (-1, ValueError), (1.5, TypeError)])
def test_save_checkpoints_steps_invalid(value, error):
    with pytest.raises(error, match="save_checkpoints_steps"):
        RunConfig(save_checkpoints_steps=value)


@pytest.mark.parametrize(
    "value, error",
    [(-1, ValueError), (float("nan"), ValueError), ("60", TypeError), (True, TypeError)],
)
def test_save_checkpoints_secs_invalid(value, error):
    with pytest.raises(error, match="save_checkpoints_secs"):
        RunConfig(save_checkpoints_secs=value)


def test_replace_clears_the_other_checkpoint_trigger():
    cfg = RunConfig(save_checkpoints_steps=100)
    by_secs = cfg.replace(save_checkpoints_secs=60)
    assert by_secs.save_checkpoints_secs == 60 and by_secs.save_checkpoints_steps is None
    by_steps = by_secs.replace(save_checkpoints_steps=5)
    assert by_steps.save_checkpoints_steps == 5 and by_steps.save_checkpoints_secs is None
    assert cfg.save_checkpoints_steps == 100  # the original is untouched


def test_replace_revalidates_and_rejects_unknown_fields():
    cfg = RunConfig()
    with pytest.raises(ValueError, match="save_summary_steps"):
        cfg.replace(save_summary_steps=0)
    with pytest.raises(ValueError, match="only takes RunConfig fields"):
        cfg.replace(not_a_field=1)
    with pytest.raises(ValueError, match="at most one"):
        cfg.replace(save_checkpoints_steps=1, save_checkpoints_secs=1)


def test_immutable():
    cfg = RunConfig()
    with pytest.raises((dataclasses.FrozenInstanceError, AttributeError)):
        cfg.model_dir = "/tmp/x"
    with pytest.raises((dataclasses.FrozenInstanceError, AttributeError)):
        del cfg.tpu_config


def test_model_dir(tmp_path):
    assert RunConfig(model_dir=tmp_path).model_dir == str(tmp_path)
    assert RunConfig(model_dir=pathlib.PurePosixPath("/a/b")).model_dir == "/a/b"
    with pytest.raises(ValueError, match="must not be empty"):
        RunConfig(model_dir="")
    with pytest.raises(TypeError, match="model_dir"):
        RunConfig(model_dir=3)


def test_tpu_config_type():
    tc = TPUConfig(iterations_per_loop=10)
    assert RunConfig(tpu_config=tc).tpu_config is tc
    with pytest.raises(TypeError, match="tpu_config"):
        RunConfig(tpu_config={"iterations_per_loop": 10})


def test_tf_random_seed():
    assert RunConfig(tf_random_seed=42).seed == 42
    for bad in (1.5, "1", True):
        with pytest.raises(TypeError, match="tf_random_seed"):
            RunConfig(tf_random_seed=bad)


@pytest.mark.parametrize("name", ["save_summary_steps", "log_step_count_steps"])
def test_optional_step_counts(name):
    assert getattr(RunConfig(**{name: None}), name) is None
    with pytest.raises(ValueError, match=f"{name}.*Use None to disable"):
        RunConfig(**{name: 0})
    with pytest.raises(TypeError, match=name):
        RunConfig(**{name: "10"})


def test_keep_checkpoint_max():
    assert RunConfig(keep_checkpoint_max=0).keep_checkpoint_max == 0
    assert RunConfig(keep_checkpoint_max=None).keep_checkpoint_max is None
    for bad in (-1, 1.5, "3"):
        with pytest.raises(ValueError, match="keep_checkpoint_max"):
            RunConfig(keep_checkpoint_max=bad)


def test_keep_checkpoint_every_n_hours():
    assert RunConfig(keep_checkpoint_every_n_hours=0.5).keep_checkpoint_every_n_hours == 0.5
    with pytest.raises(ValueError, match="keep_checkpoint_every_n_hours"):
        RunConfig(keep_checkpoint_every_n_hours=-1)
    with pytest.raises(TypeError, match="keep_checkpoint_every_n_hours"):
        RunConfig(keep_checkpoint_every_n_hours=None)


def test_cluster_type():
    cluster = ClusterConfig("localhost:1234", 2, 0)
    assert RunConfig(cluster=cluster).cluster is cluster
    with pytest.raises(TypeError, match="cluster"):
        RunConfig(cluster="localhost:1234")


# --- ClusterConfig ---


def test_cluster_auto_and_explicit():
    assert not ClusterConfig().is_explicit
    cfg = ClusterConfig(coordinator_address="10.0.0.1:8476", num_processes=4, process_id=3)
    assert cfg.is_explicit


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(coordinator_address="h:1"),
        dict(num_processes=2),
        dict(process_id=0),
        dict(coordinator_address="h:1", num_processes=2),
    ],
)
def test_cluster_all_or_nothing(kwargs):
    with pytest.raises(
        ValueError, match="all of coordinator_address, num_processes and process_id"
    ):
        ClusterConfig(**kwargs)


def test_cluster_address_needs_port():
    with pytest.raises(ValueError, match="'host:port'"):
        ClusterConfig("localhost", 2, 0)
    with pytest.raises(ValueError, match="'host:port'"):
        ClusterConfig(1234, 2, 0)


@pytest.mark.parametrize("num, error", [(0, ValueError), (-1, ValueError), ("2", TypeError)])
def test_cluster_num_processes(num, error):
    with pytest.raises(error, match="num_processes"):
        ClusterConfig("h:1", num, 0)


@pytest.mark.parametrize("pid", [-1, 2, 5, 1.0, "0", True])
def test_cluster_process_id_range(pid):
    with pytest.raises(ValueError, match=r"process_id.*\[0, num_processes\)"):
        ClusterConfig("h:1", 2, pid)


def test_cluster_from_environment():
    assert ClusterConfig.from_environment({}) == ClusterConfig()
    env = {ENV_COORDINATOR: "h:99", ENV_NUM_PROCESSES: "3", ENV_PROCESS_ID: "2"}
    assert ClusterConfig.from_environment(env) == ClusterConfig("h:99", 3, 2)
    with pytest.raises(ValueError, match="must be set to integers"):
        ClusterConfig.from_environment({ENV_COORDINATOR: "h:99", ENV_NUM_PROCESSES: "3"})
    with pytest.raises(ValueError, match="must be set to integers"):
        ClusterConfig.from_environment({**env, ENV_PROCESS_ID: "x"})
    with pytest.raises(ValueError, match="process_id"):
        ClusterConfig.from_environment({**env, ENV_PROCESS_ID: "3"})


def test_cluster_from_os_environ(monkeypatch):
    monkeypatch.setenv(ENV_COORDINATOR, "h:5")
    monkeypatch.setenv(ENV_NUM_PROCESSES, "2")
    monkeypatch.setenv(ENV_PROCESS_ID, "1")
    assert ClusterConfig.from_environment() == ClusterConfig("h:5", 2, 1)


def test_cluster_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        ClusterConfig().num_processes = 2


# --- TF_CONFIG ---

TF_CLUSTER = {"chief": ["host0:2222"], "ps": ["host1:2222", "host2:2222"],
              "worker": ["host3:2222", "host4:2222", "host5:2222"]}


def tf_config(cluster, task_type, index):
    return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})}


def test_tf_config_absent_is_local_worker_zero(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    cfg = RunConfig()
    assert cfg.cluster_spec == {} and cfg.task_type == "worker" and cfg.task_id == 0
    assert cfg.is_chief and cfg.num_worker_replicas == 1
    local = json.dumps({"task": {"type": "worker", "index": 0}})
    monkeypatch.setenv("TF_CONFIG", local)
    assert RunConfig().is_chief and ClusterConfig.from_environment() == ClusterConfig()


def test_tf_config_properties_as_tf_run_config(monkeypatch):
    # TF's RunConfig docstring example: a worker and the chief.
    monkeypatch.setenv("TF_CONFIG", tf_config(TF_CLUSTER, "worker", 1)["TF_CONFIG"])
    cfg = RunConfig()
    assert cfg.cluster_spec == TF_CLUSTER and cfg.task_type == "worker" and cfg.task_id == 1
    assert not cfg.is_chief and cfg.num_worker_replicas == 4
    monkeypatch.setenv("TF_CONFIG", tf_config(TF_CLUSTER, "chief", 0)["TF_CONFIG"])
    chief = RunConfig()
    assert chief.is_chief and chief.task_type == "chief" and chief.num_worker_replicas == 4
    monkeypatch.delenv("TF_CONFIG")  # read once, at construction
    assert chief.is_chief and chief.cluster_spec == TF_CLUSTER
    cfg.cluster_spec["chief"].append("x:1")  # a copy
    assert cfg.cluster_spec == TF_CLUSTER


def test_tf_config_evaluator_and_no_chief(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", tf_config(TF_CLUSTER, "evaluator", 0)["TF_CONFIG"])
    evaluator = RunConfig()  # not part of the training cluster, as in TF
    assert evaluator.task_type == "evaluator" and evaluator.cluster_spec == {}
    assert not evaluator.is_chief and evaluator.num_worker_replicas == 0
    workers = {"worker": ["w0:1", "w1:1"]}
    monkeypatch.setenv("TF_CONFIG", tf_config(workers, "worker", 0)["TF_CONFIG"])
    assert RunConfig().is_chief  # worker 0 leads when there is no chief
    monkeypatch.setenv("TF_CONFIG", tf_config(workers, "worker", 1)["TF_CONFIG"])
    assert not RunConfig().is_chief


def test_cluster_from_tf_config():
    # Processes: the chief, then the workers; the coordinator is the chief's address.
    assert ClusterConfig.from_environment(tf_config(TF_CLUSTER, "chief", 0)) == ClusterConfig("host0:2222", 4, 0)
    for i in range(3):
        env = tf_config(TF_CLUSTER, "worker", i)
        assert ClusterConfig.from_environment(env) == ClusterConfig("host0:2222", 4, i + 1)
    workers = {"worker": ["w0:7", "w1:7", "w2:7"]}  # no chief: worker 0 coordinates
    assert ClusterConfig.from_environment(tf_config(workers, "worker", 2)) == ClusterConfig("w0:7", 3, 2)
    # One training task: one process.
    assert ClusterConfig.from_environment(tf_config({"chief": ["c:1"]}, "chief", 0)) == ClusterConfig()
    # TPU_ESTIMATOR_* comes first.
    both = {**tf_config(workers, "worker", 2), ENV_COORDINATOR: "h:9", ENV_NUM_PROCESSES: "2", ENV_PROCESS_ID: "1"}
    assert ClusterConfig.from_environment(both) == ClusterConfig("h:9", 2, 1)


@pytest.mark.parametrize("task_type", ["ps", "evaluator"])
def test_cluster_from_tf_config_rejects_ps_and_evaluator(task_type):
    with pytest.raises(
        ValueError,
        match=rf"TF_CONFIG's task must be a 'chief' or a 'worker'.*Received: TF_CONFIG task "
        rf"type='{task_type}'.*only for the chief and worker tasks",
    ):
        ClusterConfig.from_environment(tf_config(TF_CLUSTER, task_type, 0))


@pytest.mark.parametrize(
    "raw, error",
    [
        ("{not json", "TF_CONFIG must be a JSON object"),
        ("[1, 2]", "TF_CONFIG must be a JSON object"),
        ('{"cluster": {"worker": "w0:1"}}', "'cluster' must map task types to lists"),
        ('{"cluster": ["w0:1"]}', "'cluster' must map task types to lists"),
        ('{"cluster": {"worker": ["w0:1"]}, "task": "worker"}', "'task' must be an object"),
        ('{"cluster": {"worker": ["w0:1"]}, "task": {"type": "worker"}}', "must name a 'type' and an 'index'"),
        ('{"cluster": {"worker": ["w0:1"]}, "task": {"type": "worker", "index": -1}}', "an 'index' >= 0"),
        ('{"cluster": {"worker": ["w0:1"]}, "task": {"type": "worker", "index": 1}}', "one of its cluster's 'worker'"),
        ('{"cluster": {"worker": ["w0:1"]}, "task": {"type": "chief", "index": 0}}', "one of its cluster's 'chief'"),
        ('{"cluster": {"chief": ["a:1", "b:1"]}, "task": {"type": "chief", "index": 0}}', "one 'chief' at most"),
        ('{"task": {"type": "chief", "index": 0}}', "Without a 'cluster'.*'worker', 'index': 0"),
        ('{"task": {"type": "worker", "index": 2}}', "Without a 'cluster'"),
    ],
)
def test_tf_config_invalid(monkeypatch, raw, error):
    monkeypatch.setenv("TF_CONFIG", raw)
    for read in (RunConfig, ClusterConfig.from_environment):
        with pytest.raises(ValueError, match=rf"{error}.*Received: TF_CONFIG=.*Example: "):
            read()


def test_fall_back_to_intact_checkpoint_is_an_opt_in_kept_by_replace():
    assert RunConfig().fall_back_to_intact_checkpoint is False
    cfg = RunConfig(fall_back_to_intact_checkpoint=True)
    assert cfg.fall_back_to_intact_checkpoint is True
    assert cfg.replace(save_checkpoints_steps=10).fall_back_to_intact_checkpoint is True
    assert cfg.replace(fall_back_to_intact_checkpoint=False).fall_back_to_intact_checkpoint is False


@pytest.mark.parametrize("value", [1, "yes", None])
def test_fall_back_to_intact_checkpoint_must_be_a_bool(value):
    with pytest.raises(TypeError, match=r"`fall_back_to_intact_checkpoint` must be True or False\. Received: "
                       rf"fall_back_to_intact_checkpoint={value!r}"):
        RunConfig(fall_back_to_intact_checkpoint=value)
    with pytest.raises(TypeError, match="fall_back_to_intact_checkpoint"):
        RunConfig().replace(fall_back_to_intact_checkpoint=value)


def test_lost_host_timeout_from_the_cluster_config_else_the_environment_else_60():
    from tpu_estimator.parallel.distributed import ENV_LOST_HOST_TIMEOUT, lost_host_timeout_s

    assert lost_host_timeout_s(ClusterConfig(lost_host_timeout_s=9.5), environ={ENV_LOST_HOST_TIMEOUT: "30"}) == 10
    assert lost_host_timeout_s(ClusterConfig(), environ={ENV_LOST_HOST_TIMEOUT: "30"}) == 30
    assert lost_host_timeout_s(None, environ={}) == 60
    with pytest.raises(ValueError, match=r"TPU_ESTIMATOR_LOST_HOST_TIMEOUT_S must be a number of seconds >= 1. "
                       r"Received: TPU_ESTIMATOR_LOST_HOST_TIMEOUT_S='soon'"):
        lost_host_timeout_s(None, environ={ENV_LOST_HOST_TIMEOUT: "soon"})
    with pytest.raises(ValueError, match=r"lost_host_timeout_s` must be a number of seconds >= 1.*"
                       r"Received: lost_host_timeout_s=0"):
        ClusterConfig("h:1", 2, 0, lost_host_timeout_s=0)
