"""Offsets to commit with their metadata, as confluent-kafka must be given them.

confluent-kafka 2.16 commits a metadata string with its C terminator, one NUL byte more than
the text (``kb1:…\\x00``; readers drop it:
:func:`consumer.kafka.offset_metadata.decode_completed`). A ``kb1`` text of
:data:`~consumer.kafka.offset_metadata.MAX_METADATA_BYTES` would then exceed the broker's
``offset.metadata.max.bytes`` by that byte, so it is encoded again one byte shorter (its lowest
done offsets kept).
"""

from __future__ import annotations

from confluent_kafka import TopicPartition as KafkaTP

from consumer.kafka.offset_metadata import (
    MAX_METADATA_BYTES,
    MetadataError,
    decode_completed,
    encode_completed,
)


def commit_point(topic: str, partition: int, offset: int, metadata: str) -> KafkaTP:
    """``(topic, partition)`` at ``offset`` with ``metadata`` fitted (:func:`fit_metadata`);
    no metadata for ""."""
    text = fit_metadata(metadata)
    if text is None:
        return KafkaTP(topic, partition, offset)
    return KafkaTP(topic, partition, offset, metadata=text)


def fit_metadata(text: str) -> str | None:
    """``text`` as sent (one NUL byte is added): a ``kb1`` text at the limit encoded again one
    byte shorter; a text that is not ``kb1`` cut (the broker would refuse it whole); "" is
    None (no metadata, not a lone NUL)."""
    if not text:
        return None
    if len(text) < MAX_METADATA_BYTES:
        return text
    try:
        base, done = decode_completed(text)
    except MetadataError:
        return text[: MAX_METADATA_BYTES - 1]
    return encode_completed(base, done, MAX_METADATA_BYTES - 1).text or None
