"""Plain record types that cross the Kafka layer's edge (no aiokafka objects leave it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

TopicPartition = tuple[str, int]
"""A partition as ``(topic, partition)``: hashable, printable, free of aiokafka (whose
``TopicPartition`` is a compatible named tuple). The one definition; every layer imports it."""


@dataclass(frozen=True, slots=True)
class InRecord:
    """One consumed record.

    ``timestamp_ms`` is the record's Kafka timestamp (Unix epoch ms, CreateTime unless the topic
    uses LogAppendTime); ``headers`` keep their order and may repeat a name.
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp_ms: int

    @property
    def tp(self) -> TopicPartition:
        """The record's partition."""
        return (self.topic, self.partition)

    @classmethod
    def from_consumer_record(cls, r: Any) -> InRecord:
        """The plain copy of an aiokafka ``ConsumerRecord`` (``r``: its ``topic``,
        ``partition``, ``offset``, ``key``, ``value``, ``headers``, ``timestamp``)."""
        return cls(
            topic=r.topic,
            partition=r.partition,
            offset=r.offset,
            key=r.key,
            value=r.value,
            headers=tuple(r.headers),
            timestamp_ms=r.timestamp,
        )
