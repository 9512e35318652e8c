"""Read a group's committed offsets together with their metadata strings.

aiokafka's ``AIOKafkaConsumer.committed`` returns the offset only; the metadata (where
:mod:`consumer.kafka.offset_metadata` keeps the offsets finished above it) comes back in the
same OffsetFetch response, which the consumer's group coordinator returns whole as
``{TopicPartition: OffsetAndMetadata}`` (``fetch_committed_offsets``, aiokafka 0.8–0.14).

confluent-kafka (2.16) commits a metadata string with its C string's terminating NUL byte
(``kb1:…\x00``; it reads its own back without it): one trailing NUL is dropped here, so a
group committed by either client reads the same.
"""

from __future__ import annotations

from collections.abc import Sequence

from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaTP

from consumer.kafka.records import TopicPartition


async def committed_with_metadata(
    consumer: AIOKafkaConsumer, tps: Sequence[KafkaTP]
) -> dict[TopicPartition, tuple[int, str]]:
    """``(offset, metadata)`` of each of ``tps`` that has a committed offset in the
    consumer's group.

    Raises:
        aiokafka.errors.KafkaError: the group coordinator refused or could not be reached
            (callers translate it, see :mod:`consumer.kafka.errors`).
    """
    if not tps:
        return {}
    found = await consumer._coordinator.fetch_committed_offsets(list(tps))
    return {
        (tp.topic, tp.partition): (int(om.offset), (om.metadata or "").removesuffix("\x00"))
        for tp, om in found.items()
        if om.offset >= 0
    }
