"""A damage campaign: every kind of damage to the newest checkpoint, under every operation.

One tiny model is trained once (checkpoints at steps 0, 4 and 8); each case
copies its model_dir, damages it, and runs one operation. Without the opt-in
the operation raises `DamagedCheckpointError` naming the step directory, the
problem and the newest intact step; with `fall_back_to_intact_checkpoint=True`
it warns about the skipped step and gives exactly what the newest intact step
gives. Never a raw TensorStore/Orbax exception, never a silently other result.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import re
import shutil

import grain
import numpy as np
import pytest

import tpu_estimator as te
from tests.estimator.models import batches_fn, make_data, mlp_model_fn
from tpu_estimator.checkpoint.integrity import DIGESTS_FILE, DamagedCheckpointError

NEWEST = 8
TRAIN_TO = 12
OPS = ["train", "evaluate", "predict", "export", "get_variable_value", "load_variable"]
CONFIG_OPS = OPS[:-1]  # load_variable reads without a RunConfig: no fall back
FILE_KINDS = {
    "array data": None,  # the largest file under state/**/d/
    "state metadata": "state/_METADATA",
    "ocdbt manifest": "state/manifest.ocdbt",
    "step metadata": "_CHECKPOINT_METADATA",
    "input position": "input/metadata",
    "digests": DIGESTS_FILE,
}
FILE_DAMAGES = ["delete", "truncate", "flip", "empty"]
DIR_DAMAGES = ["empty newer step", "half-copied newer step", "half-copied newer step before its digests"]
CASES = [f"{how} {kind}" for kind in FILE_KINDS for how in FILE_DAMAGES] + DIR_DAMAGES


def _train_input(x, y):
    def input_fn(params):
        return (
            grain.MapDataset.range(len(x)).shuffle(seed=3).repeat().batch(params["batch_size"])
            .map(lambda idx: ({"x": x[idx]}, y[idx])).to_iter_dataset()
        )

    return input_fn


def _estimator(model_dir, fall_back=False):
    cfg = te.RunConfig(
        model_dir=str(model_dir), tpu_config=te.TPUConfig(iterations_per_loop=4, loop_strategy="scan"),
        save_checkpoints_steps=4,
        tf_random_seed=0, log_step_count_steps=None, fall_back_to_intact_checkpoint=fall_back,
    )
    return te.TPUEstimator(mlp_model_fn, config=cfg, params={"lr": 0.1}, train_batch_size=16,
                           eval_batch_size=16, predict_batch_size=16)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    x, y = make_data(96)
    root = tmp_path_factory.mktemp("damage")
    _estimator(root / "model").train(_train_input(x, y), max_steps=NEWEST)
    assert sorted(int(d) for d in os.listdir(root / "model") if d.isdigit()) == [0, 4, NEWEST]
    return {"root": root, "model": root / "model", "x": x, "y": y, "refs": {}, "estimators": {}}


def _run(op, model_dir, data, *, fall_back=False, est=None):
    """The operation's result as comparable numpy values (`est`: an estimator of model_dir)."""
    x, y = data["x"], data["y"]
    if op == "load_variable":
        return {"kernel": te.load_variable(str(model_dir), "Dense_0/kernel")}
    est = est or _estimator(model_dir, fall_back)
    if op == "train":
        est.train(_train_input(x, y), max_steps=TRAIN_TO)
        return {n: est.get_variable_value(n) for n in ("Dense_0/kernel", "Dense_1/bias", "global_step")}
    if op == "evaluate":
        return est.evaluate(batches_fn(x, y), steps=2)
    if op == "predict":
        return {"logits": np.stack([p["logits"] for p in est.predict(batches_fn(x[:32], None))])}
    if op == "export":
        receiver = te.build_raw_serving_input_receiver_fn({"x": np.zeros((1, 8), np.float32)})
        out = os.fsdecode(est.export_saved_model(str(data["root"] / f"export_{os.path.basename(model_dir)}"), receiver))
        return {n: te.load_variable(out, n) for n in ("Dense_0/kernel", "global_step")}
    assert op == "get_variable_value"
    return {n: est.get_variable_value(n) for n in ("Dense_0/kernel", "Dense_1/bias", "global_step")}


