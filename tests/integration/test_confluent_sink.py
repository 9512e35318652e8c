"""The librdkafka reply sinks (:mod:`consumer.kafka.confluent_adapter.sink`,
:mod:`~consumer.kafka.confluent_adapter.transactions`) on the real broker, where the contract
is the seam's (:class:`consumer.kafka.transport.ReplySink`) each test runs against the aiokafka
sink too: the two must behave alike."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from confluent_kafka import Consumer
from confluent_kafka import TopicPartition as KafkaTP

from consumer.kafka.admin import create_topics, delete_topics
from consumer.kafka.config import KafkaClientSettings, SinkSettings
from consumer.kafka.confluent_adapter import sink as confluent_sink
from consumer.kafka.confluent_adapter.sink import ConfluentSink, producer_config
from consumer.kafka.confluent_adapter.transactions import (
    ConfluentTransactionalSink,
    group_only_metadata,
)
from consumer.kafka.errors import (
    DeliveryError,
    DeliveryTopicMissingError,
    KafkaUnavailableError,
    TransactionError,
)
from consumer.kafka.sink import KafkaSink
from consumer.kafka.sink_timing import MISSING_TOPIC_GRACE_S
from schemas.records import OutRecord
from tests.conftest import TopicFactory, unique_group
from tests.integration.harness import (
    committed_offsets,
    free_port,
    read_all,
    read_committed,
)

pytestmark = pytest.mark.integration

SINKS = [
    pytest.param(KafkaSink, id="aiokafka"),
    pytest.param(ConfluentSink, id="confluent"),
]


def make(cls: Any, bootstrap: str, topic: str, send_timeout_ms: int = 30_000) -> Any:
    return cls(
        KafkaClientSettings(bootstrap=bootstrap),
        SinkSettings(send_timeout_ms=send_timeout_ms),
        default_topic=topic,
    )


def record(key: bytes, value: bytes, seq: int = 0, topic: str | None = None) -> OutRecord:
    headers = [("seq", str(seq).encode()), ("kafka_correlationId", b"c-" + key)]
    return OutRecord(topic=topic, partition=None, key=key, value=value, headers=headers)


async def settle(acks: list[asyncio.Future[None]], timeout_s: float = 30) -> list[Any]:
    """Each ack's outcome: None or its exception."""
    await asyncio.wait_for(asyncio.gather(*acks, return_exceptions=True), timeout_s)
    return [a.exception() for a in acks]


@pytest.mark.parametrize("cls", SINKS)
async def test_keys_headers_and_order_per_partition(
    cls: Any, kafka_bootstrap: str, new_topic: TopicFactory
) -> None:
    topic = await new_topic("cf-order", partitions=3)
    sink = make(cls, kafka_bootstrap, topic)
    await sink.start()
    try:
        keys = [f"k{i}".encode() for i in range(12)]
        acks = []
        for round_ in range(10):  # several calls: order holds across them too
            acks += await sink.send([record(k, b"v%d" % round_, round_) for k in keys])
        assert await settle(acks) == [None] * len(acks)
    finally:
        await sink.stop()
    got = await read_all(kafka_bootstrap, topic, 3, decode=False)
    assert len(got) == 120
    by_key: dict[bytes | None, list[int]] = {}
    for r in sorted(got, key=lambda r: (r.partition, r.offset)):
        assert r.headers["kafka_correlationId"] == b"c-" + (r.key or b"")
        assert r.raw == b"v" + r.headers["seq"]
        by_key.setdefault(r.key, []).append(int(r.headers["seq"]))
    assert by_key == {k: list(range(10)) for k in keys}


async def test_same_partition_per_key_as_aiokafka(
    kafka_bootstrap: str, new_topic: TopicFactory
) -> None:
    keys = [f"req-{i}".encode() for i in range(200)]
    placed = []
    for cls in (KafkaSink, ConfluentSink):
        topic = await new_topic("cf-parity", partitions=7)
        sink = make(cls, kafka_bootstrap, topic)
        await sink.start()
        try:
            assert await settle(await sink.send([record(k, b"x") for k in keys])) == [None] * 200
        finally:
            await sink.stop()
        got = await read_all(kafka_bootstrap, topic, 7, decode=False)
        placed.append({r.key: r.partition for r in got})
    assert len(set(placed[0].values())) == 7  # spread: the comparison means something
    assert placed[0] == placed[1]


