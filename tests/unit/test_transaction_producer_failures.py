"""A transactional producer that fails in any way closes its partition and says so
(TransactionError, SinkClosedError on a send's future, KafkaUnavailableError from an open):
no aiokafka error leaves the adapter.

aiokafka's sender task dies when a transaction coordinator answers AddPartitionsToTxn,
AddOffsetsToTxn or EndTxn with ``InvalidTxnState`` (a coordinator that moved): its transactions
go to the fatal state, and a request still in flight when the producer stops makes ``stop``
raise that request's error. The fake producer below keeps aiokafka's own TransactionManager
(its state machine and its ``AssertionError`` on an invalid transition); the characterisation
test at the end runs aiokafka's own Sender against a coordinator that answers EndTxn with
error 48.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.errors import IllegalOperation, InvalidTxnState, KafkaError
from aiokafka.producer.sender import Sender
from aiokafka.producer.transaction_manager import TransactionManager, TransactionState

import consumer.kafka.sink as sink_module
from consumer.kafka.config import KafkaClientSettings, SinkSettings
from consumer.kafka.errors import KafkaUnavailableError, SinkClosedError, TransactionError
from consumer.kafka.records import TopicPartition
from consumer.kafka.transactions import TransactionalSink
from schemas.records import OutRecord

TP: TopicPartition = ("requests", 0)
SEND_TIMEOUT_MS = 200


class _Builder:
    """A producer batch being filled (what KafkaSink appends to)."""

    def append(self, **_: Any) -> object:
        return object()

    def close(self) -> None:
        pass


class _Accumulator:
    """The batches the producer holds; aiokafka's ``fail_all`` fails each."""

    def __init__(self) -> None:
        self.pending: list[asyncio.Future[None]] = []

    def fail_all(self, exc: BaseException) -> None:
        for future in self.pending:
            if not future.done():
                future.set_exception(exc)


class _Client:
    def __init__(self) -> None:
        self.cluster = SimpleNamespace(partitions_for_topic=lambda topic: {0})
        self.closed = False

    async def close(self) -> None:
        self.closed = True


class _Sender:
    def __init__(self) -> None:
        self.sender_task: asyncio.Future[None] | None = None

    async def close(self) -> None:
        pass


