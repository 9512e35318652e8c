"""``--exactly-once``: which replies belong to which transaction, and the commit that ends one.

Each input partition's replies and dead letters go into that partition's open Kafka
transaction (:class:`consumer.kafka.transactions.TransactionalSink`); a commit must put into it
exactly the records whose offsets it commits. :class:`IntervalGate` (pure, no I/O) decides
that, per input partition:

* a record is *started* when delivery begins sending its reply or dead letter, and *finished*
  when its offset is finished in the tracker or given up (every send of it answered);
* :meth:`IntervalGate.close` (a commit begins): new records of the partition are *held*, not
  started; the started ones run to their end, second sends included (a dead letter's error
  reply), so none is cut in half by the commit;
* once no record of the partition is started, the tracker's committable offset and the
  offsets finished above it (kb1 commit metadata) name exactly the records whose sends are in
  the transaction: every started record finished, none was started after the close;
* :meth:`IntervalGate.reopen` (the commit ended): the held records start, in the next
  transaction.

:func:`commit_transactions` is that commit step; its one caller is
:class:`consumer.finish.checkpoint.TransactionalCheckpoint`, the commit half of serve and backfill
under ``--exactly-once`` (the Kafka side is :mod:`consumer.kafka.transactions`).

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

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Mapping
from typing import Generic, Protocol, TypeVar

from consumer.kafka.offset_metadata import Encoded
from consumer.kafka.records import TopicPartition

__all__ = ["QUIESCE_TIMEOUT_S", "IntervalGate", "TransactionsLike", "commit_transactions"]

QUIESCE_TIMEOUT_S = 5.0
"""At most this long a commit waits for a partition's started records (one broker round trip
normally; a partition still busy then is committed at the next interval)."""

T = TypeVar("T")


class IntervalGate(Generic[T]):
    """Per input partition: records started in its open transaction, records held while it
    commits (``T``: what the owner needs to start a held record later). Loop thread only."""

    def __init__(self) -> None:
        self._started: dict[TopicPartition, int] = {}
        self._closed: set[TopicPartition] = set()
        self._held: dict[TopicPartition, list[T]] = {}
        self._changed = asyncio.Event()

    def admit(self, tp: TopicPartition, item: T) -> bool:
        """True: ``item`` starts now (counted until :meth:`finished`); False: ``tp`` is
        committing and ``item`` is held until :meth:`reopen`."""
        if tp in self._closed:
            self._held.setdefault(tp, []).append(item)
            return False
        self._started[tp] = self._started.get(tp, 0) + 1
        return True

    def finished(self, tp: TopicPartition) -> None:
        """A started record of ``tp`` needs nothing more from delivery."""
        left = self._started.get(tp, 0) - 1
        if left > 0:
            self._started[tp] = left
            return
        self._started.pop(tp, None)
        if tp in self._closed:
            self._changed.set()

    def started(self, tp: TopicPartition) -> int:
        """Records of ``tp`` started and not finished."""
        return self._started.get(tp, 0)

    def close(self, tps: Iterable[TopicPartition]) -> None:
        """Hold new records of ``tps`` from now on."""
        self._closed.update(tps)

    async def quiet(
        self, tps: frozenset[TopicPartition], timeout_s: float
    ) -> frozenset[TopicPartition]:
        """Wait up to ``timeout_s`` seconds until no record of ``tps`` (closed) is started;
        returns those of ``tps`` that are quiet then."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + timeout_s
        while any(tp in self._started for tp in tps) and loop.time() < give_up:
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), give_up - loop.time())
        return frozenset(tp for tp in tps if tp not in self._started)

    def drop(self, tps: Iterable[TopicPartition]) -> list[T]:
        """Start records of ``tps`` again; returns the held ones, in order, never started
        (the partition moved to another member: they are not sent)."""
        out: list[T] = []
        for tp in tps:
            self._closed.discard(tp)
            out.extend(self._held.pop(tp, []))
        return out

    def reopen(self, tps: Iterable[TopicPartition]) -> list[T]:
        """Start records of ``tps`` again; returns the held ones, in order, now started."""
        out: list[T] = []
        for tp in tps:
            self._closed.discard(tp)
            held = self._held.pop(tp, [])
            if held:
                self._started[tp] = self._started.get(tp, 0) + len(held)
                out.extend(held)
        return out


class TransactionsLike(Protocol):
    """What a transactional commit needs of
    :class:`consumer.kafka.transactions.TransactionalSink`."""

    async def commit(
        self, offsets: Mapping[TopicPartition, int], metadata: Mapping[TopicPartition, str]
    ) -> dict[TopicPartition, int]: ...


class GateOwner(Protocol):
    """What :func:`commit_transactions` needs of :class:`consumer.finish.delivery.Delivery`."""

    async def quiesce(
        self, tps: frozenset[TopicPartition], timeout_s: float
    ) -> frozenset[TopicPartition]: ...
    def reopen(self, tps: frozenset[TopicPartition]) -> None: ...


async def commit_transactions(
    delivery: GateOwner,
    transactions: TransactionsLike,
    tps: frozenset[TopicPartition],
    offsets_now: Callable[[], Mapping[TopicPartition, int]],
    metadata_of: Callable[[Mapping[TopicPartition, int]], Mapping[TopicPartition, Encoded]],
    timeout_s: float = QUIESCE_TIMEOUT_S,
) -> tuple[dict[TopicPartition, int], int]:
    """End the open transaction of each of ``tps``: hold their new records, wait for the started
    ones, take the offsets to commit (``offsets_now()``, asked only then) and their metadata
    (``metadata_of``), commit them with the records' sends, start the held records.

    A partition still busy after ``timeout_s``, or whose metadata was cut to fit (truncated:
    the offsets left out would be computed again after a crash although their replies are
    committed), is left for the next interval. Returns the offsets committed and how many
    partitions were left out for truncated metadata.

    Raises:
        TransactionError: from ``transactions.commit`` (``err.committed`` names what was).
    """
    try:
        quiet = await delivery.quiesce(tps, timeout_s)
        offsets = {tp: off for tp, off in offsets_now().items() if tp in quiet}
        metadata = metadata_of(offsets)
        truncated = {tp for tp, m in metadata.items() if m.truncated}
        offsets = {tp: off for tp, off in offsets.items() if tp not in truncated}
        if not offsets:
            return {}, len(truncated)
        texts = {tp: metadata[tp].text for tp in offsets}
        return await transactions.commit(offsets, texts), len(truncated)
    finally:
        delivery.reopen(tps)
