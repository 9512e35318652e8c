"""Which revoked partitions an assignment gives back unchanged (consumer.serve.handover), and the
tracker's suspended state that carries them (OffsetTracker.suspend/resume)."""

from __future__ import annotations

from consumer.kafka.offsets import OffsetTracker
from consumer.kafka.records import Membership, TopicPartition
from consumer.serve.handover import NO_MEMBERSHIP, handover

A: TopicPartition = ("t", 0)
B: TopicPartition = ("t", 1)
C: TopicPartition = ("t", 2)


def test_the_next_generation_of_the_same_member_keeps_what_it_gets_back() -> None:
    plan = handover(frozenset({A, B}), frozenset({A, C}), Membership("m", 4), Membership("m", 5))
    assert (plan.kept, plan.moved, plan.new) == ({A}, {B}, {C})


def test_any_break_in_the_membership_moves_everything() -> None:
    suspended, assigned = frozenset({A, B}), frozenset({A, B})
    for before, after in [
        (Membership("m", 4), Membership("m", 6)),  # a round completed without this member
        (Membership("m", 4), Membership("n", 5)),  # dropped and rejoined with a new id
        (NO_MEMBERSHIP, Membership("m", 1)),  # the revoke came after losing the membership
        (Membership("m", 4), Membership("m", 4)),
    ]:
        plan = handover(suspended, assigned, before, after)
        assert (plan.kept, plan.moved, plan.new) == (set(), {A, B}, {A, B})


def test_a_suspended_partition_completes_but_is_not_committed_until_resumed() -> None:
    tracker = OffsetTracker()
    generation = tracker.assign(A)
    tracker.track(A, 7)
    tracker.suspend(A)
    assert tracker.assigned == frozenset() and tracker.suspended == {A}
    assert tracker.generation(A) is None  # intake takes nothing of it meanwhile
    assert tracker.complete(A, 7, generation)
    assert tracker.committable() == {}
    assert tracker.resume(A) and tracker.last_tracked(A) == 7
    assert tracker.committable() == {A: 8}
    tracker.suspend(A)
    tracker.revoke(A)
    assert not tracker.resume(A)