class FailingProducer:
    """aiokafka's transactional producer, its coordinator answering the request of one step
    (``fail_at``: ``send`` AddPartitionsToTxn, ``offsets`` AddOffsetsToTxn, ``commit``
    EndTxn) with ``InvalidTxnState``; ``begin``: its sender died just before the
    ``begin_number``-th ``begin_transaction``.

    ``in_flight``: the answer comes only when the producer stops (the request was in flight
    when the commit's deadline passed or the partition was revoked): aiokafka's stop cancels
    the sender, which awaits the request, and ``stop`` raises its ``InvalidTxnState``. Else
    the answer comes at once: the sender task dies (aiokafka wraps the error in a
    ``KafkaError``), every batch and the transaction fail with it.
    """

    def __init__(self, fail_at: str, *, in_flight: bool = False, begin_number: int = 1) -> None:
        self._txn_manager = TransactionManager("kbatch-g-requests-0", 60_000)
        self._sender = _Sender()
        self._message_accumulator = _Accumulator()
        self.client = _Client()
        self.fail_at = fail_at
        self.in_flight = in_flight
        self.begin_number = begin_number
        self.begins = 0
        self.waiting: str | None = None  # the step whose request is in flight
        self.stopped = False

    async def start(self) -> None:
        self._txn_manager.set_pid_and_epoch(7, 0)
        self._sender.sender_task = asyncio.get_running_loop().create_future()  # running

    async def stop(self) -> None:
        self.stopped = True
        if self.waiting is not None:  # Sender.close awaits the request, which fails now
            err = InvalidTxnState()
            self._dies(err, err)
            raise err
        await self.client.close()

    def _dies(self, task_error: BaseException, cause: BaseException) -> None:
        """aiokafka's Sender._fail_all after its routine ended with ``task_error``."""
        task_error.__cause__ = cause
        task = self._sender.sender_task
        assert task is not None
        task.set_exception(task_error)
        task.exception()  # retrieved by _fail_all
        self._message_accumulator.fail_all(task_error)
        # Before the first transaction aiokafka's fatal_error fails on the end waiter it does
        # not have yet (in the sender task's done callback: asyncio logs it); the state is
        # fatal by then.
        with contextlib.suppress(AttributeError):
            self._txn_manager.fatal_error(task_error)

    def _answer(self, step: str) -> bool:
        """The coordinator's answer to ``step``'s request; False: none yet, or an error."""
        if step != self.fail_at:
            return True
        if self.in_flight:
            self.waiting = step
        else:
            self._dies(KafkaError("Unexpected error during batch delivery"), InvalidTxnState())
        return False

    async def begin_transaction(self) -> None:
        self.begins += 1
        if self.fail_at == "begin" and self.begins == self.begin_number:
            self._dies(KafkaError("Unexpected error during batch delivery"), InvalidTxnState())
        self._txn_manager.begin_transaction()

    def create_batch(self) -> _Builder:
        return _Builder()

    async def send_batch(self, batch: _Builder, topic: str, *, partition: int) -> Any:
        if not self._txn_manager.is_in_transaction():
            raise IllegalOperation("Can't send messages while not in transaction")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._message_accumulator.pending.append(future)
        if self._answer("send"):
            future.set_result(None)
        return future

    async def send_offsets_to_transaction(self, offsets: Any, group_id: str) -> None:
        manager = self._txn_manager
        if not manager.is_in_transaction():
            raise IllegalOperation("Not in the middle of a transaction")
        future = manager.add_offsets_to_txn(offsets, group_id)
        if self._answer("offsets"):
            manager._pending_txn_offsets.popleft()
            manager.consumer_group_added(group_id)
            future.set_result(None)
        await asyncio.shield(future)

    async def commit_transaction(self) -> None:
        manager = self._txn_manager
        manager.committing_transaction()
        if self._answer("commit"):
            manager.complete_transaction()
        await asyncio.shield(manager.wait_for_transaction_end())

    async def abort_transaction(self) -> None:
        manager = self._txn_manager
        manager.aborting_transaction()  # AssertionError when fatal or committing
        manager.complete_transaction()
        await asyncio.shield(manager.wait_for_transaction_end())


class _NoDenials:
    async def denied(self, client: object, topics: set[str]) -> frozenset[str]:
        return frozenset()


@pytest.fixture
def producers(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[FailingProducer]]:
    """The producers the sinks build next, in order (KafkaSink builds its AIOKafkaProducer)."""
    queue: list[FailingProducer] = []
    monkeypatch.setattr(sink_module, "AIOKafkaProducer", lambda **_: queue.pop(0))
    yield queue


def transactional_sink() -> TransactionalSink:
    sinks = TransactionalSink(
        KafkaClientSettings(bootstrap="127.0.0.1:1"),
        SinkSettings(send_timeout_ms=SEND_TIMEOUT_MS),
        default_topic="replies",
        group_id="g",
    )
    sinks._write_verdicts = _NoDenials()  # type: ignore[assignment]
    return sinks


def reply() -> OutRecord:
    return OutRecord(topic=None, partition=None, key=b"k", value=b"v", headers=[])


async def opened(producers: list[FailingProducer], producer: FailingProducer) -> TransactionalSink:
    producers.append(producer)
    sinks = transactional_sink()
    await sinks.open(TP)
    return sinks


def closed_and_abandoned(sinks: TransactionalSink, producer: FailingProducer) -> bool:
    """The partition is closed and its producer's connections too (stopped or abandoned)."""
    return TP not in sinks.open_partitions and producer.stopped and producer.client.closed


