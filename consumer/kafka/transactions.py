"""``--exactly-once``: one transactional producer per assigned input partition.

::

    assign tp ─► open(tp): producer "<prefix>-<group>-<topic>-<partition>" starts
                 (InitProducerId: the previous owner's producer is fenced, its open
                 transaction aborted) ─► begin_transaction
    replies, dead letters of tp's records ─► send_from(tp, ...) ─► tp's open transaction
    every commit interval ─► commit({tp: offset}, {tp: kb1 metadata}):
                 send_offsets_to_transaction ─► commit_transaction ─► begin_transaction
    revoke tp ─► close(tp): abort what is open, stop the producer

Why a producer per input partition (Kafka Streams' "EOS alpha", KIP-98): zombie fencing needs
the broker to tell an old owner of a partition from the new one. aiokafka 0.14 sends
``TxnOffsetCommit`` version 0 only — ``transactional_id``, ``group_id``, producer id and epoch,
no consumer generation or member id — so the group-metadata fencing of KIP-447 (one producer
per consumer, fenced by the group generation) is not available. With a transactional id per
input partition, whoever owns the partition now starts its producer under the same id, which
bumps the epoch: the zombie's later sends and commits fail (``ProducerFenced``) and its open
transaction is aborted before the new owner reads the committed offset.

Which replies belong to which transaction (the delivery gate,
:class:`consumer.finish.delivery.Delivery` given ``sourced=``, driven by the transactional
checkpoint, :class:`consumer.finish.checkpoint.TransactionalCheckpoint`): while a partition commits,
new records of it are held; records already started finish (every send of theirs acknowledged,
their offset finished in the tracker); then the committable offset and its kb1 metadata (the
offsets finished above it, :mod:`consumer.kafka.offset_metadata`) are taken and committed in
the transaction that holds exactly those records' replies. A record's replies and its offset
are therefore in one transaction: after a crash a record is either committed with its reply
(below the offset, or named in the metadata and skipped) or neither is visible.

Errors: a transaction that cannot be committed — aborted, fenced, or without a verdict within
the send deadline (``--send-timeout-ms``: an unknown outcome) — raises :class:`TransactionError`
after its producer is closed, never to be reused, naming each failed partition's reason
(``err.failed``). The caller may :meth:`TransactionalSink.open` the partition again: the new
producer's ``InitProducerId`` bumps the epoch, which fences the old producer and completes or
aborts its open transaction before returning, so the committed offset read after it is final
(serve then computes the partition again from there; a fenced partition stops it instead:
another member owns it).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from aiokafka import AIOKafkaProducer
from aiokafka import TopicPartition as KafkaTP
from aiokafka.errors import (
    InvalidProducerEpoch,
    KafkaError,
    ProducerFenced,
    TransactionalIdAuthorizationFailed,
)

from consumer.kafka.config import KafkaClientSettings, SinkSettings
from consumer.kafka.errors import FENCED, KafkaUnavailableError, SinkClosedError, TransactionError
from consumer.kafka.records import TopicPartition
from consumer.kafka.sink import KafkaSink
from consumer.kafka.topic_operations import WriteVerdicts
from schemas.records import OutRecord

__all__ = ["TransactionalSink", "transactional_id"]

log = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 5.0
"""At most this long to abort a closing partition's open transaction (a zombie's is aborted
by the broker anyway when the next owner starts, or at ``transaction.timeout.ms``), and again
at most this long to stop its producer (one whose broker does not answer is abandoned: its
late sends carry the old epoch, which the next producer's start fenced)."""


def failure_reason(err: BaseException, producer: AIOKafkaProducer | None = None) -> str:
    """The :attr:`TransactionError.failed` reason of one partition's failed commit (``err``),
    its producer's fatal error first: once fenced, aiokafka's producer answers a commit with
    ``IllegalOperation`` ("not in the middle of a transaction"), the fence being kept on the
    transaction's end waiter."""
    fatal = (ProducerFenced, InvalidProducerEpoch, TransactionalIdAuthorizationFailed)
    if isinstance(err, fatal) or isinstance(_fatal_error(producer), fatal):
        return FENCED
    if isinstance(err, TimeoutError):
        return "unknown_outcome"
    if isinstance(err, SinkClosedError):
        return "unacknowledged_send"
    return "aborted"


def transactional_id(prefix: str, group_id: str, tp: TopicPartition) -> str:
    """The transactional id of input partition ``tp``'s producer:
    ``<prefix>-<group>-<topic>-<partition>`` (stable across restarts and owners: that is what
    fences a zombie)."""
    return f"{prefix}-{group_id}-{tp[0]}-{tp[1]}"


@dataclass(eq=False)
class TransactionalSink:
    """Replies and offsets of each input partition in its own Kafka transactions.

    Attributes:
        client: the brokers and security.
        settings: the delivery deadline of one send.
        default_topic: where a record without a topic goes.
        group_id: the consumer group whose offsets the transactions commit.
        id_prefix: first part of every transactional id (:func:`transactional_id`).
    """

    client: KafkaClientSettings
    settings: SinkSettings
    default_topic: str = field(kw_only=True)
    group_id: str = field(kw_only=True)
    id_prefix: str = field(default="kbatch", kw_only=True)

    def __post_init__(self) -> None:
        self._sinks: dict[TopicPartition, KafkaSink] = {}
        self._write_verdicts = WriteVerdicts()  # denied topics stay out of transactions
        # Partitions with a send that failed without a verdict (maybe written): their open
        # transaction must not commit.
        self._tainted: set[TopicPartition] = set()

    @property
    def open_partitions(self) -> frozenset[TopicPartition]:
        """Input partitions with a producer and an open transaction."""
        return frozenset(self._sinks)

    async def start(self) -> None:
        """Nothing to connect before the first partition is assigned (see :meth:`open`)."""

    async def stop(self) -> None:
        """Close every partition (:meth:`close`); idempotent."""
        await asyncio.gather(*(self.close(tp) for tp in list(self._sinks)))

    async def open(self, tp: TopicPartition, timeout_s: float | None = None) -> None:
        """Start ``tp``'s producer (fencing any earlier one under its transactional id and
        aborting that one's open transaction) and begin a transaction. Call before reading
        ``tp``'s committed offset. A partition open already is left as it is.

        Args:
            timeout_s: at most this many seconds for the producer's start (its
                ``InitProducerId`` waits for a transaction coordinator); None: no bound.

        Raises:
            KafkaUnavailableError: no broker answered (or none within ``timeout_s``).
        """
        if tp in self._sinks:
            return
        sink = KafkaSink(
            self.client,
            self.settings,
            default_topic=self.default_topic,
            transactional_id=transactional_id(self.id_prefix, self.group_id, tp),
            write_verdicts=self._write_verdicts,
        )
        try:
            await asyncio.wait_for(sink.start(), timeout_s)
        except TimeoutError as err:
            await _stop(sink)
            raise KafkaUnavailableError(
                f"the producer of {tp} got no producer id within {timeout_s:g} s"
            ) from err
        await sink.producer.begin_transaction()
        self._sinks[tp] = sink

    async def close(self, tp: TopicPartition) -> None:
        """Abort ``tp``'s open transaction (what was sent since its last commit never becomes
        visible) and stop its producer; a partition not open is a no-op."""
        sink = self._sinks.pop(tp, None)
        self._tainted.discard(tp)
        if sink is None:
            return
        _retrieve_failure(sink.producer)
        with contextlib.suppress(KafkaError, TimeoutError, AssertionError):
            await asyncio.wait_for(sink.producer.abort_transaction(), CLOSE_TIMEOUT_S)
        await _stop(sink)

    async def send_from(
        self, tp: TopicPartition, records: Sequence[OutRecord]
    ) -> list[asyncio.Future[None]]:
        """Send ``records`` — replies or dead letters of input partition ``tp``'s records — in
        ``tp``'s open transaction; one future each, as :meth:`KafkaSink.send`. When ``tp`` is
        not open (revoked, or its transaction failed) each future raises
        :class:`SinkClosedError` (the record stays unfinished)."""
        sink = self._sinks.get(tp)
        if sink is not None:
            acks = await sink.send(records)
            for ack in acks:
                ack.add_done_callback(functools.partial(self._check_ack, tp, sink))
            return acks
        loop = asyncio.get_running_loop()
        closed = []
        for _ in records:
            future: asyncio.Future[None] = loop.create_future()
            future.set_exception(SinkClosedError(f"partition {tp} has no open transaction"))
            closed.append(future)
        return closed

    async def send(self, records: Sequence[OutRecord]) -> list[asyncio.Future[None]]:
        """Not available: every record belongs to an input partition's transaction
        (:meth:`send_from`).

        Raises:
            TypeError: always.
        """
        raise TypeError("a transactional sink sends per input partition: send_from(tp, ...)")

    async def commit(
        self, offsets: Mapping[TopicPartition, int], metadata: Mapping[TopicPartition, str]
    ) -> dict[TopicPartition, int]:
        """Commit each partition's transaction: the records sent in it since the last commit
        and its consumed ``offsets`` (next offset to read) with their ``metadata``; then begin
        the next. Partitions not open are left out. Returns the offsets committed.

        Raises:
            TransactionError: a partition's transaction was aborted or its producer fenced;
                that partition is closed, the others are committed (``err.committed``).
        """
        targets = [tp for tp in offsets if tp in self._sinks]
        results = await asyncio.gather(
            *(self._commit_one(tp, offsets[tp], metadata.get(tp, "")) for tp in targets),
            return_exceptions=True,
        )
        committed = {tp: offsets[tp] for tp, r in zip(targets, results, strict=True) if r is None}
        failed = {tp: r for tp, r in zip(targets, results, strict=True) if r is not None}
        if failed:
            reasons = {tp: failure_reason(r, self._sinks[tp].producer) for tp, r in failed.items()}
            await asyncio.gather(*(self.close(tp) for tp in failed))
            raise TransactionError(
                f"transaction of {sorted(failed)} not committed: "
                + "; ".join(f"{tp}: {r!r}" for tp, r in failed.items()),
                committed,
                reasons,
            )
        return committed

    def _check_ack(self, tp: TopicPartition, sink: KafkaSink, ack: asyncio.Future[None]) -> None:
        """A send of ``tp``'s that failed without a verdict (timed out, sink closing) may
        still be written: ``tp``'s open transaction is then aborted, never committed."""
        if (
            not ack.cancelled()
            and isinstance(ack.exception(), SinkClosedError)
            and self._sinks.get(tp) is sink
        ):
            self._tainted.add(tp)

    async def _commit_one(self, tp: TopicPartition, offset: int, metadata: str) -> None:
        """Commit ``tp``'s transaction within the send deadline.

        Raises:
            SinkClosedError: a send of the transaction failed without a verdict.
            TimeoutError: no verdict in time (a coordinator that does not answer): the
                outcome is unknown, so the caller closes this producer and never reuses it;
                the partition's next producer re-initialises (``InitProducerId`` bumps the
                epoch and completes or aborts what is open), which is what KIP-890's
                server-side checks would otherwise guard and aiokafka 0.14 cannot use.
        """
        if tp in self._tainted:
            raise SinkClosedError(f"a send of {tp}'s transaction was not acknowledged")
        producer = self._sinks[tp].producer
        timeout_s = self.settings.send_timeout_ms / 1000
        try:
            await asyncio.wait_for(self._end_transaction(producer, tp, offset, metadata), timeout_s)
        except TimeoutError as err:
            raise TimeoutError(
                f"no verdict on the commit of {tp} within {timeout_s:g} s: outcome unknown"
            ) from err
        await producer.begin_transaction()

    async def _end_transaction(
        self, producer: AIOKafkaProducer, tp: TopicPartition, offset: int, metadata: str
    ) -> None:
        await producer.send_offsets_to_transaction(
            {KafkaTP(*tp): (offset, metadata)}, self.group_id
        )
        await producer.commit_transaction()


async def _stop(sink: KafkaSink) -> None:
    """Stop ``sink`` within :data:`CLOSE_TIMEOUT_S`; else abandon its producer (its sender
    task cancelled, its connections closed: aiokafka's own stop waits for every batch)."""
    try:
        await asyncio.wait_for(sink.stop(), CLOSE_TIMEOUT_S)
    except TimeoutError:
        log.warning("a transactional producer did not stop in time: abandoned")
        await sink.abandon()


def _fatal_error(producer: AIOKafkaProducer | None) -> BaseException | None:
    """The error that put ``producer``'s transactions in aiokafka's fatal state, if any."""
    manager = None if producer is None else producer._txn_manager
    if manager is None or not manager.is_fatal_error():
        return None
    waiter = manager.wait_for_transaction_end()
    if waiter is None or not waiter.done() or waiter.cancelled():
        return None
    error: BaseException | None = waiter.exception()
    return error


def _retrieve_failure(producer: AIOKafkaProducer) -> None:
    """Mark the failure of ``producer``'s current transaction as seen, if it has one: aiokafka
    sets it on the transaction's end waiter, which an abort replaces unread ("Future exception
    was never retrieved" at garbage collection)."""
    waiter = producer._txn_manager.wait_for_transaction_end()
    if waiter is not None and waiter.done() and not waiter.cancelled():
        waiter.exception()
