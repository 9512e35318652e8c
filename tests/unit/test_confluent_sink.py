""":class:`ConfluentSink`'s and :class:`ConfluentTransactionalSink`'s own logic on a fake
librdkafka producer: the deadline only warns (idempotent) or fails the record (transactional),
a retriable delivery failure is produced again, a full queue waits, abandon fails what is left,
the loop's poll settles each poll's reports together; a failed commit's reason closes its
partition, an unacknowledged send taints the transaction, no producer id in time is
unavailable."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from consumer.kafka.config import KafkaClientSettings, SinkSettings
from consumer.kafka.confluent_adapter import sink as confluent_sink
from consumer.kafka.confluent_adapter import transactions
from consumer.kafka.confluent_adapter.sink import ConfluentSink
from consumer.kafka.confluent_adapter.transactions import ConfluentTransactionalSink
from consumer.kafka.errors import (
    FENCED,
    KafkaSecurityError,
    KafkaUnavailableError,
    SinkClosedError,
    TransactionError,
)
from schemas.records import OutRecord


class FakeProducer:
    """librdkafka's producer as the sink uses it: ``produce`` queues the callback, the test
    decides each record's report (``answer``), ``poll`` serves the decided ones."""

    def __init__(self, _config: dict[str, Any]) -> None:
        self.lock = threading.Lock()
        self.produced: list[tuple[str, bytes | None, Callable[..., None]]] = []
        self.decided: list[tuple[Callable[..., None], KafkaError | None]] = []
        self.full = 0  # the next this many produce calls raise BufferError
        self.polls_with_reports = 0

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None,
                partition: int = -1, headers: Any = None,
                on_delivery: Callable[..., None] | None = None) -> None:  # fmt: skip
        if self.full:
            self.full -= 1
            raise BufferError("queue full")
        assert on_delivery is not None
        with self.lock:
            self.produced.append((topic, key, on_delivery))

    def answer(self, index: int, err: KafkaError | None = None) -> None:
        with self.lock:
            self.decided.append((self.produced[index][2], err))

    def poll(self, timeout: float = -1) -> int:
        with self.lock:
            decided, self.decided = self.decided, []
        for callback, err in decided:
            callback(err, None)
        if decided:
            self.polls_with_reports += 1
        else:
            threading.Event().wait(min(timeout, 0.01))
        return len(decided)

    def purge(self, in_queue: bool = True, in_flight: bool = True, blocking: bool = True) -> None:
        with self.lock:
            answered = {id(cb) for cb, _ in self.decided}
            for _, _, callback in self.produced:
                if id(callback) not in answered:
                    self.decided.append((callback, KafkaError(KafkaError._PURGE_QUEUE)))

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> None:
        return None

    def close(self) -> bool:
        self.poll(0)
        return True


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> list[FakeProducer]:
    made: list[FakeProducer] = []

    def producer(config: dict[str, Any]) -> FakeProducer:
        made.append(FakeProducer(config))
        return made[-1]

    monkeypatch.setattr(confluent_sink, "Producer", producer)
    return made


def make(transactional: bool = False) -> ConfluentSink:
    return ConfluentSink(
        KafkaClientSettings(bootstrap="fake:9092"),
        SinkSettings(send_timeout_ms=100),
        default_topic="replies",
        transactional_id="kb-g-t-0" if transactional else None,
    )


def records(n: int) -> list[OutRecord]:
    return [OutRecord(None, None, b"k%d" % i, b"v", [("h", b"1")]) for i in range(n)]


async def until(check: Callable[[], bool], timeout_s: float = 5) -> None:
    async with asyncio.timeout(timeout_s):
        while not check():
            await asyncio.sleep(0.005)


async def test_idempotent_deadline_only_warns(
    fake: list[FakeProducer], caplog: pytest.LogCaptureFixture
) -> None:
    sink = make()
    await sink.start()
    producer = fake[0]
    try:
        with caplog.at_level(logging.WARNING, logger=confluent_sink.__name__):
            (ack,) = await sink.send(records(1))
            await until(lambda: "not acknowledged within" in caplog.text)
            assert not ack.done()  # librdkafka keeps retrying it: no second copy, no failure
            producer.answer(0)
            await asyncio.wait_for(ack, 5)
        assert len(producer.produced) == 1
    finally:
        await sink.stop()


async def test_transactional_deadline_fails_the_record(fake: list[FakeProducer]) -> None:
    sink = make(transactional=True)
    sink.start_polling()
    try:
        (ack,) = await sink.send(records(1))
        with pytest.raises(SinkClosedError):
            await asyncio.wait_for(ack, 5)
        fake[0].answer(0)  # the late ack changes nothing
        assert len(fake[0].produced) == 1
    finally:
        await sink.abandon()


async def test_retriable_failure_is_produced_again(fake: list[FakeProducer]) -> None:
    sink = make()
    await sink.start()
    producer = fake[0]
    try:
        (ack,) = await sink.send(records(1))
        producer.answer(0, KafkaError(KafkaError.NOT_ENOUGH_REPLICAS, retriable=True))
        await until(lambda: len(producer.produced) == 2)
        producer.answer(1)
        await asyncio.wait_for(ack, 5)
    finally:
        await sink.stop()


