"""The reply sink's batch path (``send``) and partitioner, with a fake producer: no broker."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
from aiokafka.errors import KafkaTimeoutError, RecordTooLargeError
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.partitioner import murmur2 as aiokafka_murmur2
from hypothesis import given, settings
from hypothesis import strategies as st

from consumer.kafka.config import KafkaClientSettings, SinkSettings
from consumer.kafka.partitioner import murmur2, partition_by_key
from consumer.kafka.sink import DeliveryError, KafkaSink, SinkClosedError
from schemas.records import OutRecord


class FakeProducer:
    """``send`` returns a delivery future the test resolves; ``fail`` makes a topic raise."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None]] = []
        self.deliveries: list[asyncio.Future[None]] = []
        self.raise_for: dict[str, BaseException] = {}

    async def send(self, topic: str, **kw: Any) -> asyncio.Future[None]:
        if topic in self.raise_for:
            raise self.raise_for[topic]
        self.sent.append((topic, kw["key"]))
        delivery: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.deliveries.append(delivery)
        return delivery


def record(key: bytes, topic: str | None = None) -> OutRecord:
    return OutRecord(topic, None, key, b"v", [("kbatch-status", b"ok")])


@pytest.fixture
async def sink() -> tuple[KafkaSink, FakeProducer]:
    s = KafkaSink(
        KafkaClientSettings(), SinkSettings(send_timeout_ms=200), default_topic="kbatch.replies"
    )
    producer = FakeProducer()
    s._producer = producer  # type: ignore[assignment]
    return s, producer


async def test_send_queues_in_order_and_acks_each_record(
    sink: tuple[KafkaSink, FakeProducer],
) -> None:
    s, producer = sink
    acks = await s.send([record(b"a"), record(b"b", "other"), record(b"c")])
    assert producer.sent == [("kbatch.replies", b"a"), ("other", b"b"), ("kbatch.replies", b"c")]
    producer.deliveries[1].set_result(None)
    await asyncio.sleep(0)
    assert [a.done() for a in acks] == [False, True, False]
    for d in producer.deliveries:
        if not d.done():
            d.set_result(None)
    await asyncio.gather(*acks)


async def test_a_retriable_failure_is_retried_until_acknowledged(
    sink: tuple[KafkaSink, FakeProducer],
) -> None:
    s, producer = sink
    (ack,) = await s.send([record(b"a")])
    producer.deliveries[0].set_exception(KafkaTimeoutError())
    for _ in range(20):  # the retry sends the record again
        await asyncio.sleep(0)
        if len(producer.deliveries) == 2:
            break
    assert len(producer.deliveries) == 2 and not ack.done()
    producer.deliveries[1].set_result(None)
    await asyncio.wait_for(ack, 1)


async def test_no_acknowledgement_in_time_hands_the_record_to_the_retries(
    sink: tuple[KafkaSink, FakeProducer],
) -> None:
    s, producer = sink
    (ack,) = await s.send([record(b"a")])
    await asyncio.sleep(0.3)  # send_timeout_ms = 200: sent again
    assert len(producer.deliveries) >= 2
    producer.deliveries[0].set_result(None)  # the late first answer is ignored
    await asyncio.sleep(0)
    assert not ack.done()
    producer.deliveries[-1].set_result(None)
    await asyncio.wait_for(ack, 1)


async def test_a_permanent_failure_is_a_delivery_error(
    sink: tuple[KafkaSink, FakeProducer],
) -> None:
    s, producer = sink
    producer.raise_for["bad"] = AssertionError("Unrecognized partition")
    acks = await s.send([record(b"a", "bad"), record(b"b")])
    with pytest.raises(DeliveryError, match="cannot send to bad"):
        await acks[0]
    producer.deliveries[0].set_exception(RecordTooLargeError())
    with pytest.raises(DeliveryError, match="RecordTooLargeError"):
        await acks[1]


async def test_failures_after_close_are_sink_closed(sink: tuple[KafkaSink, FakeProducer]) -> None:
    s, producer = sink
    (ack,) = await s.send([record(b"a")])
    s._closed = True
    producer.deliveries[0].set_exception(KafkaTimeoutError())
    with pytest.raises(SinkClosedError):
        await ack


@settings(max_examples=300, deadline=None, database=None)
@given(key=st.binary(max_size=80))
def test_murmur2_is_kafkas(key: bytes) -> None:
    assert murmur2(key) == aiokafka_murmur2(key)


@settings(max_examples=200, deadline=None, database=None)
@given(key=st.binary(min_size=1, max_size=40), n=st.integers(1, 64))
def test_partition_by_key_is_aiokafkas_default(key: bytes, n: int) -> None:
    partitions = list(range(n))
    assert partition_by_key(key, partitions, partitions) == DefaultPartitioner()(
        key, partitions, partitions
    )


def test_a_null_key_picks_an_available_partition() -> None:
    assert partition_by_key(None, [0, 1, 2], [2]) == 2
    assert partition_by_key(None, [0, 1], []) in (0, 1)
    assert partition_by_key(os.urandom(8), [5], []) == 5
