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
(``err.failed``). So does a producer that failed in any other way: aiokafka's sender task
dies on a coordinator's answer it does not expect (``InvalidTxnState`` to ``AddPartitionsToTxn``,
``AddOffsetsToTxn`` or ``EndTxn`` after the coordinator moved), which puts its transactions in
a fatal state (``IllegalOperation`` or ``AssertionError`` from every later call), and its
``stop`` raises the error of the transactional request it was waiting for. No such error
leaves this adapter: a commit reports the partition failed (``aborted``, or :data:`FENCED`),
a send's future raises :class:`SinkClosedError` (the record stays unfinished; the partition's
transaction is never committed, and :meth:`TransactionalSink.close_failed` names the partition
at the next commit although none of it finished), a close or stop abandons the producer, an
open that cannot begin a transaction raises :class:`KafkaUnavailableError`.

The caller may :meth:`TransactionalSink.open` the partition again: the new producer's
``InitProducerId`` bumps the epoch, which fences the old producer and completes or aborts its
open transaction before returning, so the committed offset read after it is final (serve then
computes the partition again from there; a fenced partition stops it instead: another member
owns it).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from aiokafka import AIOKafkaProducer
from aiokafka import TopicPartition as KafkaTP
from aiokafka.errors import (
    InvalidProducerEpoch,
    ProducerFenced,
    TransactionalIdAuthorizationFailed,
)
from aiokafka.producer.transaction_manager import TransactionState

from consumer.kafka.config import KafkaClientSettings, SinkSettings
from consumer.kafka.errors import (
    FENCED,
    KafkaLayerError,
    KafkaUnavailableError,
    SinkClosedError,
    TransactionError,
)
from consumer.kafka.records import TopicPartition
from consumer.kafka.sink import KafkaSink
from consumer.kafka.topic_operations import WriteVerdicts
from consumer.kafka.transactional_ids import CLOSE_TIMEOUT_S, transactional_id
from schemas.records import OutRecord

__all__ = ["TransactionalSink"]

log = logging.getLogger(__name__)


class NotBegunError(RuntimeError):
    """A partition's transaction committed, but its producer could not begin the next one
    (its sender failed meanwhile); the cause is chained. Reported like a failed commit: the
    partition is closed and opened anew, whose read-back finds the committed offset."""


