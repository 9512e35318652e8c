"""The reply sink's batch path (``send``) and partitioner, with a fake producer: no broker."""

from __future__ import annotations

import asyncio
import os
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.errors import KafkaTimeoutError, RecordTooLargeError
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.partitioner import murmur2 as aiokafka_murmur2
from hypothesis import given, settings
from hypothesis import strategies as st

from consumer.kafka.config import KafkaClientSettings, SinkSettings
from consumer.kafka.errors import DeliveryDeniedError
from consumer.kafka.partitioner import murmur2, partition_by_key
from consumer.kafka.sink import BATCH_VALUE_LIMIT, DeliveryError, KafkaSink, SinkClosedError
from schemas.records import OutRecord


class FakeBuilder:
    """aiokafka's ``BatchBuilder`` in small: holds ``capacity`` records, then refuses."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.keys: list[bytes | None] = []
        self.closed = False

    def append(self, *, timestamp: None, key: bytes | None, value: bytes, headers: Any) -> Any:
        if self.closed or (len(self.keys) >= self.capacity and self.keys):
            self.closed = True
            return None
        self.keys.append(key)
        return object()

    def close(self) -> None:
        self.closed = True


class _AllBut:
    """Every topic name but the missing ones."""

    def __init__(self, missing: set[str]) -> None:
        self.missing = missing

    def __contains__(self, topic: object) -> bool:
        return topic not in self.missing


class FakeProducer:
    """``send``/``send_batch`` return a delivery future the test resolves; ``raise_for`` makes
    a topic raise; ``metadata`` holds the partitions the producer knows (else ``send``)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None]] = []
        self.deliveries: list[asyncio.Future[None]] = []
        self.raise_for: dict[str, BaseException] = {}
        self.metadata: dict[str, set[int]] = {}
        self.batches: list[tuple[str, int, list[bytes | None]]] = []
        self.batch_capacity = 100
        self.gate: asyncio.Event | None = None  # send_batch waits for it (a batch in flight)
        self.missing: set[str] = set()  # topics the broker does not list
        self.denied: set[str] = set()  # of those, the ones it answers unauthorized
        self.metadata_calls = 0
        self.client = SimpleNamespace(
            cluster=SimpleNamespace(partitions_for_topic=self.metadata.get),
            fetch_all_metadata=self.fetch_all_metadata,
            get_random_node=lambda: 1,
            send=self.send_request,
        )

    async def send_request(self, node_id: int, request: object) -> SimpleNamespace:
        """A one-topic metadata request: error 29 (TOPIC_AUTHORIZATION_FAILED) or 3."""
        (topic,) = request._topics  # type: ignore[attr-defined]
        return SimpleNamespace(topics=[(29 if topic in self.denied else 3, topic, False, [])])

    async def fetch_all_metadata(self) -> SimpleNamespace:
        self.metadata_calls += 1
        listed = _AllBut(self.missing)
        return SimpleNamespace(topics=lambda: listed)

    async def stop(self) -> None:
        self.batches_at_stop = list(self.batches)

    def create_batch(self) -> FakeBuilder:
        return FakeBuilder(self.batch_capacity)

    async def send_batch(
        self, batch: FakeBuilder, topic: str, *, partition: int
    ) -> asyncio.Future[None]:
        if topic in self.raise_for:
            raise self.raise_for[topic]
        if self.gate is not None:
            await self.gate.wait()
        assert batch.closed
        self.batches.append((topic, partition, batch.keys))
        delivery: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.deliveries.append(delivery)
        return delivery

    async def send(self, topic: str, **kw: Any) -> asyncio.Future[None]:
        if topic in self.raise_for:
            raise self.raise_for[topic]
        self.sent.append((topic, kw["key"]))
        delivery: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.deliveries.append(delivery)
        return delivery


async def turns(n: int = 5) -> None:
    """Let the sink's flusher tasks run."""
    for _ in range(n):
        await asyncio.sleep(0)


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