def _reference(data, op, step):
    """What `op` gives on the untouched checkpoints up to `step` (the newest intact one)."""
    key = (op, step)
    if key not in data["refs"]:
        model_dir = data["root"] / f"ref_{op}_{step}"
        shutil.copytree(data["model"], model_dir)
        for d in os.listdir(model_dir):
            if d.isdigit() and int(d) > step:
                shutil.rmtree(model_dir / d)
        data["refs"][key] = _run(op, model_dir, data)
    return data["refs"][key]


def _files(step_dir):
    return sorted(
        os.path.relpath(os.path.join(r, f), step_dir) for r, _, fs in os.walk(step_dir) for f in fs
    )


def _damage(model_dir, case) -> tuple[str, int]:
    """Damages a copy of the model_dir as `case` says; (the damaged step dir, the newest intact step)."""
    step_dir = str(model_dir / str(NEWEST))
    if case in DIR_DAMAGES:
        newer = model_dir / str(NEWEST + 4)
        if case == "empty newer step":
            newer.mkdir()
        else:  # copied file by file (sorted; the digests file comes last) and interrupted
            names = _files(step_dir)
            if case == "half-copied newer step":
                names = [n for i, n in enumerate(names) if n == DIGESTS_FILE or i % 2 == 0]
            else:
                names = names[: len(names) // 2]
            for name in names:
                os.makedirs(os.path.dirname(newer / name), exist_ok=True)
                shutil.copy2(os.path.join(step_dir, name), newer / name)
        return str(newer), NEWEST
    how, kind = case.split(" ", 1)
    rel = FILE_KINDS[kind]
    if rel is None:
        data_files = [n for n in _files(step_dir) if "/d/" in n]
        rel = max(data_files, key=lambda n: os.path.getsize(os.path.join(step_dir, n)))
    path = os.path.join(step_dir, rel)
    if how == "delete":
        os.remove(path)
    elif how == "empty":
        open(path, "wb").close()
    elif how == "truncate":
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 2)
    else:
        with open(path, "r+b") as f:
            f.seek(os.path.getsize(path) // 2)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0x01]))
    return step_dir, 4


def _equal(a, b):
    assert set(a) == set(b)
    for k in a:
        np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]), err_msg=k)


def _case_dir(data, case, op, mode):
    model_dir = data["root"] / re.sub(r"\W+", "_", f"{mode}_{op}_{case}")
    shutil.copytree(data["model"], model_dir)
    return model_dir


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("case", CASES)
def test_a_damaged_newest_checkpoint_is_an_error_naming_it_and_the_fix(trained, case, op):
    model_dir = _case_dir(trained, case, op, "error")
    damaged, intact = _damage(model_dir, case)
    with pytest.raises(DamagedCheckpointError) as info:
        _run(op, model_dir, trained)
    text = str(info.value)
    assert f"Received: {damaged} is damaged: " in text
    assert f"Delete {damaged} (or move it out of {model_dir}) to continue from {model_dir / str(intact)}" in text
    if op != "load_variable":
        assert "fall_back_to_intact_checkpoint=True" in text


@pytest.mark.parametrize("op", CONFIG_OPS)
@pytest.mark.parametrize("case", CASES)
def test_opt_in_falls_back_to_the_newest_intact_checkpoint(trained, case, op, caplog):
    model_dir = trained["root"] / f"fallback_{op}"  # one per operation: its programs compile once
    shutil.rmtree(model_dir, ignore_errors=True)
    shutil.copytree(trained["model"], model_dir)
    if op not in trained["estimators"]:
        trained["estimators"][op] = _estimator(model_dir, fall_back=True)
    damaged, intact = _damage(model_dir, case)
    with caplog.at_level(logging.WARNING, logger="tpu_estimator"):
        got = _run(op, model_dir, trained, est=trained["estimators"][op])
    skipped = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Skipped damaged")]
    assert skipped and f"{damaged} (" in skipped[0] and f"Using {model_dir / str(intact)}," in skipped[0]
    _equal(got, _reference(trained, op, intact))
    if op == "train":  # the damaged step it saved over was moved aside, not deleted
        assert os.path.isdir(f"{damaged}.damaged")


# --- around the campaign -------------------------------------------------------------------


def _copy(data, name):
    model_dir = data["root"] / name
    shutil.copytree(data["model"], model_dir)
    return model_dir


