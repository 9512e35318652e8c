"""A transaction commit without a verdict is an unknown outcome: the producer is closed, never
reused, and the caller learns it (TransactionError), within the send deadline."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka.errors import IllegalOperation, ProducerFenced

from consumer.kafka.config import KafkaClientSettings, SinkSettings
from consumer.kafka.errors import FENCED, TransactionError
from consumer.kafka.transactions import TransactionalSink


class _TxnManager:
    """aiokafka's transaction manager: no transaction ended, none failed (``fatal``: fenced)."""

    def __init__(self, fatal: BaseException | None = None) -> None:
        self.fatal = fatal

    def is_fatal_error(self) -> bool:
        return self.fatal is not None

    def wait_for_transaction_end(self) -> asyncio.Future[None] | None:
        if self.fatal is None:
            return None
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiter.set_exception(self.fatal)
        return waiter


class HangingProducer:
    """A transactional producer whose coordinator never answers EndTxn."""

    def __init__(self) -> None:
        self._txn_manager = _TxnManager()
        self.calls: list[str] = []

    async def send_offsets_to_transaction(self, offsets: Any, group_id: str) -> None:
        self.calls.append("offsets")

    async def commit_transaction(self) -> None:
        self.calls.append("commit")
        await asyncio.Event().wait()  # no verdict, ever

    async def abort_transaction(self) -> None:
        self.calls.append("abort")

    async def begin_transaction(self) -> None:
        self.calls.append("begin")


class StubSink:
    def __init__(self, producer: HangingProducer) -> None:
        self.producer = producer
        self.stopped = False

    async def stop(self) -> None:
        self.stopped = True


def transactional_sink() -> TransactionalSink:
    """A transactional sink with a 200 ms send deadline; its partitions' sinks are stubbed."""
    return TransactionalSink(
        KafkaClientSettings(bootstrap="127.0.0.1:1"),
        SinkSettings(send_timeout_ms=200),
        default_topic="replies",
        group_id="g",
    )


async def test_a_commit_without_a_verdict_closes_the_producer_within_the_send_deadline() -> None:
    sinks = transactional_sink()
    tp = ("requests", 0)
    producer = HangingProducer()
    stub = StubSink(producer)
    sinks._sinks[tp] = stub  # type: ignore[assignment]
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(TransactionError, match="outcome unknown") as caught:
        await sinks.commit({tp: 10}, {tp: ""})
    assert loop.time() - started < 2.0
    assert caught.value.committed == {}
    assert caught.value.failed == {tp: "unknown_outcome"} and caught.value.recoverable
    assert producer.calls == ["offsets", "commit", "abort"]  # never begun again
    assert stub.stopped and tp not in sinks.open_partitions


class StuckSink(StubSink):
    """A sink whose producer's stop waits for a broker that never answers."""

    abandoned = False

    async def stop(self) -> None:
        await asyncio.Event().wait()

    async def abandon(self) -> None:
        self.abandoned = True


async def test_a_producer_that_does_not_stop_in_time_is_abandoned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # aiokafka's stop waits for every batch it holds: with the broker frozen, closing the
    # failed partition's producer held the rewind (and the member's loop) for as long.
    import consumer.kafka.transactions as transactions

    monkeypatch.setattr(transactions, "CLOSE_TIMEOUT_S", 0.05)
    sinks = transactional_sink()
    tp = ("requests", 0)
    stuck = StuckSink(HangingProducer())
    sinks._sinks[tp] = stuck  # type: ignore[assignment]
    await asyncio.wait_for(sinks.close(tp), 2.0)
    assert stuck.abandoned and tp not in sinks.open_partitions


class FencedProducer(HangingProducer):
    """A producer fenced by a newer one: aiokafka keeps the fence on its transaction's end
    waiter and answers the commit with ``IllegalOperation``."""

    def __init__(self) -> None:
        super().__init__()
        self._txn_manager = _TxnManager(ProducerFenced())

    async def send_offsets_to_transaction(self, offsets: Any, group_id: str) -> None:
        raise IllegalOperation("Not in the middle of a transaction")


async def test_a_commit_refused_after_a_fence_is_reported_fenced() -> None:
    # The serve then stops (another member owns the partition) instead of re-opening the
    # transactional id, which would fence the partition's new owner in turn.
    sinks = transactional_sink()
    tp = ("requests", 0)
    sinks._sinks[tp] = StubSink(FencedProducer())  # type: ignore[assignment]
    with pytest.raises(TransactionError) as caught:
        await sinks.commit({tp: 10}, {tp: ""})
    assert caught.value.failed == {tp: FENCED} and not caught.value.recoverable
