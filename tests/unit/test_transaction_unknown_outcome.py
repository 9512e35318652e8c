"""A transaction commit without a verdict is an unknown outcome: the producer is closed, never
reused, and the caller learns it (TransactionError), within the send deadline."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from consumer.kafka.config import KafkaClientSettings, SinkSettings
from consumer.kafka.errors import TransactionError
from consumer.kafka.transactions import TransactionalSink


class _TxnManager:
    def wait_for_transaction_end(self) -> None:
        return None


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


async def test_a_commit_without_a_verdict_closes_the_producer_within_the_send_deadline() -> None:
    sinks = TransactionalSink(
        KafkaClientSettings(bootstrap="127.0.0.1:1"),
        SinkSettings(send_timeout_ms=200),
        default_topic="replies",
        group_id="g",
    )
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
