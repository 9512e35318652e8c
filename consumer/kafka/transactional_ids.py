"""The rules of ``--exactly-once`` that both Kafka clients' transactional sinks share, pure
(no Kafka client): each input partition's transactional id and how long closing one waits
(:mod:`consumer.kafka.transactions` on aiokafka,
:mod:`consumer.kafka.confluent_adapter.transactions` on librdkafka)."""

from __future__ import annotations

from typing import Final

from consumer.kafka.records import TopicPartition

__all__ = ["CLOSE_TIMEOUT_S", "transactional_id"]

CLOSE_TIMEOUT_S: Final = 5.0
"""At most this long to abort a closing partition's open transaction (a zombie's is aborted
by the broker anyway when the next owner starts, or at ``transaction.timeout.ms``), and again
at most this long to stop its producer (one whose broker does not answer is abandoned: its
late sends carry the old epoch, which the next producer's start fenced)."""


def transactional_id(prefix: str, group_id: str, tp: TopicPartition) -> str:
    """The transactional id of input partition ``tp``'s producer:
    ``<prefix>-<group>-<topic>-<partition>`` (stable across restarts and owners: that is what
    fences a zombie; the same on both clients, so either may take over the other's
    partitions)."""
    return f"{prefix}-{group_id}-{tp[0]}-{tp[1]}"
