"""Which revoked partitions an assignment gives back to the same member, unchanged.

Pure: no aiokafka, no I/O. aiokafka's rebalancing is eager: before every rejoin it revokes
all of a member's partitions (``on_partitions_revoked``), and after it assigns the new set
(``on_partitions_assigned``), which often holds most of the old one again. The pipeline keeps
the work of a revoked partition (queued, running, answered and not yet sent) until the new
assignment is known (:meth:`consumer.kafka.offsets.OffsetTracker.suspend`); this module says
which of it may go on.

Rule: a partition continues when the new assignment holds it **and** the member was in the
group without a break: the same member id, and the generation the revoke was made in plus
one (Kafka bumps the group generation once per completed rebalance). Then no other member
owned the partition in between — the rebalance that revoked it is the one that gave it back
— so nobody else committed its offsets or, under ``--exactly-once``, opened its transactional
producer (which would have fenced this member's). Anything else (the member was dropped
from the group and rejoined with a new id, or a join round completed without it) is treated
as a move: the work is dropped and the partition read again from its committed offset.
"""

from __future__ import annotations

from dataclasses import dataclass

from consumer.kafka.records import Membership, TopicPartition

__all__ = ["NO_MEMBERSHIP", "Handover", "Membership", "handover"]


NO_MEMBERSHIP = Membership("", -1)


@dataclass(frozen=True, slots=True)
class Handover:
    """What an assignment does with the suspended partitions.

    Attributes:
        kept: suspended and assigned again without a break: their work goes on.
        moved: suspended and not kept: their work is dropped (another member owns them, or
            may have owned them in between).
        new: assigned and not kept: set up from their committed offset.
    """

    kept: frozenset[TopicPartition]
    moved: frozenset[TopicPartition]
    new: frozenset[TopicPartition]


def handover(
    suspended: frozenset[TopicPartition],
    assigned: frozenset[TopicPartition],
    revoked_in: Membership,
    assigned_in: Membership,
) -> Handover:
    """Split ``suspended`` and ``assigned`` by the rule in the module docstring."""
    unbroken = (
        revoked_in.member_id != ""
        and revoked_in.member_id == assigned_in.member_id
        and revoked_in.generation >= 0
        and assigned_in.generation == revoked_in.generation + 1
    )
    kept = suspended & assigned if unbroken else frozenset()
    return Handover(kept=kept, moved=suspended - kept, new=assigned - kept)
