"""A key lands on the same partition whichever client sends it, when librdkafka is told to hash
as Java does.

Replies are keyed, and a client reading its replies from a partition of its own expects the
partition Java's default partitioner picks: ``murmur2(key) & 0x7fffffff`` modulo the partition
count. aiokafka's default partitioner and kbatch's own (:mod:`consumer.kafka.partitioner`) do
that; librdkafka (confluent-kafka) does it only with ``partitioner=murmur2_random``. Its
default, ``consistent_random``, hashes with CRC32 and puts many keys elsewhere, which is why a
confluent-kafka producer in kbatch must set it.

Partitions are read from the delivery reports: where the broker stored each record.
"""

from __future__ import annotations

import random

import pytest
from aiokafka import AIOKafkaProducer
from confluent_kafka import KafkaError, Message, Producer

from consumer.kafka.partitioner import partition_by_key
from tests.conftest import TopicFactory

pytestmark = pytest.mark.integration

PARTITIONS = 7
N_KEYS = 2006


def _keys() -> list[bytes]:
    """Request-like keys (``req-<n>``) and random bytes of 1-64 bytes (every tail length of
    murmur2's 4-byte words), all distinct."""
    rng = random.Random(20261203)
    keys = dict.fromkeys(f"req-{i}".encode() for i in range(N_KEYS // 2))
    while len(keys) < N_KEYS:
        keys[rng.randbytes(rng.randint(1, 64))] = None
    return list(keys)


def _confluent_partitions(
    bootstrap: str, topic: str, keys: list[bytes], partitioner: str | None
) -> dict[bytes, int]:
    """key → the partition librdkafka stored it on, with ``partitioner`` (None: its default)."""
    config: dict[str, str | int | bool] = {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": 5,
    }
    if partitioner is not None:
        config["partitioner"] = partitioner
    producer = Producer(config)
    stored: dict[bytes, int] = {}
    failed: list[KafkaError] = []

    def delivered(error: KafkaError | None, message: Message) -> None:
        if error is not None:
            failed.append(error)
            return
        key, partition = message.key(), message.partition()
        assert key is not None and partition is not None
        stored[key] = partition

    for key in keys:
        producer.produce(topic, b"v", key, on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(30) == 0, "undelivered records"
    assert failed == []
    return stored


async def _aiokafka_partitions(bootstrap: str, topic: str, keys: list[bytes]) -> dict[bytes, int]:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        futures = [await producer.send(topic, b"v", key=key) for key in keys]
        return {key: (await f).partition for key, f in zip(keys, futures, strict=True)}
    finally:
        await producer.stop()


async def test_murmur2_random_matches_aiokafka_and_kbatch_for_every_key(
    kafka_bootstrap: str, new_topic: TopicFactory
) -> None:
    topic = await new_topic("partitioner", partitions=PARTITIONS)
    keys = _keys()
    java = await _aiokafka_partitions(kafka_bootstrap, topic, keys)
    librdkafka = _confluent_partitions(kafka_bootstrap, topic, keys, "murmur2_random")
    default = _confluent_partitions(kafka_bootstrap, topic, keys, None)
    assert len(java) == len(librdkafka) == len(default) == N_KEYS
    assert set(java.values()) == set(range(PARTITIONS))  # the keys spread over every partition
    differ = {k: (java[k], librdkafka[k]) for k in keys if java[k] != librdkafka[k]}
    assert differ == {}
    everything = list(range(PARTITIONS))
    ours = {k: partition_by_key(k, everything, everything) for k in keys}
    assert ours == java
    # librdkafka's default (CRC32) puts a large share of keys elsewhere: the setting matters.
    moved = sum(default[k] != java[k] for k in keys)
    assert moved > N_KEYS // 2, moved