def test_every_saved_step_has_digests_recorded_before_its_commit(trained):
    from tpu_estimator.checkpoint import integrity

    for step in (0, 4, NEWEST):
        verdict = integrity.verify(str(trained["model"]), step, [0, 4, NEWEST])
        assert verdict.intact and verdict.has_digests and verdict.input_saved
    assert not [d for d in os.listdir(trained["model"]) if "orbax-checkpoint-tmp" in d]


@pytest.mark.parametrize("fall_back", [False, True])
def test_an_explicit_checkpoint_path_is_never_replaced(trained, fall_back):
    model_dir = _copy(trained, f"explicit_{fall_back}")
    damaged, intact = _damage(model_dir, "flip array data")
    est = _estimator(model_dir, fall_back)
    with pytest.raises(DamagedCheckpointError, match=re.escape(
        f"Received: {damaged} is damaged: state/") + ".*changed.*" + re.escape(
        f"Use {model_dir / '4'}, the newest intact checkpoint before it (e.g. checkpoint_path='{model_dir / '4'}')")):
        est.evaluate(batches_fn(trained["x"], trained["y"]), steps=1, checkpoint_path=damaged)
    with pytest.raises(DamagedCheckpointError, match="newest intact checkpoint before it"):
        te.list_variables(damaged)
    assert est.evaluate(batches_fn(trained["x"], trained["y"]), steps=2, checkpoint_path=str(model_dir / "4")) == (
        _reference(trained, "evaluate", 4)
    )


def test_no_intact_checkpoint_left_is_an_error_even_with_the_opt_in(trained):
    model_dir = _copy(trained, "none_intact")
    for step in (0, 4, NEWEST):
        os.remove(model_dir / str(step) / "state" / "_METADATA")
    with pytest.raises(DamagedCheckpointError, match="every checkpoint of .* is damaged.*Restore the step directories"):
        _estimator(model_dir, True).evaluate(batches_fn(trained["x"], trained["y"]), steps=1)
    with pytest.raises(DamagedCheckpointError, match="No older checkpoint of .* is intact"):
        _estimator(model_dir).evaluate(batches_fn(trained["x"], trained["y"]), steps=1)


def test_unfinished_temporary_and_moved_aside_directories_are_ignored(trained, caplog):
    model_dir = _copy(trained, "tmp_dirs")
    tmp = model_dir / f"{NEWEST + 4}.orbax-checkpoint-tmp"  # a save killed half-way
    shutil.copytree(model_dir / str(NEWEST) / "state", tmp / "state")
    os.remove(tmp / "state" / "_METADATA")
    (model_dir / f"{NEWEST + 8}.damaged").mkdir()
    with caplog.at_level(logging.WARNING, logger="tpu_estimator"):
        got = _run("evaluate", model_dir, trained)
    assert not [r for r in caplog.records if "damaged" in r.getMessage().lower()]
    _equal(got, _reference(trained, "evaluate", NEWEST))


def test_warm_start_from_a_damaged_checkpoint_is_an_error(trained, tmp_path):
    model_dir = _copy(trained, "warm_source")
    damaged, _ = _damage(model_dir, "truncate array data")
    cfg = te.RunConfig(model_dir=str(tmp_path / "new"), log_step_count_steps=None)
    est = te.TPUEstimator(mlp_model_fn, config=cfg, params={"lr": 0.1}, train_batch_size=16,
                          warm_start_from=str(model_dir))
    with pytest.raises(DamagedCheckpointError, match=re.escape(f"{damaged} is damaged: state/") + ".*truncated"):
        est.train(_train_input(trained["x"], trained["y"]), max_steps=1)


# A failed full read must leave no read of TensorStore pending: Orbax's restore left some,
# whose completions hit its closed event loop ("Event loop is closed" from TensorStore's
# threads, an unraisable exception); gc.collect() has the warning raised in this test
# (test_full_read.py shows it deterministically).
@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
def test_checkpoints_of_a_version_before_digests_are_read_in_full_and_flagged(trained, caplog):
    model_dir = _copy(trained, "legacy")
    for step in (0, 4, NEWEST):
        os.remove(model_dir / str(step) / DIGESTS_FILE)
    with caplog.at_level(logging.WARNING, logger="tpu_estimator"):
        got = _run("evaluate", model_dir, trained)
    assert any("cannot be verified" in r.getMessage() for r in caplog.records)
    _equal(got, _reference(trained, "evaluate", NEWEST))
    data_file = [n for n in _files(model_dir / str(NEWEST)) if n.startswith("state/d/")][0]
    os.remove(model_dir / str(NEWEST) / data_file)  # legacy, and what Orbax reads is gone
    with pytest.raises(DamagedCheckpointError, match=f"no {DIGESTS_FILE} and Orbax cannot read it"):
        _run("evaluate", model_dir, trained)
    gc.collect()