async def test_full_queue_waits_and_keeps_order(fake: list[FakeProducer]) -> None:
    sink = make()
    await sink.start()
    producer = fake[0]
    producer.full = 3
    try:
        acks = await sink.send(records(4))
        assert [key for _, key, _ in producer.produced] == [b"k0", b"k1", b"k2", b"k3"]
        for i in range(4):
            producer.answer(i)
        await asyncio.wait_for(asyncio.gather(*acks), 5)
    finally:
        await sink.stop()


async def test_the_reports_of_one_poll_are_settled_together(fake: list[FakeProducer]) -> None:
    sink = make()
    await sink.start()
    producer = fake[0]
    handed: list[int] = []
    delivered = sink._delivered

    def counting(batch: list[Any]) -> None:
        handed.append(len(batch))
        delivered(batch)

    sink._delivered = counting  # type: ignore[method-assign]
    try:
        acks = await sink.send(records(50))
        with producer.lock:  # all 50 decided before the next poll
            producer.decided = [(cb, None) for _, _, cb in producer.produced]
        await asyncio.wait_for(asyncio.gather(*acks), 5)
        assert handed == [50]
    finally:
        await sink.stop()


async def test_abandon_fails_what_is_left(fake: list[FakeProducer]) -> None:
    sink = make()
    await sink.start()
    acks = await sink.send(records(3))
    fake[0].answer(0)
    await asyncio.wait_for(acks[0], 5)
    await sink.abandon()
    for ack in acks[1:]:
        with pytest.raises(SinkClosedError):
            await asyncio.wait_for(ack, 5)
    (late,) = await sink.send(records(1))
    with pytest.raises(SinkClosedError):
        await late


