"""The checkpoint (consumer/finish/checkpoint.py): chosen once per delivery mode; cadence, kb1
metadata, lag base and read-back, with fakes and a fake clock (the pipeline's and the
backfill job's own tests cover it in their flows)."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from consumer.finish.checkpoint import (
    Checkpoint,
    PlainCheckpoint,
    TransactionalCheckpoint,
    checkpoint_for,
)
from consumer.kafka.errors import CommitError, TransactionError
from consumer.kafka.offset_metadata import decode_completed, encode_completed
from consumer.kafka.offsets import OffsetTracker
from consumer.kafka.records import TopicPartition
from tests.fakes import FakeClock, FakeGate, FakeSource, FakeTransactions

A: TopicPartition = ("t", 0)
B: TopicPartition = ("t", 1)


OpenGate = FakeGate  # delivery's gate with nothing in flight: every partition quiet


class Committer:
    """A plain group commit that fails while ``fail`` is set."""

    def __init__(self) -> None:
        self.commits: list[tuple[dict[TopicPartition, int], dict[TopicPartition, str]]] = []
        self.fail = False

    async def __call__(
        self, offsets: Mapping[TopicPartition, int], metadata: Mapping[TopicPartition, str]
    ) -> None:
        if self.fail:
            raise CommitError("coordinator moved")
        self.commits.append((dict(offsets), dict(metadata)))


def _tracker_with_gap() -> OffsetTracker:
    """Partition A: offsets 0..2 taken, 2 finished (commit 0, kb1 names 2)."""
    tracker = OffsetTracker()
    tracker.assign(A)
    for offset in range(3):
        generation = tracker.track(A, offset)
    tracker.complete(A, 2, generation)
    return tracker


def _make(
    transactions: FakeTransactions | None, tracker: OffsetTracker, clock: FakeClock
) -> tuple[Checkpoint, Committer, OpenGate]:
    committer, gate = Committer(), OpenGate()
    checkpoint = checkpoint_for(
        transactions,
        tracker=tracker,
        offsets_now=tracker.committable,
        commit_interval_s=1.0,
        commit_offsets=committer,
        gate=gate,
        clock=clock,
    )
    return checkpoint, committer, gate


def test_the_delivery_mode_picks_one_implementation_once() -> None:
    tracker, clock = OffsetTracker(), FakeClock()
    assert type(_make(None, tracker, clock)[0]) is PlainCheckpoint
    assert type(_make(FakeTransactions(), tracker, clock)[0]) is TransactionalCheckpoint


def test_a_commit_is_due_once_per_interval_on_the_monotonic_clock() -> None:
    clock = FakeClock()
    checkpoint, _, _ = _make(None, OffsetTracker(), clock)
    assert not checkpoint.due() and checkpoint.seconds_to_due() == 1.0
    clock.now_s += 1.0
    assert checkpoint.due() and checkpoint.seconds_to_due() == 0.0
    checkpoint.restart_interval()
    clock.now_s += 0.5
    assert not checkpoint.due() and checkpoint.seconds_to_due() == 0.5


async def test_plain_commits_offsets_with_kb1_metadata_and_moves_the_lag_base() -> None:
    tracker, clock = _tracker_with_gap(), FakeClock()
    checkpoint, committer, _ = _make(None, tracker, clock)
    checkpoint.took(A, 0)
    done = await checkpoint.commit()
    assert done.ok and done.offsets == {A: 0} and done.truncated == 0
    ((offsets, metadata),) = committer.commits
    assert offsets == {A: 0} and decode_completed(metadata[A]) == (0, frozenset({2}))
    assert tracker.committable() == {}  # marked committed
    assert checkpoint.lag_base(A) == 0


async def test_a_failed_plain_commit_is_retried_at_the_next_interval() -> None:
    tracker, clock = _tracker_with_gap(), FakeClock()
    checkpoint, committer, _ = _make(None, tracker, clock)
    committer.fail = True
    done = await checkpoint.commit()
    assert not done.ok and done.offsets == {}
    assert tracker.committable() == {A: 0}  # still to commit
    committer.fail = False
    assert (await checkpoint.commit()).offsets == {A: 0}


async def test_only_limits_a_plain_commit_to_those_partitions() -> None:
    tracker, clock = _tracker_with_gap(), FakeClock()
    tracker.assign(B)
    tracker.complete(B, 0, tracker.track(B, 0))
    checkpoint, committer, _ = _make(None, tracker, clock)
    assert (await checkpoint.commit(only=frozenset({B}))).offsets == {B: 1}
    assert committer.commits[0][0] == {B: 1}


async def test_transactional_commits_in_the_transaction_never_outside_it() -> None:
    tracker, clock, txn = _tracker_with_gap(), FakeClock(), FakeTransactions()
    checkpoint, committer, gate = _make(txn, tracker, clock)
    done = await checkpoint.commit()
    assert done.offsets == {A: 0} and committer.commits == []
    ((offsets, metadata),) = txn.commits
    assert offsets == {A: 0} and decode_completed(metadata[A]) == (0, frozenset({2}))
    assert gate.reopened == [frozenset({A})]
    assert checkpoint.lag_base(A) == 0


async def test_a_failed_transaction_raises_after_recording_what_was_committed() -> None:
    tracker, clock, txn = _tracker_with_gap(), FakeClock(), FakeTransactions()
    tracker.assign(B)
    tracker.complete(B, 0, tracker.track(B, 0))
    checkpoint, _, _ = _make(txn, tracker, clock)
    txn.fail = {A}
    with pytest.raises(TransactionError):
        await checkpoint.commit()
    assert checkpoint.lag_base(B) == 1 and checkpoint.lag_base(A) is None
    assert tracker.committable() == {A: 0}


async def test_read_back_sets_the_lag_base_and_the_offsets_to_skip() -> None:
    clock, source = FakeClock(), FakeSource()
    source.stored[A] = (5, encode_completed(5, [7]).text)
    for txn in (None, FakeTransactions()):
        tracker = OffsetTracker()
        tracker.assign(A)
        checkpoint, _, _ = _make(txn, tracker, clock)
        checkpoint.took(A, 9)  # not before the read-back: the committed offset wins
        await checkpoint.assign(A, source)
        assert checkpoint.lag_base(A) == 5
        assert tracker.skip_completed(A, 7)
        await checkpoint.revoke(A)
        assert checkpoint.lag_base(A) is None


async def test_transactional_assignment_fences_first_then_starts_at_the_commit() -> None:
    clock, source, txn = FakeClock(), FakeSource(), FakeTransactions()
    source.stored[A] = (40, "")
    source.positions[A] = 30  # the client's own fetch, before the last commit completed
    tracker = OffsetTracker()
    tracker.assign(A)
    checkpoint, _, _ = _make(txn, tracker, clock)
    await checkpoint.assign(A, source)
    assert txn.events == [("open", A)] and source.positions[A] == 40
    await checkpoint.revoke(A)
    assert txn.events[-1] == ("close", A)