def _rewrite_input_position(step_dir, text):
    from tpu_estimator.checkpoint import integrity

    (step_dir / "input" / "metadata").write_text(text)
    integrity.write_digests(step_dir, input_saved=True)  # as if it had been saved so


def test_an_input_position_that_does_not_restore_is_an_error(trained):
    model_dir = _copy(trained, "input_unrestorable")
    _rewrite_input_position(model_dir / str(NEWEST), '{"state": {"not_a_grain_field": 1}}')
    with pytest.raises(DamagedCheckpointError, match=re.escape(
            f"Received: {model_dir / str(NEWEST)}/input cannot be restored: KeyError") + ".*fall_back_to_intact_checkpoint=True"):
        _run("train", model_dir, trained)


def test_opt_in_restarts_an_input_position_that_does_not_restore_with_a_warning(trained, caplog):
    model_dir = _copy(trained, "input_restart")
    _rewrite_input_position(model_dir / str(NEWEST), '{"state": {"not_a_grain_field": 1}}')
    with caplog.at_level(logging.WARNING, logger="tpu_estimator"):
        got = _run("train", model_dir, trained, fall_back=True)
    assert any("the input starts from its beginning" in r.getMessage() for r in caplog.records)
    assert got["global_step"] == TRAIN_TO


def test_a_checkpoint_saved_without_an_input_position_warns_that_the_input_restarts(trained, tmp_path, caplog):
    from tpu_estimator.checkpoint import integrity

    est = _estimator(tmp_path)
    est.train(batches_fn(trained["x"], trained["y"], repeat=10), max_steps=4)  # a generator: no position
    assert integrity.verify(str(tmp_path), 4, [0, 4]).input_saved is False
    with caplog.at_level(logging.WARNING, logger="tpu_estimator"):
        _estimator(tmp_path).train(_train_input(trained["x"], trained["y"]), max_steps=8)
    assert any(
        "holds no input position (input_fn's iterator was not checkpointable when it was saved): the input "
        "starts from its beginning" in r.getMessage() for r in caplog.records
    )


def test_an_edited_digests_file_is_damage_of_its_own(trained):
    model_dir = _copy(trained, "digests_edited")
    path = model_dir / str(NEWEST) / DIGESTS_FILE
    record = json.loads(path.read_text())
    record["input_saved"] = False  # still JSON, still plausible
    path.write_text(json.dumps(record))
    with pytest.raises(DamagedCheckpointError, match=re.escape(f"{DIGESTS_FILE}: changed (its own digest does not match)")):
        te.load_variable(str(model_dir), "global_step")


def test_a_long_list_of_problems_is_shortened(trained):
    model_dir = _copy(trained, "many_problems")
    step_dir = model_dir / str(NEWEST)
    for name in _files(step_dir):
        if name not in (DIGESTS_FILE, "_CHECKPOINT_METADATA") and name.startswith("state/"):
            os.remove(step_dir / name)
    with pytest.raises(DamagedCheckpointError, match=r"missing; and \d+ more\. Delete"):
        te.load_variable(str(model_dir), "global_step")


def test_latest_checkpoint_names_the_newest_intact_step_or_says_it_is_damaged(trained, caplog):
    model_dir = _copy(trained, "latest")
    damaged, intact = _damage(model_dir, "flip array data")
    with pytest.raises(DamagedCheckpointError, match=re.escape(f"Received: {damaged} is damaged: state/")):
        _estimator(model_dir).latest_checkpoint()
    with caplog.at_level(logging.WARNING, logger="tpu_estimator"):
        assert _estimator(model_dir, fall_back=True).latest_checkpoint() == str(model_dir / str(intact))
    assert any(r.getMessage().startswith("Skipped damaged") for r in caplog.records)
