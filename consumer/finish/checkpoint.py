"""The commit half of ``kbatch serve`` and ``kbatch backfill``: one checkpoint per process.

A checkpoint owns what a commit needs beyond the offset tracker: when offsets are committed
with their kb1 metadata, how (plain group commit, or each input partition's Kafka
transaction), the lag base of each partition and, in serve, the read-back of the committed
offset at assignment. It is chosen once, at start-up (:func:`checkpoint_for`), as
quix-streams chooses its ``Checkpoint``; the pipeline and the backfill job never ask which
delivery mode runs.

::

    DeliveryMode             set up once per process (:meth:`DeliveryMode.build`): the sink
                             (the transactional one under ``--exactly-once``); read_back:
                             open the partitions' producers, then read the committed offsets
    PlainCheckpoint          commit: offsets_now() → kb1 metadata → source commit
                             (a retriable failure: logged, retried at the next interval)
    TransactionalCheckpoint  commit: hold new sends of each partition, wait for started ones,
                             offsets_now() → kb1 metadata → send_offsets_to_transaction →
                             commit_transaction
                             (:func:`consumer.finish.exactly_once.commit_transactions`);
                             assign: open the partition's producer (fences the previous owner)
                             before reading its committed offset, then seek there;
                             revoke: abort what is open

Both await the owner's ``before_commit`` hook with the offsets just before committing them,
then record what was committed in the tracker (:meth:`OffsetTracker.mark_committed`)
and as the lag base. The rules come from CONTRACT.md §Delivery and docs/operations.md
(``--exactly-once``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from consumer.finish.delivery import SinkLike, SourcedSinkLike
from consumer.finish.exactly_once import (
    BeforeCommit,
    GateOwner,
    TransactionsLike,
    commit_transactions,
)
from consumer.kafka.config import KafkaClientSettings, SinkSettings
from consumer.kafka.errors import CommitError, RangeSourceError, TransactionError
from consumer.kafka.offset_metadata import read_completed
from consumer.kafka.offsets import OffsetTracker
from consumer.kafka.records import TopicPartition
from consumer.kafka.transport import reply_sink, transactional_sink

__all__ = [
    "Checkpoint",
    "Committed",
    "DeliveryMode",
    "PlainCheckpoint",
    "ProducerSink",
    "TransactionalCheckpoint",
    "TransactionalSinkLike",
    "checkpoint_for",
]

log = logging.getLogger(__name__)

Offsets = Mapping[TopicPartition, int]
OffsetsNow = Callable[[], Offsets]
"""The offsets to commit now (next offset to read, per input partition); asked at the moment
of the commit (for a transaction: once its partitions are quiet)."""
CommitOffsets = Callable[[Offsets, Mapping[TopicPartition, str]], Awaitable[None]]
"""A plain group commit: offsets and their metadata text, per partition."""
T = TypeVar("T")


class TransactionalSinkLike(TransactionsLike, SourcedSinkLike, Protocol):
    """``--exactly-once``: a :class:`consumer.kafka.transport.TransactionalReplySink`."""

    async def open(self, tp: TopicPartition, timeout_s: float | None = None) -> None: ...
    async def close(self, tp: TopicPartition) -> None: ...
    async def close_failed(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, str]: ...


class ProducerSink(SinkLike, Protocol):
    """The sink of a delivery mode: a :class:`consumer.kafka.transport.ReplySink` or a
    :class:`consumer.kafka.transport.TransactionalReplySink`."""

    async def start(self) -> None: ...
    async def stop(self) -> None: ...


class CommittedReader(Protocol):
    """What the read-back at assignment needs of :class:`consumer.kafka.source.KafkaSource`."""

    async def committed_metadata(self, tp: TopicPartition) -> tuple[int | None, str]: ...
    def seek(self, tp: TopicPartition, offset: int) -> None: ...


@dataclass(frozen=True, slots=True)
class Committed:
    """What one :meth:`Checkpoint.commit` did.

    Attributes:
        offsets: the offsets committed (empty: nothing to commit, or the commit failed).
        truncated: partitions whose kb1 metadata was cut to fit ``offset.metadata.max.bytes``
            (plain: committed with the cut metadata; transactional: left for the next interval).
        elapsed_s: seconds the commit took (monotonic).
        ok: False when a plain commit failed (retried at the next interval).
    """

    offsets: dict[TopicPartition, int]
    truncated: int = 0
    elapsed_s: float = 0.0
    ok: bool = True


@dataclass(eq=False)
class Checkpoint:
    """Commit cadence, kb1 metadata, lag base, read-back: the part both modes share.

    Attributes:
        tracker: the owner's offset tracker.
        offsets_now: the offsets to commit now (serve: ``tracker.committable``; backfill adds
            each finished partition's end offset).
        commit_interval_s: seconds between two commits of :meth:`due`.
        clock: monotonic seconds.
        before_commit: awaited with the offsets just before each commit that has some.
    """

    tracker: OffsetTracker
    offsets_now: OffsetsNow
    commit_interval_s: float
    clock: Callable[[], float] = time.monotonic
    before_commit: BeforeCommit | None = None

    def __post_init__(self) -> None:
        self._next_commit_s = self.clock() + self.commit_interval_s
        # The lag base per partition: the last committed offset, or before the first commit
        # the first offset this member took.
        self._base: dict[TopicPartition, int] = {}

    # ---- cadence --------------------------------------------------------------------------------

    def due(self) -> bool:
        """True once the commit interval has passed since start or the last :meth:`committed`."""
        return self.clock() >= self._next_commit_s

    def seconds_to_due(self) -> float:
        """Seconds until :meth:`due` (0 when due)."""
        return max(0.0, self._next_commit_s - self.clock())

    def restart_interval(self) -> None:
        """The interval counts again from now (after an interval's commit)."""
        self._next_commit_s = self.clock() + self.commit_interval_s

    # ---- the lag base ---------------------------------------------------------------------------

    def took(self, tp: TopicPartition, offset: int) -> None:
        """A record was taken: before the first commit, lag counts from the first one."""
        self._base.setdefault(tp, offset)

    def lag_base(self, tp: TopicPartition) -> int | None:
        """The offset ``tp``'s lag counts from; None before anything was taken or read back."""
        return self._base.get(tp)

    # ---- commit ---------------------------------------------------------------------------------

    async def commit(self, only: frozenset[TopicPartition] | None = None) -> Committed:
        """Commit every partition's safe offset (those in ``only`` when given) with its kb1
        metadata; the tracker and the lag base then know what was committed.

        Raises:
            TransactionError: transactional, a transaction could not be committed; what was
                committed is recorded first, and the failed partitions' producers are closed
                (serve rewinds them unless fenced:
                :meth:`consumer.serve.rebalance.Rebalancer.commit`; backfill stops).
        """
        raise NotImplementedError

    def _committed(self, offsets: Offsets) -> None:
        self.tracker.mark_committed(offsets)
        self._base.update(offsets)

    # ---- assignment -----------------------------------------------------------------------------

    async def assign(
        self, tp: TopicPartition, source: CommittedReader, timeout_s: float | None = None
    ) -> None:
        """Read back ``tp``'s committed offset and kb1 metadata (the tracker assigned it
        already): the lag base, and the offsets answered above it that intake skips.
        ``timeout_s``: see :meth:`TransactionalCheckpoint.assign`."""
        await self._read_back(tp, source)

    async def _read_back(self, tp: TopicPartition, source: CommittedReader) -> int | None:
        committed, metadata = await source.committed_metadata(tp)
        if committed is not None:
            self._base[tp] = committed
            self.tracker.add_completed(tp, read_completed(committed, metadata, where=tp))
        return committed

    async def revoke(self, tp: TopicPartition) -> None:
        """Forget ``tp`` (the tracker revokes it itself)."""
        self._base.pop(tp, None)


@dataclass(eq=False)
class PlainCheckpoint(Checkpoint):
    """Offsets and kb1 metadata in a plain group commit (``commit_offsets``: the source's
    ``commit``); a refused commit (:class:`CommitError` of serve's source,
    :class:`RangeSourceError` of backfill's) is logged and retried at the next interval."""

    commit_offsets: CommitOffsets = field(kw_only=True)

    async def commit(self, only: frozenset[TopicPartition] | None = None) -> Committed:
        offsets = dict(self.offsets_now())
        if only is not None:
            offsets = {tp: off for tp, off in offsets.items() if tp in only}
        if not offsets:
            return Committed({})
        started = self.clock()
        metadata = self.tracker.commit_metadata(offsets)
        if self.before_commit is not None:
            await self.before_commit(offsets)
        try:
            await self.commit_offsets(offsets, {tp: m.text for tp, m in metadata.items()})
        except (CommitError, RangeSourceError) as err:
            log.warning("commit failed (retried at the next interval): %s", err)
            return Committed({}, ok=False)
        self._committed(offsets)
        truncated = sum(m.truncated for m in metadata.values())
        return Committed(offsets, truncated, self.clock() - started)


@dataclass(eq=False)
class TransactionalCheckpoint(Checkpoint):
    """``--exactly-once``: each input partition's replies and offsets in its own Kafka
    transaction (:mod:`consumer.finish.exactly_once`, :mod:`consumer.kafka.transactions`); one
    commit at a time.

    Attributes:
        transactions: the transactional sink the replies are sent through.
        gate: the delivery whose interval gate bounds each transaction.
    """

    transactions: TransactionalSinkLike = field(kw_only=True)
    gate: GateOwner = field(kw_only=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._lock = asyncio.Lock()

    async def commit(self, only: frozenset[TopicPartition] | None = None) -> Committed:
        async with self._lock:
            assigned = self.tracker.assigned
            tps = assigned if only is None else only & assigned
            started = self.clock()
            committed: dict[TopicPartition, int] = {}
            try:
                committed, truncated = await commit_transactions(
                    self.gate,
                    self.transactions,
                    tps,
                    self.offsets_now,
                    self.tracker.commit_metadata,
                    before_commit=self.before_commit,
                )
                # A partition whose producer failed finishes nothing more (each send of it
                # fails), so no commit names it: closed and reported here.
                failed = await self.transactions.close_failed(tps)
                if failed:
                    raise TransactionError(
                        f"transaction of {sorted(failed)} not committed: its producer failed",
                        committed,
                        failed,
                    )
            except TransactionError as err:
                committed = err.committed
                raise
            finally:
                self._committed(committed)
            elapsed_s = self.clock() - started if committed else 0.0
            return Committed(committed, truncated, elapsed_s)

    async def assign(
        self, tp: TopicPartition, source: CommittedReader, timeout_s: float | None = None
    ) -> None:
        """Open ``tp``'s producer first (fencing the previous owner and aborting its open
        transaction), then read back; start at the committed offset: the client fetched its
        start offset on its own, maybe while the previous owner's last transaction was still
        completing.

        Raises:
            KafkaUnavailableError: the producer did not start (within ``timeout_s`` seconds
                when given: a rewind, :meth:`consumer.serve.rebalance.Rebalancer.commit`).
        """
        await self.transactions.open(tp, timeout_s)
        committed = await self._read_back(tp, source)
        if committed is not None:
            source.seek(tp, committed)

    async def revoke(self, tp: TopicPartition) -> None:
        """What was not committed is aborted."""
        await super().revoke(tp)
        await self.transactions.close(tp)


def checkpoint_for(
    transactions: TransactionalSinkLike | None,
    *,
    tracker: OffsetTracker,
    offsets_now: OffsetsNow,
    commit_interval_s: float,
    commit_offsets: CommitOffsets,
    gate: GateOwner,
    clock: Callable[[], float] = time.monotonic,
    before_commit: BeforeCommit | None = None,
) -> Checkpoint:
    """The checkpoint of the delivery mode, chosen once: transactional when ``transactions``
    is given (``--exactly-once``: through ``gate``, the delivery), else plain
    (``commit_offsets``); both await ``before_commit`` just before committing."""
    common = (tracker, offsets_now, commit_interval_s, clock, before_commit)
    if transactions is None:
        return PlainCheckpoint(*common, commit_offsets=commit_offsets)
    return TransactionalCheckpoint(*common, transactions=transactions, gate=gate)


@dataclass(frozen=True, slots=True)
class DeliveryMode:
    """The delivery mode of one process (``kbatch serve``, ``kbatch backfill``, a job member),
    set up once by :meth:`build`: its owners take ``sink`` and ``transactions`` and build
    their delivery and checkpoint from them (:func:`checkpoint_for`).

    Attributes:
        sink: where replies go; the transactional sink itself under ``--exactly-once``.
        transactions: ``--exactly-once``: the sink, sending and committing per input
            partition; None: plain.
    """

    sink: ProducerSink
    transactions: TransactionalSinkLike | None = None

    @classmethod
    def build(
        cls,
        client: KafkaClientSettings,
        settings: SinkSettings,
        *,
        exactly_once: bool,
        default_topic: str,
        group_id: str,
        id_prefix: str = "kbatch",
    ) -> DeliveryMode:
        """A reply sink, or with ``exactly_once`` a transactional one (a
        producer per input partition, transactional ids ``<id_prefix>-<group_id>-…``)."""
        if not exactly_once:
            return cls(reply_sink(client, settings, default_topic=default_topic))
        transactions = transactional_sink(
            client, settings, default_topic=default_topic, group_id=group_id, id_prefix=id_prefix
        )
        return cls(transactions, transactions)

    async def read_back(self, tps: Iterable[TopicPartition], read: Callable[[], Awaitable[T]]) -> T:
        """Read the committed offsets of ``tps`` (``read()``: backfill's range, a job
        member's plan) once they are final: under ``--exactly-once`` each partition's producer
        is opened first, which fences its previous owner and completes or aborts that one's
        open transaction.

        Raises:
            KafkaUnavailableError: a producer did not start; what ``read`` raises.
        """
        if self.transactions is not None:
            for tp in tps:
                await self.transactions.open(tp)
        return await read()

    async def close_partitions(self) -> None:
        """``--exactly-once``: close every partition's producer, aborting what is open (a
        job member's revoke, after its commit); plain: nothing (the sink stays open)."""
        if self.transactions is not None:  # the sink: stop closes each open partition
            await self.sink.stop()