def failure_reason(err: BaseException, producer: AIOKafkaProducer | None = None) -> str:
    """The :attr:`TransactionError.failed` reason of one partition's failed commit (``err``),
    its producer's fatal error first: once fenced, aiokafka's producer answers a commit with
    ``IllegalOperation`` ("not in the middle of a transaction"), the fence being kept on the
    transaction's end waiter. Any other failure of the producer is ``aborted``: its open
    transaction never commits (the next owner's start aborts it)."""
    if isinstance(err, NotBegunError) and err.__cause__ is not None:
        err = err.__cause__
    fatal = (ProducerFenced, InvalidProducerEpoch, TransactionalIdAuthorizationFailed)
    if isinstance(err, fatal) or isinstance(_fatal_error(producer), fatal):
        return FENCED
    if isinstance(err, TimeoutError):
        return "unknown_outcome"
    if isinstance(err, SinkClosedError):
        return "unacknowledged_send"
    return "aborted"


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
        except KafkaLayerError:
            raise  # start_client closed it
        except Exception as err:  # what aiokafka's start raised besides a KafkaError
            await _stop(sink)
            raise KafkaUnavailableError(
                f"the producer of {tp} did not start: {_describe(err)}"
            ) from err
        try:
            await sink.producer.begin_transaction()
        except Exception as err:  # its sender failed already (aiokafka's fatal state)
            await _close_sink(sink)
            raise KafkaUnavailableError(
                f"the producer of {tp} could not begin a transaction: {_describe(err)}"
            ) from err
        self._sinks[tp] = sink

    async def close(self, tp: TopicPartition) -> None:
        """Abort ``tp``'s open transaction (what was sent since its last commit never becomes
        visible) and stop its producer; a partition not open is a no-op. Never raises for a
        producer that failed (see the module docstring): it is abandoned."""
        sink = self._sinks.pop(tp, None)
        self._tainted.discard(tp)
        if sink is None:
            return
        await _close_sink(sink)

    async def send_from(
        self, tp: TopicPartition, records: Sequence[OutRecord]
    ) -> list[asyncio.Future[None]]:
        """Send ``records`` — replies or dead letters of input partition ``tp``'s records — in
        ``tp``'s open transaction; one future each, as :meth:`KafkaSink.send`. When ``tp`` is
        not open (revoked, or its transaction failed) each future raises
        :class:`SinkClosedError` (the record stays unfinished)."""
        sink = self._sinks.get(tp)
        if sink is None:
            return _closed_acks(len(records), f"partition {tp} has no open transaction")
        try:
            acks = await sink.send(records)
        except Exception as err:  # the producer failed under the send
            if self._sinks.get(tp) is sink:
                self._tainted.add(tp)
            return _closed_acks(len(records), f"the producer of {tp} failed: {_describe(err)}")
        # One future of ours per future of the sink's (records of one producer batch share
        # one, and keep sharing it): it follows the sink's, see _settle_ack.
        ours: dict[asyncio.Future[None], asyncio.Future[None]] = {}
        loop = asyncio.get_running_loop()
        for ack in acks:
            if ack not in ours:
                ours[ack] = loop.create_future()
                ack.add_done_callback(functools.partial(self._settle_ack, tp, sink, ours[ack]))
        return [ours[ack] for ack in acks]

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
        sinks = {tp: self._sinks[tp] for tp in offsets if tp in self._sinks}
        results = await asyncio.gather(
            *(
                self._commit_one(tp, sink, offsets[tp], metadata.get(tp, ""))
                for tp, sink in sinks.items()
            ),
            return_exceptions=True,
        )
        outcome = dict(zip(sinks, results, strict=True))
        committed = {tp: offsets[tp] for tp, r in outcome.items() if r is None}
        failed = {tp: r for tp, r in outcome.items() if r is not None}
        if failed:
            reasons = {tp: failure_reason(r, sinks[tp].producer) for tp, r in failed.items()}
            await asyncio.gather(*(self._close_if_open(tp, sinks[tp]) for tp in failed))
            raise TransactionError.not_committed(failed, committed, reasons)
        return committed

    async def close_failed(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, str]:
        """Close each of ``tps`` whose producer failed (its sender task ended, its
        transactions in aiokafka's fatal or abortable state); returns each one's
        :attr:`TransactionError.failed` reason (:data:`FENCED` or ``aborted``).

        Such a partition's open transaction can never commit, and since every send of it fails
        (:class:`SinkClosedError`, the record stays unfinished) nothing of it finishes: no
        :meth:`commit` would name it. The caller reports these as failed commits.
        """
        failed = {}
        for tp in tps:
            sink = self._sinks.get(tp)
            if sink is not None and _failed(sink.producer):
                failed[tp] = sink
        reasons = {}
        for tp, sink in failed.items():
            error = _fatal_error(sink.producer)
            reasons[tp] = failure_reason(error or SinkClosedError(), sink.producer)
            if reasons[tp] != FENCED:
                reasons[tp] = "aborted"
            log.warning(
                "the transactional producer of %s failed (%s): closed",
                tp,
                "its sender stopped" if error is None else _describe(error),
            )
        await asyncio.gather(*(self._close_if_open(tp, sink) for tp, sink in failed.items()))
        return reasons

    async def _close_if_open(self, tp: TopicPartition, sink: KafkaSink) -> None:
        """Close ``tp`` when ``sink`` is still its producer's sink (a revoke during the commit
        closed it already; an open after that started a new one, which stays)."""
        if self._sinks.get(tp) is sink:
            await self.close(tp)

    def _settle_ack(
        self,
        tp: TopicPartition,
        sink: KafkaSink,
        ours: asyncio.Future[None],
        ack: asyncio.Future[None],
    ) -> None:
        """Settle ``ours`` as the sink's ``ack`` settled, except that a send failed because its
        producer failed (its sender died: the sink answers ``DeliveryError``, which would
        dead-letter the request) raises :class:`SinkClosedError`. A send of ``tp``'s that
        failed without a verdict (timed out, sink closing, producer failed) may still be
        written, or belongs to a transaction that cannot commit: ``tp``'s open transaction is
        then aborted, never committed."""
        if ours.done():  # cancelled by its owner
            return
        if ack.cancelled():
            ours.cancel()
            return
        err = ack.exception()
        if err is None:
            ours.set_result(None)
            return
        if not isinstance(err, SinkClosedError) and _failed(sink.producer):
            err = SinkClosedError(f"the producer of {tp} failed: {err}")
        if isinstance(err, SinkClosedError) and self._sinks.get(tp) is sink:
            self._tainted.add(tp)
        ours.set_exception(err)

    async def _commit_one(
        self, tp: TopicPartition, sink: KafkaSink, offset: int, metadata: str
    ) -> None:
        """Commit ``tp``'s transaction (its producer ``sink``'s) within the send deadline, then
        begin the next.

        Raises:
            SinkClosedError: a send of the transaction failed without a verdict.
            TimeoutError: no verdict in time (a coordinator that does not answer): the
                outcome is unknown, so the caller closes this producer and never reuses it;
                the partition's next producer re-initialises (``InitProducerId`` bumps the
                epoch and completes or aborts what is open), which is what KIP-890's
                server-side checks would otherwise guard and aiokafka 0.14 cannot use.
            NotBegunError: the commit went through, the next transaction could not begin
                (the committed offset read back after a new open says so).
            Exception: what aiokafka raised (``KafkaError``, ``IllegalOperation``, or the
                transaction manager's ``AssertionError`` once its sender failed).
        """
        if tp in self._tainted:
            raise SinkClosedError(f"a send of {tp}'s transaction was not acknowledged")
        producer = sink.producer
        timeout_s = self.settings.send_timeout_ms / 1000
        try:
            await asyncio.wait_for(self._end_transaction(producer, tp, offset, metadata), timeout_s)
        except TimeoutError as err:
            raise TimeoutError(
                f"no verdict on the commit of {tp} within {timeout_s:g} s: outcome unknown"
            ) from err
        try:
            await producer.begin_transaction()
        except Exception as err:
            raise NotBegunError(
                f"committed, but the next transaction could not begin: {_describe(err)}"
            ) from err

    async def _end_transaction(
        self, producer: AIOKafkaProducer, tp: TopicPartition, offset: int, metadata: str
    ) -> None:
        await producer.send_offsets_to_transaction(
            {KafkaTP(*tp): (offset, metadata)}, self.group_id
        )
        await producer.commit_transaction()