async def until(condition: Any, timeout_s: float = 2.0) -> None:
    """Let the loop run until ``condition()`` holds (fails after ``timeout_s`` seconds)."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + timeout_s
    while not condition():
        assert loop.time() < give_up, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_no_acknowledgement_in_time_sends_no_second_copy(
    sink: tuple[KafkaSink, FakeProducer], caplog: pytest.LogCaptureFixture
) -> None:
    # Regression: the deadline re-sent the record while the producer still retried the
    # first copy, which landed too: one reply written twice without a crash or a rebalance.
    s, producer = sink
    (ack,) = await s.send([record(b"a")])
    await until(lambda: "not acknowledged within" in caplog.text)  # send_timeout_ms = 200
    await turns()
    assert len(producer.deliveries) == 1 and not ack.done()  # the producer retries it itself
    producer.deliveries[0].set_result(None)  # the late answer acknowledges it
    await asyncio.wait_for(ack, 1)
    assert len(producer.deliveries) == 1


class TimingOutBatchProducer(FakeProducer):
    """``send_batch`` of the first batch waits for ``gate``, then raises what aiokafka raises
    when the partition's queue did not drain in time (``KafkaTimeoutError``)."""

    async def send_batch(
        self, batch: FakeBuilder, topic: str, *, partition: int
    ) -> asyncio.Future[None]:
        if not self.batches and "timed out" not in self.raise_for:
            self.raise_for["timed out"] = KafkaTimeoutError()
            assert self.gate is not None
            await self.gate.wait()
            raise KafkaTimeoutError()
        return await super().send_batch(batch, topic, partition=partition)


@pytest.mark.parametrize("transactional", [True, False])
async def test_a_batch_refused_after_its_deadline_keeps_the_partitions_flush_going(
    transactional: bool,
) -> None:
    # Regression: the deadline failed the records' ack, then send_batch raised for the same
    # batch and the ack was failed again (InvalidStateError): the partition's flush task
    # died and the batches queued behind it were never handed to the producer.
    s = KafkaSink(
        KafkaClientSettings(),
        SinkSettings(send_timeout_ms=100),
        default_topic="kbatch.replies",
        transactional_id="t" if transactional else None,
    )
    producer = TimingOutBatchProducer()
    s._producer = producer  # type: ignore[assignment]
    producer.metadata["kbatch.replies"] = {0}
    producer.gate = asyncio.Event()
    (first,) = await s.send([record(b"a")])
    await turns()
    (second,) = await s.send([record(b"b")])  # queued behind the first batch
    if transactional:  # the deadline: no verdict, the partition's transaction is aborted
        with pytest.raises(SinkClosedError):
            await asyncio.wait_for(first, 2)
    producer.gate.set()  # now the producer refuses the first batch as well
    await until(lambda: any(keys == [b"b"] for _, _, keys in producer.batches))
    await until(lambda: not s._flushers)
    if not transactional:  # never taken by the producer: sent again, safely
        await until(lambda: producer.sent == [("kbatch.replies", b"a")])
        for d in producer.deliveries:
            d.set_result(None)
        await asyncio.wait_for(asyncio.gather(first, second), 2)
        assert producer.sent == [("kbatch.replies", b"a")]  # one copy


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


