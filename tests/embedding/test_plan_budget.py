"""The planner's batch-aware replicate rule and its budget (embedding/plan.py): pure planner
checks, nothing compiled.

A table is replicated up to `REPLICATE_BASE_BYTES + REPLICATE_PER_LOOKED_UP x` the bytes of
the rows a training step looks up (with the estimator's `train_batch_size`), and the
replicated tables with their optimizer slots stay within `REPLICATE_BUDGET_BYTES` per
device, most lookups per byte first; the plans are pinned once (`pinned`) and the same
whatever the order the tables were given in.
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest

from tpu_estimator.api.run_config import RunConfig
from tpu_estimator.embedding import (
    AdagradParameters,
    EmbeddingConfigSpec,
    FeatureConfig,
    StochasticGradientDescentParameters,
    TableConfig,
)
from tpu_estimator.embedding import tablewise
from tpu_estimator.embedding.component import EmbeddingTables
from tpu_estimator.embedding.inputs import prepare_features
from tpu_estimator.embedding.plan import (
    REPLICATE_BASE_BYTES,
    REPLICATE_MAX_BYTES,
    REPLICATE_PER_LOOKED_UP,
    choices,
    choose,
    describe,
    pinned,
    replicate_bound,
    table_plans,
)
from tpu_estimator.estimator.components import registered
from tpu_estimator.parallel.mesh import Topology

DIM = 32


def spec_of(tables, features=None, optimizer=None, **options):
    features = features or {f"f_{t}": FeatureConfig(t) for t in tables}
    return EmbeddingConfigSpec(
        feature_to_config_dict=features, table_to_config_dict=tables,
        optimization_parameters=optimizer or AdagradParameters(0.1), **options,
    )


def largest_replicated(batch, ids_per_example=1, dim=DIM):
    """The most rows of a `dim`-wide table the rule replicates at this batch."""
    return (REPLICATE_BASE_BYTES + int(REPLICATE_PER_LOOKED_UP * batch * ids_per_example * dim * 4)) // (dim * 4)


@pytest.mark.parametrize("batch", [256, 4_096, 65_536])
def test_replicated_up_to_the_bound_of_the_rows_a_step_looks_up(batch):
    rows = largest_replicated(batch)
    assert rows * DIM * 4 <= replicate_bound(TableConfig(rows, DIM), batch) < (rows + 1) * DIM * 4
    at, over = TableConfig(rows, DIM), TableConfig(rows + 1, DIM)
    assert [choose(t, 8, lookups_per_step=batch) for t in (at, over)] == ["replicated", "row"]
    spec = spec_of({"at": at, "over": over})
    assert table_plans(spec, 8, global_batch=batch) == {"at": "replicated", "over": "row"}
    # the bound grows with the batch: at 4,096 x 4 ids a 2.5 MB table (20,000 x 32) is replicated
    assert choose(TableConfig(20_000, DIM), 8, lookups_per_step=4 * batch) == ("row" if batch < 4_096 else "replicated")


def test_without_a_batch_the_bound_is_replicate_max_bytes():
    rows = REPLICATE_MAX_BYTES // (DIM * 4)
    spec = spec_of({"at": TableConfig(rows, DIM), "over": TableConfig(rows + 1, DIM)})
    assert table_plans(spec, 8) == {"at": "replicated", "over": "row"}
    assert replicate_bound(TableConfig(rows, DIM), None) == REPLICATE_MAX_BYTES


def test_every_feature_and_sequence_position_of_a_table_counts_as_a_lookup():
    batch = 1_024
    two_and_seq = largest_replicated(batch, ids_per_example=2 + 5)  # two features and one of length 5
    spec = spec_of(
        {"t": TableConfig(two_and_seq, DIM), "u": TableConfig(two_and_seq, DIM)},
        {"a": FeatureConfig("t"), "b": FeatureConfig("t"), "c": FeatureConfig("t", max_sequence_length=5),
         "d": FeatureConfig("u")},
    )
    assert table_plans(spec, 8, global_batch=batch) == {"t": "replicated", "u": "row"}
    one_more = spec_of({"t": TableConfig(two_and_seq + 1, DIM), "u": TableConfig(10, DIM)}, spec.feature_to_config_dict)
    assert table_plans(one_more, 8, global_batch=batch) == {"t": "row", "u": "replicated"}


def test_the_budget_keeps_the_tables_looked_up_most_per_row():
    """Five tables each replicable on its own; a budget for two with their Adagrad slot: the
    two looked up most per row (looked-up bytes per table byte) are replicated, the others
    sharded (by rows, or columns for the wide one; table-wise where they stack evenly); a
    TableConfig(sharding='replicated') is held first."""
    batch, rows = 65_536, 10_000  # 1.22 MiB each (x2 with the slot)
    tables = {f"t{i}": TableConfig(rows, DIM) for i in range(4)} | {"wide": TableConfig(4_000, 256)}
    features = {f"f{i}": FeatureConfig(f"t{i}", max_sequence_length=i + 2) for i in range(4)}
    features |= {"w": FeatureConfig("wide")}  # 1 lookup per 4,000 rows: between t0 (2 per 10,000) and t1
    spec = spec_of(tables, features)
    per_table = rows * DIM * 4 * 2  # table + accumulator
    assert set(table_plans(spec, 8, global_batch=batch).values()) == {"replicated"}  # the default budget holds all
    chosen = choices(dataclasses.replace(spec, replicate_budget_bytes=2 * per_table), 8, global_batch=batch)
    plans = {t: c.plan for t, c in chosen.items()}
    assert plans == {"t0": "row", "t1": "row", "t2": "replicated", "t3": "replicated", "wide": "column"}
    assert chosen["t1"].why.endswith(
        "but the replicated tables with their 1 optimizer slot(s) would pass 4.88 MiB per device "
        "(EmbeddingConfigSpec(replicate_budget_bytes=...); 4.88 MiB held)")
    # SGD keeps no slot: four tables fit where two did with Adagrad
    sgd = spec_of(tables, features, StochasticGradientDescentParameters(0.1), replicate_budget_bytes=2 * per_table)
    assert [t for t, c in choices(sgd, 8, global_batch=batch).items()
            if c.plan == "replicated"] == ["t0", "t1", "t2", "t3"]
    # a table asked to be replicated is held first: one more fits beside it
    asked = spec_of(tables | {"t0": TableConfig(rows, DIM, sharding="replicated")}, features,
                    replicate_budget_bytes=2 * per_table)
    assert [t for t, c in choices(asked, 8, global_batch=batch).items()
            if c.plan == "replicated"] == ["t0", "t3"]
    # the tables left out of the budget stack table-wise where they fill the devices evenly
    eight = spec_of({f"e{i}": TableConfig(rows, DIM) for i in range(8)})
    assert set(table_plans(eight, 8, global_batch=batch).values()) == {"replicated"}
    out = choices(dataclasses.replace(eight, replicate_budget_bytes=per_table), 8, global_batch=batch)
    assert [c.plan for c in out.values()] == ["replicated"] + ["table"] * 7, out
    assert out["e1"].why.endswith("; its stack holds <= 1.25 stored rows per row")


def test_the_plans_are_pinned_once_and_do_not_depend_on_the_order_given():
    batch = 4_096
    tables = {f"m{i}": TableConfig(50_000 + i, DIM) for i in range(8)}
    tables |= {"small": TableConfig(3_000, DIM), "seq": TableConfig(20_000, DIM), "big": TableConfig(5_000_000, DIM)}
    spec = spec_of(tables, {f"f_{t}": FeatureConfig(t, max_sequence_length=4 if t == "seq" else 0) for t in tables})
    backwards = spec_of(dict(reversed(tables.items())), dict(reversed(spec.feature_to_config_dict.items())))
    assert describe(spec, 8, global_batch=batch) == describe(backwards, 8, global_batch=batch)
    plans = table_plans(spec, 8, global_batch=batch)
    assert plans == {t: "table" for t in tables if t[0] == "m"} | {"small": "replicated", "seq": "replicated",
                                                                  "big": "row"}
    fixed = pinned(spec, 8, global_batch=batch)
    assert {t: c.sharding for t, c in fixed.tables.items()} == plans
    assert table_plans(fixed, 8) == table_plans(fixed, 8, global_batch=1) == plans  # no longer batch-dependent
    assert [(s.name, s.members) for s in tablewise.stacks(fixed, plans, 8)] == [
        (s.name, s.members) for s in tablewise.stacks(spec, plans, 8)]
    assert fixed.feature_tables == spec.feature_tables and pinned(spec, 1, global_batch=batch) is spec


def test_the_estimators_train_batch_size_plans_the_tables_and_the_log_says_why(caplog):
    """`registered` (the estimator's Core passes its train_batch_size) plans for that batch;
    the log line names the bound and the batch."""
    spec = spec_of({"t": TableConfig(20_000, DIM), "small": TableConfig(100, DIM)},
                   {"seq": FeatureConfig("t", max_sequence_length=4), "one": FeatureConfig("small")})
    topology = Topology.create(use_tpu=True)
    with caplog.at_level(logging.INFO, logger="tpu_estimator.embedding"):
        (tables,) = registered(RunConfig(), topology, spec, train_batch_size=4_096)
        (alone,) = registered(RunConfig(), topology, spec)
    assert tables.tables.plans == {"t": "replicated", "small": "replicated"}
    assert alone.tables.plans == {"t": "row", "small": "replicated"}
    lines = [r.getMessage() for r in caplog.records if r.name == "tpu_estimator.embedding"]
    assert lines == describe(spec, 8, global_batch=4_096) + describe(spec, 8)
    assert lines[1] == (
        "embedding table 't' (20,000 x 32, 2.44 MiB): replicated over 8 device(s) (planner: 2.44 MiB <= 2.88 MiB, "
        "replicated at most at global batch 4,096: 0.38 MiB + 1.25 x the 2.00 MiB of rows a step looks up "
        "(4 per example))"
    )
    assert lines[3].endswith("row over 8 device(s) (planner: 2.44 MiB > 1.00 MiB, replicated at most without a "
                             "train_batch_size)")
    assert isinstance(tables, EmbeddingTables) and tables.spec.tables["t"].sharding == "replicated"


def test_tables_replicable_alone_but_not_together_are_stacked_table_wise():
    """Eight 2,500 x 32 tables (312 KiB each, under one table's bound at a global batch of
    1,024) hold 2.44 MiB together, over 1.25 x their 1 MiB looked up: one stack
    routes them in one exchange (measured 0.45x row, replicated 0.84x). At 4,096 they stay
    replicated (0.26x row, table-wise 0.51x); two tables do not stack evenly: replicated."""
    eight = spec_of({f"e{i}": TableConfig(2_500, DIM) for i in range(8)})
    assert choose(eight.tables["e0"], 8, lookups_per_step=1_024) == "replicated"
    chosen = choices(eight, 8, global_batch=1_024)
    assert {c.plan for c in chosen.values()} == {"table"}
    assert chosen["e0"].why == (
        "planner: the 8 tables of its stack hold 2.44 MiB > 1.25 MiB, replicated at most together: "
        "1.25 x the 1.00 MiB of rows a step looks up in them; one stack routes them in one exchange")
    assert set(table_plans(eight, 8, global_batch=4_096).values()) == {"replicated"}
    assert set(table_plans(eight, 8).values()) == {"replicated"}  # without a batch: each under 1 MiB
    small = spec_of({f"e{i}": TableConfig(1_250, DIM) for i in range(8)})  # 1.22 MiB together: under
    assert set(table_plans(small, 8, global_batch=1_024).values()) == {"replicated"}
    two = spec_of({f"e{i}": TableConfig(2_500, DIM) for i in range(2)})
    assert set(table_plans(two, 8, global_batch=1_024).values()) == {"replicated"}
    fixed = pinned(eight, 8, global_batch=1_024)
    assert table_plans(fixed, 8) == table_plans(eight, 8, global_batch=1_024)


def test_a_bag_features_width_counts_its_ids():
    """`FeatureConfig(max_ids_per_example=W)`: the planner counts W rows per example (as a
    sequence feature's max_sequence_length); without it one. The pinned spec (and a stack's
    storage spec) keep it, the log says the count, and wider ids are an error."""
    batch = 1_024
    rows = largest_replicated(batch, ids_per_example=4)
    bag = {"bag": FeatureConfig("t", max_ids_per_example=4)}
    spec = spec_of({"t": TableConfig(rows, DIM)}, bag)
    assert table_plans(spec, 8, global_batch=batch) == {"t": "replicated"}
    assert table_plans(spec_of({"t": TableConfig(rows + 1, DIM)}, bag), 8, global_batch=batch) == {"t": "row"}
    assert table_plans(spec_of({"t": TableConfig(rows, DIM)}, {"bag": FeatureConfig("t")}), 8,
                       global_batch=batch) == {"t": "row"}  # one id counted: the bound of 1,024 x 1
    assert describe(spec, 8, global_batch=batch)[0].endswith("(4 per example))")
    assert pinned(spec, 8, global_batch=batch).features["bag"].max_ids_per_example == 4
    eight = spec_of({f"e{i}": TableConfig(50_000, DIM) for i in range(8)},
                    {f"f{i}": FeatureConfig(f"e{i}", max_ids_per_example=i + 1) for i in range(8)})
    (stack,) = tablewise.stacks(eight, table_plans(eight, 8), 8)
    stored = tablewise.storage_spec(eight, (stack,), table_plans(eight, 8))
    assert [stored.features[f"f{i}"].max_ids_per_example for i in range(8)] == list(range(1, 9))

    ids = np.full((2, 4), -1, np.int32)
    assert prepare_features(spec, {"bag": ids})["bag"].shape == (2, 4)
    assert prepare_features(spec, {"bag": ids[:, :2]})["bag"].shape == (2, 2)  # narrower: fine
    with pytest.raises(ValueError) as e:
        prepare_features(spec, {"bag": np.zeros((2, 5), np.int32)})
    assert str(e.value).startswith(
        "The ids of embedding feature 'bag' (table 't') must be at most max_ids_per_example=4 wide")
    assert "Received: shape=(2, 5)" in str(e.value) and "max_ids_per_example=...) to 5" in str(e.value)


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "4"])
def test_max_ids_per_example_is_checked(bad):
    with pytest.raises(ValueError, match=r"`FeatureConfig\(max_ids_per_example=\.\.\.\)` must be a positive int"):
        FeatureConfig("t", max_ids_per_example=bad)


def test_max_ids_per_example_is_not_for_sequence_features():
    with pytest.raises(ValueError) as e:
        FeatureConfig("t", max_sequence_length=5, max_ids_per_example=5)
    assert "a sequence feature's width is its max_sequence_length" in str(e.value)
    assert "max_sequence_length=5, max_ids_per_example=5" in str(e.value)
    assert FeatureConfig("t", max_sequence_length=5).ids_per_example == 5
    assert FeatureConfig("t").ids_per_example == 1


@pytest.mark.parametrize("bad", [-1, 1.5, True, "256MiB", None])
def test_replicate_budget_bytes_is_checked(bad):
    with pytest.raises(ValueError) as e:
        spec_of({"t": TableConfig(10, DIM)}, replicate_budget_bytes=bad)
    assert str(e.value).startswith("`EmbeddingConfigSpec(replicate_budget_bytes=...)` must be an int >= 0")
    assert f"Received: replicate_budget_bytes={bad!r}" in str(e.value)


def test_the_estimators_plan_honours_the_budget_and_the_bag_width():
    """Through `registered` (what the estimator's Core calls, for train, evaluate and predict
    alike): replicate_budget_bytes=0 leaves only the asked-for table replicated; a bag
    width moves the bound. The same arguments give the same plan (an evaluator's)."""
    topology = Topology.create(use_tpu=True)
    tables = {"small": TableConfig(100, DIM), "asked": TableConfig(100, DIM, sharding="replicated"),
              "bag": TableConfig(20_000, DIM)}
    features = {"s": FeatureConfig("small"), "a": FeatureConfig("asked"), "b": FeatureConfig("bag")}
    plans = lambda spec: registered(RunConfig(), topology, spec, train_batch_size=4_096)[0].tables.plans  # noqa: E731
    assert plans(spec_of(tables, features)) == {"asked": "replicated", "bag": "row", "small": "replicated"}
    assert plans(spec_of(tables, features, replicate_budget_bytes=0)) == {
        "asked": "replicated", "bag": "row", "small": "row"}
    wide = features | {"b": FeatureConfig("bag", max_ids_per_example=4)}
    assert plans(spec_of(tables, wide)) == {"asked": "replicated", "bag": "replicated", "small": "replicated"}
    assert plans(spec_of(tables, wide)) == plans(spec_of(dict(reversed(tables.items())), wide))
