"""FlowControl: tables of buffered counts -> pause / resume decisions."""

from __future__ import annotations

from typing import Any

import pytest

from consumer.kafka.flow import FlowConfig, FlowControl, FlowDecision
from consumer.kafka.offsets import TopicPartition

A: TopicPartition = ("requests", 0)
B: TopicPartition = ("requests", 1)
C: TopicPartition = ("requests", 2)
D: TopicPartition = ("requests", 3)

# Per partition: high 10 records / 100 tokens, low 5 / 50. Total: high 25 / 250, low 12.5 / 125.
CONFIG = FlowConfig(
    max_partition_records=10,
    max_partition_tokens=100,
    max_total_records=25,
    max_total_tokens=250,
    resume_fraction=0.5,
)


def flow_with(*tps: TopicPartition, config: FlowConfig = CONFIG) -> FlowControl:
    flow = FlowControl(config)
    for tp in tps:
        flow.assign(tp)
    return flow


def decision(pause: set[TopicPartition], resume: set[TopicPartition]) -> FlowDecision:
    return FlowDecision(pause=frozenset(pause), resume=frozenset(resume))


@pytest.mark.parametrize(
    ("records", "tokens", "paused"),
    [
        (0, 0, False),
        (9, 99, False),  # below both high watermarks
        (10, 0, True),  # records at the high watermark
        (1, 100, True),  # tokens at the high watermark
        (14, 0, True),  # above (a poll chunk overshoots)
    ],
)
def test_partition_pauses_at_its_high_watermark(records: int, tokens: int, paused: bool) -> None:
    flow = flow_with(A, B)
    flow.add(A, records, tokens)
    expected = decision({A}, set()) if paused else decision(set(), set())
    assert flow.decide() == expected
    assert flow.paused == (frozenset({A}) if paused else frozenset())


@pytest.mark.parametrize(
    ("remove_records", "remove_tokens", "resumed"),
    [
        (1, 10, False),  # 9 / 70: between the watermarks, stays paused (hysteresis)
        (5, 20, False),  # 5 / 60: records low, tokens not yet
        (4, 30, False),  # 6 / 50: tokens low, records not yet
        (5, 30, True),  # 5 / 50: both at the low watermark
        (10, 80, True),  # empty
    ],
)
def test_paused_partition_resumes_at_its_low_watermark(
    remove_records: int, remove_tokens: int, resumed: bool
) -> None:
    flow = flow_with(A)
    flow.add(A, 10, 80)
    assert flow.decide() == decision({A}, set())
    flow.remove(A, remove_records, remove_tokens)
    expected = decision(set(), {A}) if resumed else decision(set(), set())
    assert flow.decide() == expected
    assert (A in flow.paused) is not resumed


def test_partition_between_watermarks_is_not_paused_on_the_way_up() -> None:
    flow = flow_with(A)
    flow.add(A, 7, 70)
    assert not flow.decide()
    assert flow.paused == frozenset()


@pytest.mark.parametrize(
    ("counts", "pause"),
    [
        # each partition below its own limit, total at 25 records: pause all
        ({A: (9, 0), B: (9, 0), C: (7, 0)}, {A, B, C}),
        # total at 250 tokens
        ({A: (1, 90), B: (1, 90), C: (1, 70)}, {A, B, C}),
        # total below: nothing
        ({A: (9, 90), B: (9, 90), C: (6, 60)}, set()),
        # a partition with no records is paused too when the total is over
        ({A: (9, 99), B: (9, 99), C: (0, 60)}, {A, B, C}),
    ],
)
def test_total_over_high_pauses_every_partition(
    counts: dict[TopicPartition, tuple[int, int]], pause: set[TopicPartition]
) -> None:
    flow = flow_with(A, B, C)
    for tp, (records, tokens) in counts.items():
        flow.add(tp, records, tokens)
    assert flow.decide() == decision(pause, set())


def test_total_resume_waits_for_low_and_keeps_partitions_over_their_own_limit() -> None:
    flow = flow_with(A, B, C)
    flow.add(A, 10, 0)  # over its own limit
    flow.add(B, 9, 0)
    flow.add(C, 6, 0)
    assert flow.decide() == decision({A, B, C}, set())
    flow.remove(B, 9, 0)  # total 16: above the total low watermark (12.5)
    assert not flow.decide()
    flow.remove(C, 6, 0)  # total 10: below; A still over its own limit
    assert flow.decide() == decision(set(), {B, C})
    assert flow.paused == frozenset({A})


def test_counts_and_totals() -> None:
    flow = flow_with(A, B)
    flow.add(A, 3, 30)
    flow.add(B, 2, 20)
    flow.remove(A, 1, 10)
    assert (flow.records(A), flow.tokens(A)) == (2, 20)
    assert (flow.total_records, flow.total_tokens) == (4, 40)