async def _close_sink(sink: KafkaSink) -> None:
    """Abort ``sink``'s open transaction (when its producer still can) and stop it; never
    raises but for cancellation. An abort that fails (the producer's transactions in aiokafka's
    fatal state, or its commit still under way: ``AssertionError``; no coordinator in time) is
    left to the broker: the next owner's ``InitProducerId`` aborts what is open, or
    ``transaction.timeout.ms`` does."""
    producer = sink.producer
    _retrieve_failure(producer)
    # An offset commit of a commit that timed out is still pending: aiokafka fails it when
    # the producer fails or stops, and nobody awaits it any more.
    pending = getattr(producer._txn_manager, "_pending_txn_offsets", ())
    offsets = [future for _, _, future in pending]
    try:
        await asyncio.wait_for(producer.abort_transaction(), CLOSE_TIMEOUT_S)
    except Exception as err:
        log.debug("a transactional producer's abort failed: %s", _describe(err))
    await _stop(sink)
    _retrieve_failure(producer)  # the error its sender failed with, set when it stopped
    for future in offsets:
        if future.done() and not future.cancelled():
            future.exception()


async def _stop(sink: KafkaSink) -> None:
    """Stop ``sink`` within :data:`CLOSE_TIMEOUT_S`; else abandon its producer (its sender
    task cancelled, its connections closed: aiokafka's own stop waits for every batch).
    Never raises but for cancellation: aiokafka's stop cancels its sender, which first waits
    for the transactional request in flight and then raises that request's error (e.g.
    ``InvalidTxnState`` from an ``EndTxn`` answered by a new coordinator); such a producer is
    abandoned too."""
    try:
        await asyncio.wait_for(sink.stop(), CLOSE_TIMEOUT_S)
        return
    except TimeoutError:
        log.warning("a transactional producer did not stop in time: abandoned")
    except Exception as err:
        log.warning("a transactional producer failed as it stopped (%s): abandoned", _describe(err))
    try:
        await sink.abandon()
    except Exception as err:
        log.warning("abandoning a transactional producer failed: %s", _describe(err))


def _closed_acks(count: int, reason: str) -> list[asyncio.Future[None]]:
    """``count`` futures failed with :class:`SinkClosedError` (``reason``)."""
    loop = asyncio.get_running_loop()
    closed = []
    for _ in range(count):
        future: asyncio.Future[None] = loop.create_future()
        future.set_exception(SinkClosedError(reason))
        closed.append(future)
    return closed


def _describe(err: BaseException) -> str:
    """``err`` in one line: its class and message (aiokafka's errors are often empty)."""
    text = str(err)
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _failed(producer: AIOKafkaProducer) -> bool:
    """Whether ``producer`` cannot commit its open transaction any more: its sender task
    ended (with an error: :meth:`aiokafka.producer.sender.Sender._fail_all` failed every
    batch with it), its transactions in aiokafka's fatal state, or an abortable error."""
    manager = producer._txn_manager
    sender = getattr(producer, "_sender", None)
    task = None if sender is None else sender.sender_task
    if task is not None and task.done():
        return True
    return manager is not None and manager.state in (
        TransactionState.FATAL_ERROR,
        TransactionState.ABORTABLE_ERROR,
    )


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
