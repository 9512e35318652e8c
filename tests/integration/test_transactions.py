""":class:`TransactionalSink` on the real broker: a commit makes replies, offset and kb1 metadata
visible together; a new owner of the partition fences the old one; a close aborts; a producer
whose sender died on the coordinator's ``INVALID_TXN_STATE`` closes its partition, however it
is met (a send, a commit, a close)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka import TopicPartition as KafkaTP
from aiokafka.errors import InvalidTxnState, KafkaError

from consumer.kafka.config import KafkaClientSettings, SinkSettings
from consumer.kafka.errors import SinkClosedError, TransactionError
from consumer.kafka.transactions import TransactionalSink
from schemas.records import OutRecord
from tests.conftest import TopicFactory, unique_group
from tests.integration.harness import committed_offsets, read_committed

pytestmark = pytest.mark.integration


def sink(bootstrap: str, out: str, group: str) -> TransactionalSink:
    return TransactionalSink(
        KafkaClientSettings(bootstrap=bootstrap),
        SinkSettings(),
        default_topic=out,
        group_id=group,
        id_prefix="test",
    )


def replies(*values: bytes) -> list[OutRecord]:
    return [OutRecord(topic=None, partition=None, key=v, value=v, headers=[]) for v in values]


async def test_commit_fence_and_abort(kafka_bootstrap: str, new_topic: TopicFactory) -> None:
    src, out = await new_topic("txn-src"), await new_topic("txn-out")
    group = unique_group("txn")
    tp = (src, 0)
    old = sink(kafka_bootstrap, out, group)
    await old.open(tp)
    try:
        for ack in await old.send_from(tp, replies(b"a", b"b")):
            await ack
        assert await old.commit({tp: 2}, {tp: "kb1:x"}) == {tp: 2}
        for ack in await old.send_from(tp, replies(b"zombie")):
            await ack  # written, in a transaction that never commits
        new = sink(kafka_bootstrap, out, group)
        await new.open(tp)  # the partition's next owner: fences the old producer
        try:
            with pytest.raises(TransactionError) as caught:
                await old.commit({tp: 3}, {tp: ""})
            assert caught.value.committed == {}
            assert tp not in old.open_partitions
            for ack in await new.send_from(tp, replies(b"c")):
                await ack
            await new.commit({tp: 3}, {tp: ""})
            for ack in await new.send_from(tp, replies(b"aborted")):
                await ack
            await new.close(tp)  # what was sent since the last commit is aborted
        finally:
            await new.stop()
    finally:
        await old.stop()
    seen = [r.key for r in await read_committed(kafka_bootstrap, out, 1, decode=False)]
    assert seen == [b"a", b"b", b"c"]
    assert await committed_offsets(kafka_bootstrap, group, src, 1) == {0: 3}


def pretend_a_partition_was_added(sinks: TransactionalSink, tp: tuple[str, int], out: str) -> Any:
    """Make ``tp``'s open transaction non-empty on the client only: its ``EndTxn`` then finds
    the transaction empty on the coordinator, which answers ``INVALID_TXN_STATE`` — what a
    coordinator that moved can answer. aiokafka's sender task dies on it (its transactions in
    the fatal state); the producer is returned."""
    producer = sinks._sinks[tp].producer
    producer._txn_manager._txn_partitions.add(KafkaTP(out, 0))
    return producer


async def end_txn_in_flight(producer: Any) -> None:
    """Until a request of ``producer``'s waits for its answer (the ``EndTxn`` just asked)."""
    async with asyncio.timeout(10.0):
        while not any(conn._requests for conn in producer.client._conns.values()):
            await asyncio.sleep(0)


async def test_a_producer_whose_sender_died_fails_its_sends_closed_and_its_commit(
    kafka_bootstrap: str, new_topic: TopicFactory
) -> None:
    src, out = await new_topic("txn-fatal-src"), await new_topic("txn-fatal-out")
    group = unique_group("txn-fatal")
    tp = (src, 0)
    sinks = sink(kafka_bootstrap, out, group)
    await sinks.open(tp)
    try:
        producer = pretend_a_partition_was_added(sinks, tp, out)
        with pytest.raises(KafkaError) as died:
            await producer.commit_transaction()
        assert isinstance(died.value.__cause__, InvalidTxnState)  # the broker's answer
        # Before: DeliveryError, which dead-letters a request whose reply was fine.
        (ack,) = await sinks.send_from(tp, replies(b"lost"))
        with pytest.raises(SinkClosedError):
            await ack
        with pytest.raises(TransactionError) as caught:
            await sinks.commit({tp: 1}, {tp: ""})
        assert caught.value.recoverable and tp not in sinks.open_partitions
        await sinks.open(tp)  # a new producer for the partition
        for ack in await sinks.send_from(tp, replies(b"b")):
            await ack
        assert await sinks.commit({tp: 1}, {tp: ""}) == {tp: 1}
    finally:
        await sinks.stop()
    seen = [r.key for r in await read_committed(kafka_bootstrap, out, 1, decode=False)]
    assert seen == [b"b"]


async def test_a_close_while_end_txn_is_in_flight_does_not_raise_its_answer(
    kafka_bootstrap: str, new_topic: TopicFactory
) -> None:
    # aiokafka's stop cancels its sender, which awaits the EndTxn in flight and raises its
    # InvalidTxnState from stop: before, out of close (a revoke, a rewind, the drain).
    src, out = await new_topic("txn-stop-src"), await new_topic("txn-stop-out")
    group = unique_group("txn-stop")
    tp = (src, 0)
    sinks = sink(kafka_bootstrap, out, group)
    await sinks.open(tp)
    try:
        producer = pretend_a_partition_was_added(sinks, tp, out)
        commit = asyncio.ensure_future(producer.commit_transaction())
        await end_txn_in_flight(producer)
        await asyncio.wait_for(sinks.close(tp), 15.0)
        assert tp not in sinks.open_partitions
        with pytest.raises((KafkaError, InvalidTxnState)):
            await commit
        await sinks.open(tp)
        for ack in await sinks.send_from(tp, replies(b"b")):
            await ack
        assert await sinks.commit({tp: 1}, {tp: ""}) == {tp: 1}
    finally:
        await sinks.stop()
    assert await committed_offsets(kafka_bootstrap, group, src, 1) == {0: 1}
