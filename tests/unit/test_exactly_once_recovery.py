"""``--exactly-once``: a transaction that fails without a fence (an unknown outcome, a send
without a verdict, an abort) no longer stops serve: the partition is rewound
to its committed offset with a new producer and computed again, as Kafka Streams treats a
corrupted task. A fenced producer still stops it. Fakes only, no broker."""

from __future__ import annotations

import asyncio

import msgpack
import pytest

from consumer.batching.types import ItemOutcome
from consumer.kafka.errors import FENCED, SinkClosedError, TransactionError
from consumer.kafka.records import InRecord, TopicPartition
from consumer.serve.pipeline import Pipeline
from schemas.codec import decode_reply
from tests.fakes import FakeEngine, FakeTransactions
from tests.unit.test_exactly_once import RecordingSource, eos_pipeline

A: TopicPartition = ("req", 0)


def request(offset: int) -> InRecord:
    body = msgpack.packb({"text": f"text {offset}"})
    return InRecord(A[0], A[1], offset, b"key-%d" % offset, body, (), 0)


def answer(pipeline: Pipeline, engine: FakeEngine) -> None:
    """Answer every item the engine holds ``ok``, then forget them."""
    pipeline.on_outcomes([
        ItemOutcome(
            item_id=it.item_id, status="ok", result={"embedding": [1.0, 0.0], "dim": 2},
            error_code=None, error_message=None, truncated=False, n_tokens=4, queue_ms=1.0,
            infer_ms=2.0, batch_size=1, padded_len=4,
        )
        for it in engine.items
    ])  # fmt: skip
    engine.items.clear()


async def until(condition: object, timeout_s: float = 2.0) -> None:
    """Let the loop run until ``condition()`` holds (fails after ``timeout_s`` seconds)."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + timeout_s
    while not condition():  # type: ignore[operator]
        assert loop.time() < give_up, "condition not met in time"
        await asyncio.sleep(0)


async def answered_and_acknowledged(
    pipeline: Pipeline, engine: FakeEngine, txn: FakeTransactions, offsets: range
) -> None:
    """Take ``offsets`` of A, answer them, acknowledge every reply sent in A's transaction."""
    await pipeline.take([request(o) for o in offsets])
    answer(pipeline, engine)
    sink = txn.sinks[A]
    await until(lambda: len(sink.acks) >= len(offsets))
    for ack in sink.acks:
        if not ack.done():
            ack.set_result(None)
    await until(lambda: pipeline.tracker.pending(A) == 0)


def recoveries(pipeline: Pipeline, reason: str) -> float:
    value = pipeline._metrics.registry.get_sample_value(
        "kbatch_transaction_recoveries_total", {"reason": reason}
    )
    return value or 0.0


async def assigned() -> tuple[Pipeline, RecordingSource, FakeEngine, FakeTransactions]:
    txn = FakeTransactions()
    source = RecordingSource(txn)
    source.stored[A] = (5, "")  # the group's last transaction committed offset 5
    engine = FakeEngine()
    pipeline = eos_pipeline(txn, source, engine)
    await pipeline.on_assigned(frozenset({A}))
    return pipeline, source, engine, txn


async def test_an_unknown_outcome_rewinds_the_partition_with_a_new_producer() -> None:
    pipeline, source, engine, txn = await assigned()
    await answered_and_acknowledged(pipeline, engine, txn, range(5, 8))
    source.positions[A] = 8  # the client read on
    txn.fail, txn.reason = {A}, "unknown_outcome"
    await pipeline.commit()  # no TransactionError: the member stays up
    assert txn.events[-4:] == [("close", A), ("close", A), ("open", A), ("read", A)]
    assert source.positions[A] == 5 and A not in source.paused  # rewound, reading again
    assert pipeline.tracker.assigned == {A} and pipeline.tracker.pending(A) == 0
    assert engine.cancelled == [A]
    assert recoveries(pipeline, "unknown_outcome") == 1
    # The same records come again: computed again (not skipped, not answered from the dedup
    # cache of the aborted transaction), then committed in the new producer's transaction.
    txn.fail = set()
    await answered_and_acknowledged(pipeline, engine, txn, range(5, 8))
    assert len(txn.sinks[A].sent) == 3
    assert not any(decode_reply(r.value or b"").dedup for r in txn.sinks[A].sent)
    await pipeline.commit()
    assert txn.commits[-1][0] == {A: 8}


async def test_a_fenced_producer_still_stops_the_member() -> None:
    pipeline, _, engine, txn = await assigned()
    await answered_and_acknowledged(pipeline, engine, txn, range(5, 6))
    txn.fail, txn.reason = {A}, FENCED
    with pytest.raises(TransactionError):
        await pipeline.commit()
    assert recoveries(pipeline, FENCED) == 0


async def test_a_revoke_whose_transaction_fails_sets_the_partition_up_anew_when_kept() -> None:
    pipeline, source, engine, txn = await assigned()
    await answered_and_acknowledged(pipeline, engine, txn, range(5, 7))
    txn.fail, txn.reason = {A}, "unacknowledged_send"
    await pipeline.on_revoked(frozenset({A}))  # no rewind inside the rebalance
    assert txn.events[-1] == ("close", A) and pipeline.tracker.suspended == {A}
    txn.fail = set()
    source.generation += 1  # given back without a break: kept by the rule, but corrupted
    await pipeline.on_assigned(frozenset({A}))
    assert txn.events[-2:] == [("open", A), ("read", A)]  # a new producer, read back
    assert source.positions[A] == 5 and pipeline.tracker.last_tracked(A) is None
    assert recoveries(pipeline, "unacknowledged_send") == 1


async def test_a_failed_producer_whose_records_all_failed_is_rewound_at_the_next_commit() -> None:
    # Its sends fail (SinkClosedError: the records stay unfinished), so the partition's
    # offset never moves and no commit would name it: without close_failed it stalled.
    pipeline, source, engine, txn = await assigned()
    await pipeline.take([request(o) for o in range(5, 8)])
    answer(pipeline, engine)
    sink = txn.sinks[A]
    await until(lambda: len(sink.acks) >= 3)
    for ack in sink.acks:
        ack.set_exception(SinkClosedError("the producer of ('req', 0) failed"))
    txn.broken = {A}
    await pipeline.commit()  # no TransactionError: the member stays up
    assert txn.commits == []  # nothing finished: nothing to commit
    assert txn.events[-3:] == [("close", A), ("open", A), ("read", A)]
    assert source.positions[A] == 5 and A not in source.paused  # rewound, reading again
    assert recoveries(pipeline, "aborted") == 1


async def test_a_fenced_producer_found_without_a_commit_stops_the_member() -> None:
    pipeline, _, _, txn = await assigned()
    txn.broken, txn.reason = {A}, FENCED
    with pytest.raises(TransactionError):
        await pipeline.commit()
    assert ("close", A) in txn.events
