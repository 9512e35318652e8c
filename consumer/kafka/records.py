"""Plain record types that cross the Kafka layer's edge (no aiokafka objects leave it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

TopicPartition = tuple[str, int]
"""A partition as ``(topic, partition)``: hashable, printable, free of aiokafka (whose
``TopicPartition`` is a compatible named tuple). The one definition; every layer imports it."""


@dataclass(slots=True)
class InRecord:
    """One consumed record.

    ``timestamp_ms`` is the record's Kafka timestamp (Unix epoch ms, CreateTime unless the topic
    uses LogAppendTime); ``headers`` keep their order and may repeat a name. ``tp`` is
    ``(topic, partition)``, built once (the serving path reads it about ten times per record).

    Built once per consumed record, so slotted but not ``frozen`` (a frozen ``__init__`` costs
    ~3× a plain one); read-only all the same: nothing changes one after it is built.
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp_ms: int
    tp: TopicPartition = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.tp = (self.topic, self.partition)

    @classmethod
    def from_consumer_record(cls, r: Any) -> InRecord:
        """The plain copy of an aiokafka ``ConsumerRecord`` (``r``: its ``topic``,
        ``partition``, ``offset``, ``key``, ``value``, ``headers``, ``timestamp``)."""
        return cls(r.topic, r.partition, r.offset, r.key, r.value, tuple(r.headers), r.timestamp)


@dataclass(frozen=True, slots=True)
class Membership:
    """A member's place in its group: ``member_id`` ("" when it has none) and the group
    ``generation`` it was assigned in (-1 when none)."""

    member_id: str
    generation: int


class RebalanceHandler(Protocol):
    """What the owner of a group source does when partitions move; awaited before the client
    goes on (before it rejoins under the classic protocol, before it acknowledges the
    assignment change under the consumer protocol). Both adapters call it
    (:mod:`consumer.kafka.transport` re-exports it)."""

    async def on_revoked(self, tps: frozenset[TopicPartition]) -> None: ...

    async def on_assigned(self, tps: frozenset[TopicPartition]) -> None: ...
