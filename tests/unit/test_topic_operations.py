"""May kbatch write a topic: the broker's authorized operations (Metadata v8, KIP-430), and a
transactional sink keeping a denied topic out of its transaction."""

from __future__ import annotations

import asyncio
import io
from types import SimpleNamespace
from typing import Any

import pytest

from consumer.kafka.config import KafkaClientSettings, SinkSettings
from consumer.kafka.errors import DeliveryDeniedError
from consumer.kafka.sink import KafkaSink
from consumer.kafka.topic_operations import (
    NOT_REQUESTED,
    WRITE,
    TopicOperationsRequest,
    WriteVerdicts,
    _MetadataResponseV8,
    write_verdicts,
)
from schemas.records import OutRecord
from tests.unit.test_kafka_sink import FakeProducer

DESCRIBE, READ = 8, 3


def topic(name: str, code: int = 0, operations: int = NOT_REQUESTED) -> tuple[Any, ...]:
    return (code, name, False, [(0, 0, 1, 0, [1], [1], [])], operations)


class Broker:
    """An aiokafka client whose one node answers Metadata v8 with ``topics``."""

    def __init__(self, *topics: tuple[Any, ...]) -> None:
        self.topics = list(topics)
        self.asked: list[list[str]] = []

    def get_random_node(self) -> int:
        return 1

    async def send(self, node_id: int, request: TopicOperationsRequest) -> Any:
        struct = request.prepare({3: (0, 12)})
        assert struct.API_VERSION == 8 and struct.include_topic_authorized_operations
        self.asked.append(list(struct.topics))
        # Through the wire format, as the broker's answer would come.
        encoded = _MetadataResponseV8(0, [(1, "h", 9092, None)], "c", 1, self.topics, 0).encode()
        return _MetadataResponseV8.decode(io.BytesIO(encoded))


async def test_write_verdicts_read_the_write_bit_and_the_acl_denial() -> None:
    broker = Broker(
        topic("writable", operations=(1 << WRITE) | (1 << DESCRIBE)),
        topic("describe-only", operations=(1 << DESCRIBE) | (1 << READ)),
        topic("hidden", code=29),  # TOPIC_AUTHORIZATION_FAILED
        topic("missing", code=3),  # no verdict: sent as before
        topic("not-computed"),  # no verdict either
    )
    names = ["writable", "describe-only", "hidden", "missing", "not-computed"]
    verdicts = await write_verdicts(broker, names)  # type: ignore[arg-type]
    assert verdicts == {"writable": True, "describe-only": False, "hidden": False}


async def test_a_transactional_sink_keeps_a_denied_topic_out_of_its_transaction() -> None:
    sink = KafkaSink(
        KafkaClientSettings(),
        SinkSettings(),
        default_topic="replies",
        transactional_id="t",
        write_verdicts=WriteVerdicts(),
    )
    producer = FakeProducer()
    broker = Broker(topic("replies", operations=1 << WRITE), topic("locked", operations=0))
    producer.client.get_random_node = broker.get_random_node
    producer.client.send = broker.send
    sink._producer = producer  # type: ignore[assignment]
    records = [OutRecord(t, None, b"k", b"v", []) for t in (None, "locked", None)]
    acks = await sink.send(records)
    with pytest.raises(DeliveryDeniedError, match="locked"):
        await acks[1]
    assert [t for t, _ in producer.sent] == ["replies", "replies"]  # the others go on
    await sink.send([OutRecord("locked", None, b"k", b"v", [])])
    assert broker.asked == [["locked", "replies"]]  # the verdicts are kept
    for delivery in producer.deliveries:
        delivery.set_result(None)
    await asyncio.gather(acks[0], acks[2])


def test_the_request_is_metadata_version_8_without_topic_creation() -> None:
    struct = TopicOperationsRequest(["a"]).prepare({3: (0, 12)})
    assert (struct.API_KEY, struct.API_VERSION) == (3, 8)
    assert SimpleNamespace(**struct.to_object()) == SimpleNamespace(
        topics=["a"],
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=True,
    )
