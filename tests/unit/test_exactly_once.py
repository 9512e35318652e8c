"""``--exactly-once`` logic with fakes: which replies belong to which transaction (the delivery
gate), the commit that ends a transaction, and the pipeline's use of them."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import pytest

from consumer.config import ServeSettings
from consumer.finish.delivery import Delivery
from consumer.finish.exactly_once import commit_transactions
from consumer.finish.gate import IntervalGate
from consumer.kafka.errors import TransactionError
from consumer.kafka.offset_metadata import Encoded, decode_completed
from consumer.kafka.offsets import OffsetTracker
from consumer.kafka.records import InRecord, TopicPartition
from consumer.replies.builder import ReplyBuilder
from consumer.serve.metrics import Metrics
from consumer.serve.pipeline import Pipeline
from schemas.errors import ErrorCode
from schemas.models import ModelInfo
from schemas.records import OutRecord
from tests.fakes import FakeEngine, FakeGate, FakeSink, FakeSource, FakeTransactions
from tests.unit.test_delivery import Item, Owner, reply, settle

A: TopicPartition = ("req", 0)
B: TopicPartition = ("req", 1)


# ---- the gate ---------------------------------------------------------------------------------


async def test_gate_holds_a_committing_partition_until_its_started_records_finish() -> None:
    gate: IntervalGate[str] = IntervalGate()
    assert gate.admit(A, "a0")
    gate.close([A])
    assert not gate.admit(A, "a1")  # held: belongs to the next transaction
    assert gate.admit(B, "b0")  # another partition is not held up
    assert await gate.quiet(frozenset({A}), 0.01) == frozenset()  # a0 still started
    gate.finished(A)
    assert await gate.quiet(frozenset({A}), 0.01) == frozenset({A})
    assert gate.reopen([A]) == ["a1"]
    assert gate.started(A) == 1  # a1 started now
    assert gate.admit(A, "a2")


async def test_gate_quiet_wakes_on_the_last_finish_not_on_its_timeout() -> None:
    gate: IntervalGate[str] = IntervalGate()
    gate.admit(A, "a0")
    gate.close([A])
    loop = asyncio.get_running_loop()
    loop.call_later(0.01, gate.finished, A)
    started = loop.time()
    assert await gate.quiet(frozenset({A}), 5.0) == frozenset({A})
    assert loop.time() - started < 1.0


# ---- delivery with a transactional sink -------------------------------------------------------


def make_delivery() -> tuple[Delivery[Item], OffsetTracker, Owner, FakeTransactions]:
    tracker, owner, txn = OffsetTracker(), Owner(), FakeTransactions()
    delivery: Delivery[Item] = Delivery(
        FakeSink(), tracker, owner, ReplyBuilder(ModelInfo(name="m"), "dead"), sourced=txn
    )
    for tp in (A, B):
        tracker.assign(tp)
    return delivery, tracker, owner, txn


def item(tracker: OffsetTracker, tp: TopicPartition, offset: int) -> Item:
    generation = tracker.track(tp, offset)
    return Item(InRecord(tp[0], tp[1], offset, b"k", b"v", (), 0), generation)


async def test_each_reply_goes_into_its_input_partitions_transaction() -> None:
    delivery, tracker, _, txn = make_delivery()
    a0, b0, a1 = item(tracker, A, 0), item(tracker, B, 0), item(tracker, A, 1)
    delivery.send([(a0, reply(0)), (b0, reply(1)), (a1, reply(2))])
    await settle()
    assert [r.value for r in txn.sinks[A].sent] == [b"0", b"2"]
    assert [r.value for r in txn.sinks[B].sent] == [b"1"]


async def test_a_commit_holds_new_replies_and_takes_only_the_finished_records() -> None:
    delivery, tracker, _, txn = make_delivery()
    a0, a1 = item(tracker, A, 0), item(tracker, A, 1)
    delivery.send([(a0, reply(0))])
    await settle()
    quiescing = asyncio.ensure_future(delivery.quiesce(frozenset({A}), 5.0))
    await settle()
    delivery.send([(a1, reply(1))])  # computed while A commits: the next transaction's
    await settle()
    assert len(txn.sinks[A].sent) == 1 and not quiescing.done()
    txn.sinks[A].acks[0].set_result(None)
    assert await quiescing == frozenset({A})
    assert tracker.committable() == {A: 1}  # a0 finished, a1 not started
    delivery.reopen(frozenset({A}))
    await settle()
    assert [r.value for r in txn.sinks[A].sent] == [b"0", b"1"]
    assert delivery.open == 1


async def test_a_commit_inside_a_revoke_reopens_only_what_it_closed() -> None:
    delivery, tracker, _, txn = make_delivery()
    a0, b0 = item(tracker, A, 0), item(tracker, B, 0)
    assert await delivery.quiesce(frozenset({A}), 5.0) == frozenset({A})  # the revoke's hold
    delivery.send([(a0, reply(0)), (b0, reply(1))])
    async with delivery.holding(frozenset({A, B}), 0.05) as quiet:  # the revoke's commit
        assert quiet == frozenset({A})  # b0 started before B was held
    await settle()
    assert A not in txn.sinks and [r.value for r in txn.sinks[B].sent] == [b"1"]
    delivery.reopen(frozenset({A}))  # the assignment keeps A: its held reply goes out
    await settle()
    assert [r.value for r in txn.sinks[A].sent] == [b"0"]


async def test_a_dead_letters_error_reply_is_in_the_same_transaction_as_the_dead_letter() -> None:
    delivery, tracker, owner, txn = make_delivery()
    a0 = item(tracker, A, 0)
    error = OutRecord(topic="out", partition=None, key=b"k", value=b"err", headers=())
    delivery.dead_letter(a0, reply(9), ErrorCode.INVALID_REQUEST, error)
    await settle()
    quiescing = asyncio.ensure_future(delivery.quiesce(frozenset({A}), 5.0))
    txn.sinks[A].acks[0].set_result(None)  # the dead letter
    await settle()
    assert [r.value for r in txn.sinks[A].sent] == [b"9", b"err"]  # second send not held
    assert not quiescing.done()
    txn.sinks[A].acks[1].set_result(None)
    assert await quiescing == frozenset({A})
    assert ("dead_lettered", 0, (ErrorCode.INVALID_REQUEST, True, True)) in owner.events
    assert tracker.committable() == {A: 1}


# ---- the commit -------------------------------------------------------------------------------


GateSpy = FakeGate


def metadata(truncated: set[TopicPartition]) -> object:
    def of(offsets: Mapping[TopicPartition, int]) -> dict[TopicPartition, Encoded]:
        return {tp: Encoded(f"m{tp[1]}", 1, tp in truncated) for tp in offsets}

    return of


async def test_commit_leaves_busy_and_truncated_partitions_for_the_next_interval() -> None:
    c: TopicPartition = ("req", 2)
    gate, txn = GateSpy(frozenset({A, B})), FakeTransactions()
    committed, truncated = await commit_transactions(
        gate,
        txn,
        frozenset({A, B, c}),
        lambda: {A: 5, B: 7, c: 9},
        metadata({B}),  # type: ignore[arg-type]
    )
    assert committed == {A: 5} and truncated == 1
    assert txn.commits == [({A: 5}, {A: "m0"})]
    assert gate.reopened == [frozenset({A, B, c})]


async def test_a_failed_transaction_raises_and_still_reopens_the_gate() -> None:
    gate, txn = GateSpy(frozenset({A, B})), FakeTransactions()
    txn.fail = {B}
    with pytest.raises(TransactionError) as caught:
        await commit_transactions(
            gate,
            txn,
            frozenset({A, B}),
            lambda: {A: 5, B: 7},
            metadata(set()),  # type: ignore[arg-type]
        )
    assert caught.value.committed == {A: 5}
    assert gate.reopened == [frozenset({A, B})]


# ---- the pipeline -----------------------------------------------------------------------------


class RecordingSource(FakeSource):
    """Notes which partitions were paused whenever a committed offset was read."""

    def __init__(self, txn: FakeTransactions | None = None) -> None:
        super().__init__()
        self.paused_at_read: list[frozenset[TopicPartition]] = []
        self.txn = txn

    async def committed_metadata(self, tp: TopicPartition) -> tuple[int | None, str]:
        self.paused_at_read.append(frozenset(self.paused))
        if self.txn is not None:
            self.txn.events.append(("read", tp))
        return await super().committed_metadata(tp)


def eos_pipeline(
    txn: FakeTransactions | None, source: FakeSource, engine: FakeEngine | None = None
) -> Pipeline:
    settings = ServeSettings(exactly_once=txn is not None)
    return Pipeline(
        settings,
        FakeSink(),
        ReplyBuilder(ModelInfo(name="fake"), settings.dead_letter_topic),
        Metrics(),
        source=lambda _: source,
        engine=engine or FakeEngine(),
        clock=lambda: 100.0,
        transactions=txn,
    )


async def test_assignment_takes_nothing_in_before_every_partition_is_set_up() -> None:
    source = RecordingSource()
    pipeline = eos_pipeline(None, source)
    await pipeline.on_assigned(frozenset({A, B}))
    # Both paused while each committed offset is read (a record polled then was dropped and
    # its offset passed: the old code read them one by one, unpaused) and resumed after.
    assert source.paused_at_read == [frozenset({A, B})] * 2
    assert source.paused == set()


async def test_exactly_once_opens_each_partitions_producer_before_reading_its_offset() -> None:
    txn = FakeTransactions()
    source = RecordingSource(txn)
    pipeline = eos_pipeline(txn, source)
    source.stored[A] = (40, "")
    source.positions[A] = 30  # the client's own fetch, before the last commit completed
    await pipeline.on_assigned(frozenset({A}))
    assert txn.events == [("open", A), ("read", A)]
    assert source.positions[A] == 40
    await pipeline.on_revoked(frozenset({A}))
    assert txn.events[-1] == ("read", A)  # kept open until the assignment is known
    source.generation += 1
    await pipeline.on_assigned(frozenset({A}))  # given back: the same producer goes on
    assert txn.events[-1] == ("read", A)
    await pipeline.on_revoked(frozenset({A}))
    source.generation += 1
    await pipeline.on_assigned(frozenset())  # moved: what is open is aborted
    assert txn.events[-1] == ("close", A)


async def test_exactly_once_commits_offsets_and_kb1_metadata_in_the_transaction() -> None:
    txn = FakeTransactions()
    source = RecordingSource(txn)
    pipeline = eos_pipeline(txn, source)
    await pipeline.on_assigned(frozenset({A}))
    for offset in range(3):
        pipeline.tracker.track(A, offset)
    pipeline.tracker.complete(A, 2, pipeline.tracker.generation(A) or 0)
    await pipeline.commit()
    assert source.commits == []  # never outside the transaction
    ((offsets, meta),) = txn.commits
    assert offsets == {A: 0}
    assert decode_completed(meta[A]) == (0, frozenset({2}))
    txn.fail = {A}
    pipeline.tracker.complete(A, 0, pipeline.tracker.generation(A) or 0)
    with pytest.raises(TransactionError):
        await pipeline.commit()


async def test_a_revoke_whose_commit_fails_still_suspends_its_partitions() -> None:
    txn = FakeTransactions()
    source = RecordingSource(txn)
    pipeline = eos_pipeline(txn, source)
    await pipeline.on_assigned(frozenset({A}))
    pipeline.tracker.track(A, 0)
    pipeline.tracker.complete(A, 0, pipeline.tracker.generation(A) or 0)
    txn.fail = {A}
    with pytest.raises(TransactionError):
        await pipeline.on_revoked(frozenset({A}))
    assert pipeline.tracker.suspended == {A}  # the assignment decides, not a stale state
    source.generation += 2  # not kept: set up anew from the committed offset
    await pipeline.on_assigned(frozenset({A}))
    assert pipeline.tracker.assigned == {A} and pipeline.tracker.last_tracked(A) is None
