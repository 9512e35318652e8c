"""``--exactly-once``: the commit that ends each input partition's open transaction.

Each input partition's replies and dead letters go into that partition's open Kafka
transaction (:class:`consumer.kafka.transactions.TransactionalSink`); a commit must put into it
exactly the records whose offsets it commits. Delivery's gate decides which those are
(:mod:`consumer.finish.gate`); :func:`commit_transactions` is the step that holds the
partitions' new records, waits for their started ones, commits, and lets the held ones go —
one :meth:`Delivery.holding <consumer.finish.delivery.Delivery.holding>` around the commit. Its
one caller is :class:`consumer.finish.checkpoint.TransactionalCheckpoint`, the commit half of
serve and backfill under ``--exactly-once``.

Why replies finished above the committed offset are committed with kb1 metadata rather than
held back until the offset passes them: holding them would hold every reply behind the
slowest record of its partition (one long text delays hundreds of replies by a whole batch)
and would still need a second transaction boundary rule; a commit whose metadata names them
makes a restart skip them (:meth:`consumer.kafka.offsets.OffsetTracker.skip_completed`) and
it is one atomic write with the replies. When the metadata would not fit
(``offset.metadata.max.bytes``) the partition is not committed in that interval (its
transaction stays open), so a committed reply is never computed again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Protocol

from consumer.kafka.offset_metadata import Encoded
from consumer.kafka.records import TopicPartition

__all__ = [
    "QUIESCE_TIMEOUT_S",
    "BeforeCommit",
    "GateOwner",
    "TransactionsLike",
    "commit_transactions",
]

QUIESCE_TIMEOUT_S = 5.0
"""At most this long a commit waits for a partition's started records (one broker round trip
normally; a partition still busy then is committed at the next interval)."""

BeforeCommit = Callable[[Mapping[TopicPartition, int]], Awaitable[None]]
"""Awaited with the offsets about to be committed, just before the commit (a job member
publishes its progress there: docs/JOBS.md)."""


class TransactionsLike(Protocol):
    """What a transactional commit needs of
    :class:`consumer.kafka.transactions.TransactionalSink`."""

    async def commit(
        self, offsets: Mapping[TopicPartition, int], metadata: Mapping[TopicPartition, str]
    ) -> dict[TopicPartition, int]: ...


class GateOwner(Protocol):
    """What :func:`commit_transactions` needs of :class:`consumer.finish.delivery.Delivery`."""

    def holding(
        self, tps: frozenset[TopicPartition], timeout_s: float
    ) -> AbstractAsyncContextManager[frozenset[TopicPartition]]: ...


async def commit_transactions(
    delivery: GateOwner,
    transactions: TransactionsLike,
    tps: frozenset[TopicPartition],
    offsets_now: Callable[[], Mapping[TopicPartition, int]],
    metadata_of: Callable[[Mapping[TopicPartition, int]], Mapping[TopicPartition, Encoded]],
    timeout_s: float = QUIESCE_TIMEOUT_S,
    before_commit: BeforeCommit | None = None,
) -> tuple[dict[TopicPartition, int], int]:
    """End the open transaction of each of ``tps``: hold their new records, wait for the started
    ones, take the offsets to commit (``offsets_now()``, asked only then) and their metadata
    (``metadata_of``), await ``before_commit``, commit them with the records' sends, start the
    held records (those this commit held: a revoke's hold stays).

    A partition still busy after ``timeout_s``, or whose metadata was cut to fit (truncated:
    the offsets left out would be computed again after a crash although their replies are
    committed), is left for the next interval. Returns the offsets committed and how many
    partitions were left out for truncated metadata.

    Raises:
        TransactionError: from ``transactions.commit`` (``err.committed`` names what was).
    """
    async with delivery.holding(tps, timeout_s) as quiet:
        offsets = {tp: off for tp, off in offsets_now().items() if tp in quiet}
        metadata = metadata_of(offsets)
        truncated = {tp for tp, m in metadata.items() if m.truncated}
        offsets = {tp: off for tp, off in offsets.items() if tp not in truncated}
        if not offsets:
            return {}, len(truncated)
        if before_commit is not None:
            await before_commit(offsets)
        texts = {tp: metadata[tp].text for tp in offsets}
        return await transactions.commit(offsets, texts), len(truncated)