@pytest.mark.parametrize("step", ["offsets", "commit"])
async def test_a_commit_whose_request_fails_as_the_producer_stops_is_a_transaction_error(
    producers: list[FailingProducer], step: str
) -> None:
    # The chaos scenario's member exit: the commit's request got no answer in time, the
    # partition's producer was stopped, and aiokafka's stop raised the request's late
    # InvalidTxnState out of the commit ("Error: unexpected InvalidTxnState").
    producer = FailingProducer(step, in_flight=True)
    sinks = await opened(producers, producer)
    with pytest.raises(TransactionError) as caught:
        await asyncio.wait_for(sinks.commit({TP: 10}, {TP: ""}), 5.0)
    assert caught.value.failed == {TP: "unknown_outcome"} and caught.value.recoverable
    assert caught.value.committed == {}
    assert closed_and_abandoned(sinks, producer)


@pytest.mark.parametrize("step", ["offsets", "commit"])
async def test_a_commit_whose_request_kills_the_sender_is_a_transaction_error(
    producers: list[FailingProducer], step: str
) -> None:
    producer = FailingProducer(step)
    sinks = await opened(producers, producer)
    with pytest.raises(TransactionError) as caught:
        await sinks.commit({TP: 10}, {TP: ""})
    assert caught.value.failed == {TP: "aborted"} and caught.value.recoverable
    assert closed_and_abandoned(sinks, producer)


async def test_a_revoke_while_a_request_is_in_flight_closes_the_partition(
    producers: list[FailingProducer],
) -> None:
    # A reply's AddPartitionsToTxn in flight when the partition is revoked: the close must
    # not raise the request's InvalidTxnState (it ran inside the rebalance, or the drain).
    producer = FailingProducer("send", in_flight=True)
    sinks = await opened(producers, producer)
    (ack,) = await sinks.send_from(TP, [reply()])
    await asyncio.wait_for(sinks.close(TP), 5.0)
    assert closed_and_abandoned(sinks, producer)
    with pytest.raises(SinkClosedError):
        await ack


async def test_a_send_whose_producer_died_fails_closed_and_the_commit_says_so(
    producers: list[FailingProducer],
) -> None:
    # Before: KafkaSink answered the sender's KafkaError with DeliveryError, which
    # dead-letters a request whose reply was fine (into a transaction that cannot commit).
    producer = FailingProducer("send")
    sinks = await opened(producers, producer)
    acks = await sinks.send_from(TP, [reply(), reply()])
    assert acks[0] is acks[1]  # one producer batch, one future: the sharing is kept
    with pytest.raises(SinkClosedError, match="failed"):
        await acks[0]
    later = await sinks.send_from(TP, [reply()])  # the producer refuses: not in a transaction
    with pytest.raises(SinkClosedError):
        await later[0]
    with pytest.raises(TransactionError) as caught:
        await sinks.commit({TP: 10}, {TP: ""})
    assert caught.value.failed == {TP: "unacknowledged_send"} and caught.value.recoverable
    assert closed_and_abandoned(sinks, producer)


async def test_close_failed_closes_only_the_partitions_whose_producer_failed(
    producers: list[FailingProducer],
) -> None:
    # Nothing of a failed producer's partition finishes (every send fails), so no commit
    # names it: the checkpoint asks close_failed at each commit.
    producer, healthy = FailingProducer("send"), FailingProducer("none")
    producers.extend([producer, healthy])
    sinks = transactional_sink()
    other: TopicPartition = ("requests", 1)
    await sinks.open(TP)
    await sinks.open(other)
    assert await sinks.close_failed([TP, other]) == {}
    (ack,) = await sinks.send_from(TP, [reply()])
    with pytest.raises(SinkClosedError):
        await ack
    assert await sinks.close_failed([TP, other]) == {TP: "aborted"}
    assert closed_and_abandoned(sinks, producer)
    assert sinks.open_partitions == {other} and not healthy.stopped
    await sinks.stop()


async def test_an_open_whose_producer_cannot_begin_stops_it_and_says_unavailable(
    producers: list[FailingProducer],
) -> None:
    # The caller's rewind keeps such a partition paused and tries again at the next commit.
    producer = FailingProducer("begin")
    producers.append(producer)
    sinks = transactional_sink()
    with pytest.raises(KafkaUnavailableError, match="could not begin a transaction"):
        await sinks.open(TP)
    assert closed_and_abandoned(sinks, producer)