@pytest.mark.parametrize("cls", SINKS)
async def test_missing_topic_fails_after_the_grace(
    cls: Any, kafka_bootstrap: str, new_topic: TopicFactory
) -> None:
    topic = await new_topic("cf-missing-ok")
    sink = make(cls, kafka_bootstrap, topic)
    await sink.start()
    try:
        started = time.monotonic()
        acks = await sink.send(
            [record(b"a", b"x", topic="test.cf-never-made.zz"), record(b"b", b"y")]
        )
        missing, fine = await settle(acks, timeout_s=MISSING_TOPIC_GRACE_S + 15)
        assert isinstance(missing, DeliveryTopicMissingError)
        assert fine is None
        assert time.monotonic() - started < MISSING_TOPIC_GRACE_S + 10
    finally:
        await sink.stop()


async def test_a_topic_created_after_its_refusal_is_written(kafka_bootstrap: str) -> None:
    late = f"test.cf-late.{time.time_ns()}"
    sink = make(ConfluentSink, kafka_bootstrap, late)
    await sink.start()
    try:
        (missing,) = await settle(await sink.send([record(b"a", b"x")]))
        assert isinstance(missing, DeliveryTopicMissingError)
        await create_topics(kafka_bootstrap, [late])
        give_up = time.monotonic() + 15
        while (await settle(await sink.send([record(b"a", b"x")])))[0] is not None:
            assert time.monotonic() < give_up, "still refused after the topic was created"
            await asyncio.sleep(0.1)
    finally:
        await sink.stop()
        await delete_topics(kafka_bootstrap, [late])


@pytest.mark.parametrize("cls", SINKS)
async def test_too_large_value_fails_alone(
    cls: Any, kafka_bootstrap: str, new_topic: TopicFactory
) -> None:
    topic = await new_topic("cf-large")
    sink = make(cls, kafka_bootstrap, topic)
    await sink.start()
    try:
        acks = await sink.send([record(b"big", b"x" * 2_000_000), record(b"ok", b"y")])
        big, fine = await settle(acks)
        assert isinstance(big, DeliveryError)
        assert not isinstance(big, DeliveryTopicMissingError)
        assert fine is None
    finally:
        await sink.stop()


@pytest.mark.parametrize("cls", SINKS)
async def test_stop_flushes(cls: Any, kafka_bootstrap: str, new_topic: TopicFactory) -> None:
    topic = await new_topic("cf-flush", partitions=2)
    sink = make(cls, kafka_bootstrap, topic)
    await sink.start()
    acks = await sink.send([record(b"k%d" % i, b"v") for i in range(500)])
    await sink.stop()  # nothing awaited before: stop delivers what was queued
    assert await settle(acks, timeout_s=1) == [None] * 500
    assert len(await read_all(kafka_bootstrap, topic, 2, decode=False)) == 500