def test_remove_stops_at_zero_and_ignores_unassigned() -> None:
    flow = flow_with(A)
    flow.add(A, 2, 20)
    flow.remove(A, 5, 50)  # late removal from an earlier assignment
    flow.remove(B, 1, 1)
    assert (flow.records(A), flow.tokens(A)) == (0, 0)
    assert (flow.total_records, flow.total_tokens) == (0, 0)


def test_revoke_forgets_counts_and_pause() -> None:
    flow = flow_with(A, B)
    flow.add(A, 10, 0)
    flow.add(B, 1, 0)
    assert flow.decide() == decision({A}, set())
    flow.revoke(A)
    assert flow.paused == frozenset()
    assert flow.assigned == frozenset({B})
    assert flow.total_records == 1
    assert not flow.decide()  # nothing to resume: A is gone


def test_reapply_after_rebalance_returns_policy_pauses() -> None:
    flow = flow_with(A, B)
    flow.add(A, 10, 0)
    flow.decide()
    flow.assign(A)  # retained partition: assign is a no-op, counts kept
    flow.assign(C)
    assert flow.reapply() == frozenset({A})
    assert flow.records(A) == 10


def test_newly_assigned_partition_pauses_when_total_is_over() -> None:
    flow = flow_with(A, B)
    flow.add(A, 9, 90)
    flow.add(B, 9, 90)
    assert not flow.decide()  # total 18 / 180, each below its own limit
    flow.assign(C)
    flow.add(C, 7, 0)  # total records 25: over
    assert flow.decide() == decision({A, B, C}, set())
    flow.assign(D)
    assert flow.decide() == decision({D}, set())


def test_zero_resume_fraction_resumes_only_when_empty() -> None:
    flow = flow_with(A, config=FlowConfig(10, 100, 25, 250, resume_fraction=0.0))
    flow.add(A, 10, 10)
    flow.decide()
    flow.remove(A, 9, 9)
    assert not flow.decide()
    flow.remove(A, 1, 1)
    assert flow.decide() == decision(set(), {A})


def test_add_to_unassigned_partition_raises() -> None:
    with pytest.raises(KeyError):
        flow_with(A).add(B, 1, 1)


@pytest.mark.parametrize(("records", "tokens"), [(-1, 0), (0, -1)])
def test_negative_counts_raise(records: int, tokens: int) -> None:
    flow = flow_with(A)
    with pytest.raises(ValueError):
        flow.add(A, records, tokens)
    with pytest.raises(ValueError):
        flow.remove(A, records, tokens)


@pytest.mark.parametrize(
    "override",
    [
        {"max_partition_records": 0},
        {"max_partition_tokens": 0},
        {"max_total_records": -1},
        {"max_total_tokens": 0},
        {"resume_fraction": 1.0},
        {"resume_fraction": -0.1},
    ],
)
def test_config_rejects_bad_values(override: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(override))):
        FlowConfig(**override)


# -- lanes: bulk sources pause at bulk_total_fraction of the totals (12 / 125 here) --

J: TopicPartition = ("backfill-source", 0)


def lanes_flow() -> FlowControl:
    flow = FlowControl(CONFIG.model_copy(update={"bulk_total_fraction": 0.5}))
    flow.assign(A)
    flow.assign(B)
    flow.assign(J, lane="bulk")
    return flow


@pytest.mark.parametrize(
    ("live_records", "bulk_records", "paused"),
    [
        (0, 0, set()),
        (5, 6, set()),  # 11 in total: below the bulk watermark (12)
        (6, 6, {J}),  # 12: bulk pauses, live keeps reading
        (9, 9, {J}),  # 18 (no partition at its own limit): still only bulk
        (9, 16, {A, B, J}),  # 25: the hard total pauses live too
    ],
)
def test_bulk_partitions_pause_before_live_ones(
    live_records: int, bulk_records: int, paused: set[TopicPartition]
) -> None:
    flow = lanes_flow()
    flow.add(A, live_records, 0)
    flow.add(J, bulk_records, 0)
    assert flow.decide().pause == frozenset(paused)
    assert flow.should_pause_bulk() is (J in paused)


def test_an_outside_bulk_source_counts_into_the_totals_and_resumes_at_the_low_watermark() -> None:
    flow = lanes_flow()
    flow.add(A, 8, 0)
    assert not flow.should_pause_bulk()
    flow.add_bulk(4, 40)  # the job runner's buffer: 12 records in total
    assert flow.should_pause_bulk() and flow.total_records == 12
    assert flow.decide().pause == frozenset({J})  # live partitions keep reading
    flow.remove_bulk(2, 20)  # 10: between the bulk watermark's low (6) and high (12)
    assert flow.should_pause_bulk()
    flow.remove(A, 8, 0)  # 2
    assert not flow.should_pause_bulk()
    assert flow.decide() == decision(set(), {J})
    flow.remove_bulk(100, 100)  # stops at zero
    assert flow.total_records == 0 and flow.total_tokens == 0
    with pytest.raises(ValueError, match="counts must be"):
        flow.add_bulk(-1, 0)