class FakeTxnProducer(FakeProducer):
    """A transactional producer: each call is recorded; ``fail`` makes one raise."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.calls: list[str] = []
        self.fail: dict[str, KafkaError] = {}

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if name in self.fail:
            raise KafkaException(self.fail[name])

    def init_transactions(self, timeout: float = -1) -> None:
        self._call("init")

    def begin_transaction(self) -> None:
        self._call("begin")

    def send_offsets_to_transaction(self, positions: Any, group: Any, timeout: float = -1) -> None:
        assert group == b"group-metadata"
        self._call("offsets")

    def commit_transaction(self, timeout: float = -1) -> None:
        self._call("commit")

    def abort_transaction(self, timeout: float = -1) -> None:
        self._call("abort")


@pytest.fixture
def fake_txn(monkeypatch: pytest.MonkeyPatch) -> list[FakeTxnProducer]:
    made: list[FakeTxnProducer] = []

    def producer(config: dict[str, Any]) -> FakeTxnProducer:
        assert config["transactional.id"] == "kbatch-g-in-0"
        made.append(FakeTxnProducer(config))
        return made[-1]

    monkeypatch.setattr(confluent_sink, "Producer", producer)
    monkeypatch.setattr(transactions, "AdminWriteVerdicts", NoVerdicts)
    return made


class NoVerdicts:
    def __init__(self, _client: Any) -> None: ...

    async def denied(self, topics: set[str]) -> frozenset[str]:
        return frozenset()


def txn_sink() -> ConfluentTransactionalSink:
    async def metadata() -> object:
        return b"group-metadata"

    return ConfluentTransactionalSink(
        KafkaClientSettings(bootstrap="fake:9092"),
        SinkSettings(send_timeout_ms=1000),
        default_topic="replies",
        group_id="g",
        group_metadata=metadata,
    )


TP = ("in", 0)


@pytest.mark.parametrize(
    ("call", "error", "reason"),
    [
        ("commit", KafkaError(KafkaError._TIMED_OUT, retriable=True), "unknown_outcome"),
        ("commit", KafkaError(KafkaError.INVALID_TXN_STATE, txn_requires_abort=True), "aborted"),
        ("offsets", KafkaError(KafkaError._FENCED, fatal=True), FENCED),
    ],
)
async def test_a_failed_commit_closes_the_partition(
    fake_txn: list[FakeTxnProducer], call: str, error: KafkaError, reason: str
) -> None:
    sink = txn_sink()
    await sink.open(TP, timeout_s=5)
    producer = fake_txn[0]
    producer.fail[call] = error
    with pytest.raises(TransactionError) as caught:
        await sink.commit({TP: 5}, {TP: "kb1:x"})
    assert caught.value.failed == {TP: reason}
    assert sink.open_partitions == frozenset()
    assert producer.calls[-1] == "abort"  # closed: never reused


async def test_an_unacknowledged_send_taints_the_transaction(
    fake_txn: list[FakeTxnProducer],
) -> None:
    sink = txn_sink()
    await sink.open(TP, timeout_s=5)
    (ack,) = await sink.send_from(TP, records(1))
    with pytest.raises(SinkClosedError):  # no ack within the send deadline
        await asyncio.wait_for(ack, 5)
    with pytest.raises(TransactionError) as caught:
        await sink.commit({TP: 1}, {TP: ""})
    assert caught.value.failed == {TP: "unacknowledged_send"}
    assert "commit" not in fake_txn[0].calls


async def test_commit_then_begin(fake_txn: list[FakeTxnProducer]) -> None:
    sink = txn_sink()
    await sink.open(TP, timeout_s=5)
    assert await sink.commit({TP: 3, ("other", 0): 9}, {TP: "kb1:x"}) == {TP: 3}
    assert fake_txn[0].calls == ["init", "begin", "offsets", "commit", "begin"]
    await sink.stop()
    assert fake_txn[0].calls[-1] == "abort"


async def test_open_without_a_producer_id_in_time(fake_txn: list[FakeTxnProducer]) -> None:
    sink = txn_sink()

    def producer(config: dict[str, Any]) -> FakeTxnProducer:
        made = FakeTxnProducer(config)
        made.fail["init"] = KafkaError(KafkaError._TIMED_OUT, retriable=True)
        fake_txn.append(made)
        return made

    confluent_sink.Producer = producer  # type: ignore[assignment]  # undone by monkeypatch
    with pytest.raises(KafkaUnavailableError, match=r"within 0\.3 s"):
        await sink.open(TP, timeout_s=0.3)
    assert sink.open_partitions == frozenset()


async def test_close_failed_closes_a_fenced_or_tainted_partition_and_says_why(
    fake_txn: list[FakeTxnProducer],
) -> None:
    # A partition whose producer failed finishes nothing more, so no commit would name it:
    # the checkpoint asks for these after each commit (TransactionalCheckpoint.commit).
    sink = txn_sink()
    healthy, fenced, tainted = ("in", 0), ("in", 0), ("in", 0)
    await sink.open(healthy, timeout_s=5)
    assert await sink.close_failed([healthy]) == {}
    assert sink.open_partitions == frozenset({healthy})
    sink._sinks[fenced].fatal_error = KafkaError(KafkaError._FENCED, fatal=True)
    assert await sink.close_failed([fenced]) == {fenced: FENCED}
    assert sink.open_partitions == frozenset()
    await sink.open(tainted, timeout_s=5)
    sink._tainted.add(tainted)
    assert await sink.close_failed([tainted]) == {tainted: "aborted"}
    assert fake_txn[-1].calls[-1] == "abort"


async def test_close_failed_tells_a_fenced_producer_by_its_abort(
    fake_txn: list[FakeTxnProducer],
) -> None:
    # librdkafka fails the sends of a fenced producer before error_cb reports the fence: the
    # partition is only tainted, and reopening it would fence the partition's new owner.
    sink = txn_sink()
    await sink.open(TP, timeout_s=5)
    sink._tainted.add(TP)
    fake_txn[0].fail["abort"] = KafkaError(KafkaError._FENCED, fatal=True)
    assert await sink.close_failed([TP]) == {TP: FENCED}


def test_a_refused_login_reads_as_on_aiokafka(fake: list[FakeProducer]) -> None:
    """The sink's start-up error for a TLS/SASL refusal is worded as start_client words
    aiokafka's (``the broker at host:port refused the client: <cause>``), an ACL denial as
    map_kafka_errors does; anything else is KafkaUnavailableError with librdkafka's text."""
    sink = make()
    sink.last_error = KafkaError(
        KafkaError._AUTHENTICATION,
        "sasl_ssl://b1:9093/bootstrap: SASL authentication error: invalid credentials",
    )
    err = sink.unavailable("the reply producer cannot connect", KafkaException("x"))
    assert type(err) is KafkaSecurityError
    assert str(err) == (
        "the broker at b1:9093 refused the client: SASL login refused: "
        "SASL authentication error: invalid credentials"
    )
    sink.last_error = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "Broker: denied")
    err = sink.unavailable("the reply producer cannot connect", KafkaException("x"))
    assert str(err).startswith("the reply producer cannot connect: the broker denies it: TOPIC_")
    sink.last_error = KafkaError(KafkaError._TRANSPORT, "b1:9093/bootstrap: Connection refused")
    err = sink.unavailable("the reply producer cannot connect", KafkaException("x"))
    assert type(err) is KafkaUnavailableError


async def test_the_loop_polls_no_thread_of_its_own(fake: list[FakeProducer]) -> None:
    """Delivery reports are served by a loop timer: fast while records are awaited, slow
    (logs and errors only) when none is."""
    before = {t.name for t in threading.enumerate()}
    sink = make()
    await sink.start()
    producer = fake[0]
    try:
        assert not sink._polling_fast
        acks = await sink.send(records(3))
        assert sink._polling_fast
        for i in range(3):
            producer.answer(i)
        await asyncio.wait_for(asyncio.gather(*acks), 5)
        assert {t.name for t in threading.enumerate()} - before <= {"kbatch-librdkafka-call"}
        await asyncio.wait_for(_until(lambda: not sink._polling_fast), 5)
    finally:
        await sink.stop()


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(confluent_sink.LOOP_POLL_S)  # a tick of the timer under test