async def test_full_queue_waits_never_drops(
    kafka_bootstrap: str, new_topic: TopicFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = await new_topic("cf-full")

    def small_queue(*args: Any) -> dict[str, object]:
        return {**producer_config(*args), "queue.buffering.max.messages": 20}

    monkeypatch.setattr(confluent_sink, "producer_config", small_queue)
    sink = make(ConfluentSink, kafka_bootstrap, topic)
    waits = 0
    produce_when_room = sink._produce_when_room

    async def counted(*args: Any) -> None:
        nonlocal waits
        waits += 1
        await produce_when_room(*args)

    sink._produce_when_room = counted
    await sink.start()
    try:
        acks = await sink.send([record(b"k", b"v", i) for i in range(400)])
        assert await settle(acks) == [None] * 400
    finally:
        await sink.stop()
    assert waits > 0  # the queue was full, and send waited
    got = await read_all(kafka_bootstrap, topic, 1, decode=False)
    assert [int(r.headers["seq"]) for r in got] == list(range(400))


async def test_start_without_broker_fails(kafka_bootstrap: str) -> None:
    sink = make(ConfluentSink, f"127.0.0.1:{free_port()}", "t", send_timeout_ms=1000)
    with pytest.raises(KafkaUnavailableError):
        await asyncio.wait_for(sink.start(), 10)


# --exactly-once ---------------------------------------------------------------------------


def txn_sink(
    bootstrap: str, out: str, group: str, group_metadata: Any = None
) -> ConfluentTransactionalSink:
    return ConfluentTransactionalSink(
        KafkaClientSettings(bootstrap=bootstrap),
        SinkSettings(send_timeout_ms=10_000),
        default_topic=out,
        group_id=group,
        id_prefix="test-cf",
        group_metadata=group_metadata,
    )


def replies(*values: bytes) -> list[OutRecord]:
    return [OutRecord(topic=None, partition=None, key=v, value=v, headers=[]) for v in values]


def committed_metadata(bootstrap: str, group: str, topic: str) -> tuple[int, str | None]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        (tp,) = consumer.committed([KafkaTP(topic, 0)], timeout=10)
        return tp.offset, tp.metadata
    finally:
        consumer.close()


async def test_transactions_commit_abort_and_fence(
    kafka_bootstrap: str, new_topic: TopicFactory
) -> None:
    src, out = await new_topic("cf-txn-src"), await new_topic("cf-txn-out")
    group = unique_group("cf-txn")
    tp = (src, 0)
    old = txn_sink(kafka_bootstrap, out, group)
    await old.open(tp, timeout_s=30)
    try:
        assert await settle(await old.send_from(tp, replies(b"a", b"b"))) == [None, None]
        assert await old.commit({tp: 2}, {tp: "kb1:x"}) == {tp: 2}
        assert await settle(await old.send_from(tp, replies(b"zombie"))) == [None]
        new = txn_sink(kafka_bootstrap, out, group)
        await new.open(tp, timeout_s=30)  # the partition's next owner fences the old one
        try:
            with pytest.raises(TransactionError) as caught:
                await old.commit({tp: 3}, {tp: ""})
            assert caught.value.failed == {tp: "fenced"}
            assert caught.value.committed == {}
            assert tp not in old.open_partitions
            assert await settle(await new.send_from(tp, replies(b"c"))) == [None]
            assert await new.commit({tp: 3}, {tp: "kb1:y"}) == {tp: 3}
            assert await settle(await new.send_from(tp, replies(b"aborted"))) == [None]
            await new.close(tp)  # what was sent since the last commit is aborted
        finally:
            await new.stop()
    finally:
        await old.stop()
    seen = [r.key for r in await read_committed(kafka_bootstrap, out, 1, decode=False)]
    assert seen == [b"a", b"b", b"c"]
    assert await committed_offsets(kafka_bootstrap, group, src, 1) == {0: 3}
    assert await asyncio.to_thread(committed_metadata, kafka_bootstrap, group, src) == (
        3,
        "kb1:y",
    )


async def test_commit_asks_the_group_metadata_provider(
    kafka_bootstrap: str, new_topic: TopicFactory
) -> None:
    src, out = await new_topic("cf-txn-md-src"), await new_topic("cf-txn-md-out")
    group = unique_group("cf-txn-md")
    asked = 0

    async def metadata() -> object:  # what the group source's consumer would answer
        nonlocal asked
        asked += 1
        client = KafkaClientSettings(bootstrap=kafka_bootstrap)
        return await asyncio.to_thread(group_only_metadata, client, group)

    sink = txn_sink(kafka_bootstrap, out, group, metadata)
    tp = (src, 0)
    await sink.open(tp, timeout_s=30)
    try:
        assert await settle(await sink.send_from(tp, replies(b"a"))) == [None]
        assert await sink.commit({tp: 1}, {tp: "kb1:m"}) == {tp: 1}
    finally:
        await sink.stop()
    assert asked == 1
    assert await asyncio.to_thread(committed_metadata, kafka_bootstrap, group, src) == (
        1,
        "kb1:m",
    )


async def test_transactional_open_without_broker_is_unavailable() -> None:
    sink = txn_sink(f"127.0.0.1:{free_port()}", "t", unique_group("cf-none"))
    started = time.monotonic()
    with pytest.raises(KafkaUnavailableError):
        await sink.open(("t", 0), timeout_s=2)
    assert time.monotonic() - started < 10
    assert sink.open_partitions == frozenset()
