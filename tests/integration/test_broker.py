"""The local broker is a real Apache Kafka that aiokafka speaks to fully, transactions included."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from tests.conftest import TopicFactory, unique_group


async def _consume(bootstrap: str, topic: str, n: int, **kwargs: object) -> list[bytes]:
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", **kwargs
    )
    await consumer.start()
    values: list[bytes] = []
    try:
        async with asyncio.timeout(30):
            while len(values) < n:
                batch = await consumer.getmany(timeout_ms=500)
                for records in batch.values():
                    values.extend(r.value for r in records if r.value is not None)
    finally:
        await consumer.stop()
    return values


async def test_produce_and_consume_round_trip(
    kafka_bootstrap: str, new_topic: TopicFactory
) -> None:
    topic = await new_topic("smoke")
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        for i in range(5):
            await producer.send_and_wait(topic, f"m{i}".encode(), key=b"k")
    finally:
        await producer.stop()
    assert await _consume(kafka_bootstrap, topic, 5) == [f"m{i}".encode() for i in range(5)]


async def test_transactional_round_trip(kafka_bootstrap: str, new_topic: TopicFactory) -> None:
    """Transactional producer + send_offsets_to_transaction + read_committed consumer."""
    source, sink = await new_topic("tx-src"), await new_topic("tx-dst")
    group = unique_group("tx")
    plain = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await plain.start()
    try:
        for i in range(3):
            await plain.send_and_wait(source, f"in{i}".encode())
    finally:
        await plain.stop()

    consumer = AIOKafkaConsumer(
        source,
        bootstrap_servers=kafka_bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
    )
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka_bootstrap, transactional_id=f"{group}.tx", enable_idempotence=True
    )
    await consumer.start()
    await producer.start()
    try:
        seen: list[bytes] = []
        async with asyncio.timeout(30):
            while len(seen) < 3:
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    seen.extend(r.value for r in records if r.value is not None)
        async with producer.transaction():
            for value in seen:
                await producer.send(sink, value.replace(b"in", b"out"))
            tp = TopicPartition(source, 0)
            await producer.send_offsets_to_transaction({tp: 3}, group)
        # The offsets become visible once the coordinator has written the commit markers.
        committed = None
        async with asyncio.timeout(30):
            while committed != 3:
                committed = await consumer.committed(tp)
    finally:
        await producer.stop()
        await consumer.stop()

    assert committed == 3
    out = await _consume(kafka_bootstrap, sink, 3, isolation_level="read_committed")
    assert out == [b"out0", b"out1", b"out2"]


async def test_aborted_transaction_is_invisible_to_read_committed(
    kafka_bootstrap: str, new_topic: TopicFactory
) -> None:
    topic = await new_topic("tx-abort")
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka_bootstrap, transactional_id=unique_group("txa")
    )
    await producer.start()
    try:
        async with producer.transaction():
            await producer.send(topic, b"committed")
        await producer.begin_transaction()
        await producer.send(topic, b"aborted")
        await producer.abort_transaction()
        async with producer.transaction():
            await producer.send(topic, b"after")
    finally:
        await producer.stop()
    values = await _consume(kafka_bootstrap, topic, 2, isolation_level="read_committed")
    assert values == [b"committed", b"after"]


async def test_the_broker_does_not_create_topics_on_first_use(kafka_bootstrap: str) -> None:
    """``auto.create.topics.enable=false``: a metadata request for a missing topic (what a
    producer sends first) leaves it missing; kbatch's commands create their topics themselves."""
    from aiokafka.errors import UnknownTopicOrPartitionError

    missing = unique_group("never-created")
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, request_timeout_ms=1500)
    await producer.start()
    try:
        with pytest.raises(UnknownTopicOrPartitionError):
            await producer.partitions_for(missing)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap)
    await consumer.start()
    try:
        assert missing not in await consumer.topics()
    finally:
        await consumer.stop()