async def test_a_commit_whose_next_transaction_cannot_begin_closes_the_partition(
    producers: list[FailingProducer],
) -> None:
    producer = FailingProducer("begin", begin_number=2)
    sinks = await opened(producers, producer)
    with pytest.raises(TransactionError, match="committed, but the next transaction") as caught:
        await sinks.commit({TP: 10}, {TP: ""})
    assert caught.value.failed == {TP: "aborted"} and caught.value.recoverable
    assert closed_and_abandoned(sinks, producer)


async def test_a_revoke_during_a_commit_leaves_the_commit_a_transaction_error(
    producers: list[FailingProducer],
) -> None:
    # The rebalance closes the partition while the interval's commit waits for EndTxn.
    producer = FailingProducer("commit", in_flight=True)
    sinks = await opened(producers, producer)
    commit = asyncio.ensure_future(sinks.commit({TP: 10}, {TP: ""}))
    while producer.waiting is None:
        await asyncio.sleep(0)
    await sinks.close(TP)
    with pytest.raises(TransactionError):
        await asyncio.wait_for(commit, 5.0)
    assert closed_and_abandoned(sinks, producer)


async def test_a_partition_opened_again_during_a_failed_commit_stays_open(
    producers: list[FailingProducer],
) -> None:
    first = FailingProducer("commit", in_flight=True)
    second = FailingProducer("none")
    sinks = await opened(producers, first)
    commit = asyncio.ensure_future(sinks.commit({TP: 10}, {TP: ""}))
    while first.waiting is None:
        await asyncio.sleep(0)
    await sinks.close(TP)
    producers.append(second)
    await sinks.open(TP)
    with pytest.raises(TransactionError):
        await asyncio.wait_for(commit, 5.0)
    assert TP in sinks.open_partitions and not second.stopped


# ---- aiokafka's own behaviour, which the adapter guards against -----------------------------


class _Coordinator:
    """aiokafka's client in front of a transaction coordinator that answers EndTxn with
    INVALID_TXN_STATE (48) once ``answer`` is set."""

    def __init__(self) -> None:
        self.asked = asyncio.Event()
        self.answer = asyncio.Event()

    async def coordinator_lookup(self, kind: object, key: str) -> int:
        return 0

    async def ready(self, node_id: int, group: object = None) -> bool:
        return True

    async def send(self, node_id: int, request: object, group: object = None) -> object:
        self.asked.set()
        await self.answer.wait()
        return SimpleNamespace(error_code=InvalidTxnState.errno)


class _EmptyAccumulator:
    def drain_by_nodes(self, ignore_nodes: object, muted_partitions: object) -> tuple[dict, bool]:
        return {}, False

    def waiter(self) -> asyncio.Future[None]:
        return asyncio.get_running_loop().create_future()

    async def flush_for_commit(self) -> None:
        pass

    def fail_all(self, exc: BaseException) -> None:
        pass


async def test_aiokafkas_sender_raises_the_in_flight_requests_error_from_its_close() -> None:
    # Why the adapter's stop catches every error: the routine, cancelled, awaits the EndTxn
    # in flight, whose InvalidTxnState escapes unwrapped from Sender.close (producer.stop).
    coordinator = _Coordinator()
    manager = TransactionManager("t", 60_000)
    manager.set_pid_and_epoch(7, 0)
    sender = Sender(
        coordinator,
        acks=-1,
        txn_manager=manager,
        message_accumulator=_EmptyAccumulator(),
        retry_backoff_ms=100,
        request_timeout_ms=1000,
    )
    await sender.start()
    manager.begin_transaction()
    manager.consumer_group_added("g")  # not an empty transaction: EndTxn is sent
    manager.committing_transaction()
    await asyncio.wait_for(coordinator.asked.wait(), 5.0)
    closing = asyncio.ensure_future(sender.close())
    await asyncio.sleep(0)
    coordinator.answer.set()
    with pytest.raises(InvalidTxnState):
        await asyncio.wait_for(closing, 5.0)
    assert manager.state is TransactionState.FATAL_ERROR
    waiter = manager.wait_for_transaction_end()
    assert waiter is not None and isinstance(waiter.exception(), InvalidTxnState)