async def test_a_topic_the_broker_does_not_have_is_refused_within_the_grace(
    sink: tuple[KafkaSink, FakeProducer], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Regression: a reply topic nobody created waited out the producer's metadata wait
    # (send_timeout_ms, 30 s by default) and held its partition's commits that long.
    import consumer.kafka.sink as sink_module

    monkeypatch.setattr(sink_module, "MISSING_TOPIC_GRACE_S", 0.05)
    s, producer = sink
    producer.missing.add("nobody.made.this")
    acks = await s.send([record(b"a", "nobody.made.this"), record(b"b")])
    with pytest.raises(DeliveryError, match=r"nobody\.made\.this does not exist"):
        await acks[0]
    assert producer.sent == [("kbatch.replies", b"b")]  # the other record went on
    calls = producer.metadata_calls
    (again,) = await s.send([record(b"c", "nobody.made.this")])
    with pytest.raises(DeliveryError):
        await again
    assert producer.metadata_calls == calls  # the verdict is kept: no second question


async def test_a_topic_the_acls_hide_is_refused_as_denied_within_the_grace(
    sink: tuple[KafkaSink, FakeProducer], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The broker's listing of all topics leaves out those kbatch may not describe; asked for
    # the one topic it answers TOPIC_AUTHORIZATION_FAILED: reply_topic_not_allowed, not missing.
    import consumer.kafka.sink as sink_module

    monkeypatch.setattr(sink_module, "MISSING_TOPIC_GRACE_S", 0.05)
    s, producer = sink
    producer.missing.add("billing.events")
    producer.denied.add("billing.events")
    acks = await s.send([record(b"a", "billing.events"), record(b"b")])
    with pytest.raises(DeliveryDeniedError, match=r"denies .* billing\.events"):
        await acks[0]
    assert producer.sent == [("kbatch.replies", b"b")]  # the other record went on
    (again,) = await s.send([record(b"c", "billing.events")])
    with pytest.raises(DeliveryDeniedError):  # the kept verdict keeps its reason
        await again


async def test_failures_after_close_are_sink_closed(sink: tuple[KafkaSink, FakeProducer]) -> None:
    s, producer = sink
    (ack,) = await s.send([record(b"a")])
    s._closed = True
    producer.deliveries[0].set_exception(KafkaTimeoutError())
    with pytest.raises(SinkClosedError):
        await ack


async def send_twelve_to_three_partitions(
    s: KafkaSink, producer: FakeProducer
) -> tuple[list[bytes], list[asyncio.Future[None]]]:
    """Send records keyed k0…k11 in one call to the 3-partition ``kbatch.replies``: (keys, acks)."""
    producer.metadata["kbatch.replies"] = {0, 1, 2}
    keys = [b"k%d" % i for i in range(12)]
    return keys, await s.send([record(k) for k in keys])


async def test_known_topics_go_in_one_batch_per_partition_by_key(
    sink: tuple[KafkaSink, FakeProducer],
) -> None:
    s, producer = sink
    keys, acks = await send_twelve_to_three_partitions(s, producer)
    await turns()
    assert producer.sent == []  # nothing took the producer's per-record send
    by_partition = {p: ks for _, p, ks in producer.batches}
    assert len(producer.batches) == len(by_partition)  # one batch per partition
    for k in keys:  # the partition the producer's own partitioner would pick, order kept
        assert k in by_partition[partition_by_key(k, [0, 1, 2], [0, 1, 2])]
    assert sorted(k for ks in by_partition.values() for k in ks) == sorted(keys)
    for ks in by_partition.values():
        assert ks == [k for k in keys if k in ks]
    first = producer.batches[0][2]
    producer.deliveries[0].set_result(None)
    await asyncio.sleep(0)
    assert [a.done() for a in acks] == [k in first for k in keys]
    for d in producer.deliveries[1:]:
        d.set_result(None)
    await asyncio.gather(*acks)


async def test_a_full_batch_starts_the_next_and_explicit_partitions_are_kept(
    sink: tuple[KafkaSink, FakeProducer],
) -> None:
    s, producer = sink
    producer.metadata["kbatch.replies"] = {0, 1}
    producer.batch_capacity = 2
    records = [OutRecord(None, 1, b"k%d" % i, b"v", []) for i in range(5)]
    await s.send(records)
    await turns()
    assert producer.batches == [
        ("kbatch.replies", 1, [b"k0", b"k1"]),
        ("kbatch.replies", 1, [b"k2", b"k3"]),
        ("kbatch.replies", 1, [b"k4"]),
    ]


async def test_sends_queued_while_the_producer_is_busy_travel_in_one_batch(
    sink: tuple[KafkaSink, FakeProducer],
) -> None:
    s, producer = sink
    producer.metadata["kbatch.replies"] = {0}
    producer.gate = asyncio.Event()
    first = await s.send([record(b"a")])
    await turns()  # "a" is being handed over; the producer waits for its batch before
    later = await s.send([record(b"b")]) + await s.send([record(b"c")])
    producer.gate.set()
    await turns()
    assert producer.batches == [("kbatch.replies", 0, [b"a"]), ("kbatch.replies", 0, [b"b", b"c"])]
    producer.deliveries[1].set_result(None)
    await turns()
    assert [a.done() for a in first + later] == [False, True, True]
    producer.deliveries[0].set_result(None)
    await asyncio.wait_for(first[0], 1)


async def test_stop_hands_queued_batches_to_the_producer_first(
    sink: tuple[KafkaSink, FakeProducer],
) -> None:
    s, producer = sink
    producer.metadata["kbatch.replies"] = {0}
    await s.send([record(b"a")])
    await s.stop()
    assert producer.batches_at_stop == [("kbatch.replies", 0, [b"a"])]


async def test_unusual_records_take_the_producers_send(
    sink: tuple[KafkaSink, FakeProducer],
) -> None:
    s, producer = sink
    producer.metadata["kbatch.replies"] = {0}
    big = OutRecord(None, None, b"big", b"x" * (BATCH_VALUE_LIMIT + 1), [])
    unknown_partition = OutRecord(None, 7, b"p7", b"v", [])
    await s.send([record(b"a"), record(None), big, unknown_partition, record(b"t", "new")])  # type: ignore[arg-type]
    await turns()
    assert producer.batches == [("kbatch.replies", 0, [b"a"])]
    assert producer.sent == [
        ("kbatch.replies", None),
        ("kbatch.replies", b"big"),
        ("kbatch.replies", b"p7"),
        ("new", b"t"),
    ]


async def test_a_failed_batch_retries_each_record_and_refusals_are_delivery_errors(
    sink: tuple[KafkaSink, FakeProducer],
) -> None:
    s, producer = sink
    producer.metadata["kbatch.replies"] = {0}
    producer.metadata["bad"] = {0}
    producer.raise_for["bad"] = AssertionError("Unrecognized partition")
    acks = await s.send([record(b"a"), record(b"b"), record(b"c", "bad")])
    await turns()
    with pytest.raises(DeliveryError, match=r"cannot send to bad\[0\]"):
        await acks[2]
    producer.deliveries[0].set_exception(KafkaTimeoutError())
    for _ in range(20):  # each record of the batch is sent again on its own
        await asyncio.sleep(0)
        if len(producer.sent) == 2:
            break
    assert producer.sent == [("kbatch.replies", b"a"), ("kbatch.replies", b"b")]
    assert not acks[0].done()
    for d in producer.deliveries[1:]:
        d.set_result(None)
    await asyncio.wait_for(asyncio.gather(acks[0], acks[1]), 1)


async def test_the_records_of_one_call_in_one_batch_share_their_ack(
    sink: tuple[KafkaSink, FakeProducer],
) -> None:
    s, producer = sink
    keys, acks = await send_twelve_to_three_partitions(s, producer)
    later = await s.send([record(b"k0")])  # the same batch as k0, another call: its own ack
    await turns()
    by_partition = {p: ks for _, p, ks in producer.batches}
    assert len(producer.batches) == len(by_partition)  # one batch per partition
    assert sum(ks.count(b"k0") for ks in by_partition.values()) == 2
    partition_of = {k: p for p, ks in by_partition.items() for k in ks}
    for k, ack in zip(keys, acks, strict=True):  # one ack object per partition's batch
        assert all((ack is other) == (partition_of[k] == partition_of[j])
                   for j, other in zip(keys, acks, strict=True))  # fmt: skip
    assert len({id(a) for a in acks}) == len(by_partition)
    assert later[0] is not acks[0]
    for d in producer.deliveries:
        d.set_result(None)
    await asyncio.wait_for(asyncio.gather(*acks, *later), 1)


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
