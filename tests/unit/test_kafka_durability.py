"""How many replicas a created jobs topic gets, and when a topic is less durable than another
(consumer/kafka/durability.py): the pure rules as decision tables."""

from __future__ import annotations

import pytest

from consumer.kafka.durability import (
    Durability,
    choose_replication,
    fragile_topics_message,
    replication_warning,
)


@pytest.mark.parametrize(
    ("requested", "cluster_default", "brokers", "replicas", "why"),
    [
        (None, 3, 3, 3, "the cluster's default.replication.factor"),
        (None, 1, 1, 1, "the cluster's default.replication.factor"),  # the local broker
        (None, 1, 3, 1, "the cluster's default.replication.factor"),  # the operator's choice
        (None, None, 5, 3, "min(3, 5 brokers)"),  # the default not readable (ACLs)
        (None, None, 3, 3, "min(3, 3 brokers)"),
        (None, None, 2, 2, "min(3, 2 brokers)"),
        (None, None, 1, 1, "min(3, 1 brokers)"),
        (2, 3, 3, 2, "as requested"),  # --jobs-topic-replication-factor wins
        (5, None, 3, 5, "as requested"),  # the broker refuses it, with this count in the error
    ],
)
def test_the_replicas_of_a_created_jobs_topic(
    requested: int | None, cluster_default: int | None, brokers: int, replicas: int, why: str
) -> None:
    assert choose_replication(requested, cluster_default, brokers) == (replicas, why)


def test_no_broker_and_no_default_is_an_error() -> None:
    with pytest.raises(ValueError, match="no broker"):
        choose_replication(None, None, 0)


@pytest.mark.parametrize(
    ("jobs", "requests", "weaker"),
    [
        (Durability(1, 1), Durability(3, 2), True),
        (Durability(1, 2), Durability(3, 2), True),  # fewer replicas alone
        (Durability(3, 1), Durability(3, 2), True),  # a lower min.insync.replicas alone
        (Durability(3, 2), Durability(3, 2), False),
        (Durability(3, 2), Durability(1, 1), False),  # more durable than the requests
        (Durability(3, None), Durability(3, 2), False),  # min.insync.replicas not readable
        (Durability(2, None), Durability(3, None), True),
    ],
)
def test_less_durable_than_the_request_topic(
    jobs: Durability, requests: Durability, weaker: bool
) -> None:
    assert jobs.weaker_than(requests) is weaker


def test_a_durability_reads_as_replicas_and_min_insync() -> None:
    assert str(Durability(3, 2)) == "3 replica(s), min.insync.replicas 2"
    assert str(Durability(1, None)) == "1 replica(s), min.insync.replicas ?"


@pytest.mark.parametrize(
    ("replicas", "min_insync", "warned"),
    [
        (3, 2, None),  # Kafka's production setting: one broker may go
        (5, 3, None),
        (3, None, None),  # min.insync.replicas not readable (ACLs): only the count is judged
        (1, 1, "fewer than 3"),  # serve's old default on any cluster
        (2, 1, "fewer than 3"),
        (3, 3, "not more than min.insync.replicas=3"),  # one broker down stops acks=all
        (2, 2, "fewer than 3: a broker loss can lose acknowledged records; not more than"),
    ],
)
def test_a_created_topics_replicas_are_warned_about_below_3_or_min_insync_plus_1(
    replicas: int, min_insync: int | None, warned: str | None
) -> None:
    warning = replication_warning(replicas, min_insync)
    if warned is None:
        assert warning is None
    else:
        assert warning is not None and warned in warning


def test_a_one_broker_cluster_is_one_short_warning_without_remedies_it_cannot_take() -> None:
    """``kbatch broker start``'s one node cannot replicate: the line says so briefly instead of
    asking for a replication factor and a reassignment that need more brokers."""
    one = fragile_topics_message(["t.req"], 1, "why", "fewer than 3", brokers=1)
    assert one == (
        "topics ['t.req'] have 1 replica: a one-broker cluster keeps no copy (fine for "
        "development; in production use 3 brokers and replication factor 3)"
    )
    three = fragile_topics_message(["t.req"], 2, "as requested", "fewer than 3", brokers=3)
    assert "created with 2 replica(s) (as requested), fewer than 3: raise" in three
    assert "kafka-reassign-partitions" in three
