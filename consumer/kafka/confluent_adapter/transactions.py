"""``--exactly-once`` on confluent-kafka (librdkafka): one transactional producer per assigned
input partition, a drop-in for :class:`consumer.kafka.transactions.TransactionalSink` (whose
module docstring says why a producer per input partition, and how replies and offsets meet in
one transaction).

librdkafka's transactional calls (``init_transactions``, ``send_offsets_to_transaction``,
``commit_transaction``, ``abort_transaction``) block: each runs on a thread of its own
(:func:`consumer.kafka.confluent_adapter.sink.blocking`) with the send deadline as its
timeout, one at a time per producer. Their errors map to :attr:`TransactionError.failed`'s
reasons (:func:`failure_reason`):

- ``err.fatal()`` — the producer fenced by a newer one under its transactional id
  (``_FENCED``, ``PRODUCER_FENCED``, ``INVALID_PRODUCER_EPOCH``) or otherwise unusable:
  :data:`~consumer.kafka.errors.FENCED`;
- ``err.txn_requires_abort()`` — the broker refused the transaction: ``aborted``;
- a timeout or any other error — no verdict: ``unknown_outcome``. The producer is closed and
  never reused: librdkafka lacks KIP-890's server-side checks, and the partition's next
  producer's ``init_transactions`` bumps the epoch, which completes or aborts what is open.

The consumer group's metadata for ``send_offsets_to_transaction`` comes from ``group_metadata``
(the group source's ``consumer_group_metadata()``, asked on the thread that owns the consumer).
Without one, the metadata of the group id alone is used: generation -1 and no member id, what a
``Consumer`` with ``group.id`` and no subscription returns (librdkafka's
``rd_kafka_consumer_group_metadata_new(group_id)``; confluent-kafka has no constructor for it,
so one such consumer is made, asked and closed). The broker then checks no generation, as for
aiokafka's ``TxnOffsetCommit`` version 0: the fencing is the transactional id's.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import warnings
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTP

from consumer.kafka.config import KafkaClientSettings, SinkSettings
from consumer.kafka.confluent_adapter.client_config import client_config
from consumer.kafka.confluent_adapter.errors import kafka_error
from consumer.kafka.confluent_adapter.logs import librdkafka_logger
from consumer.kafka.confluent_adapter.sink import ConfluentSink, blocking
from consumer.kafka.confluent_adapter.write_verdicts import AdminWriteVerdicts
from consumer.kafka.errors import FENCED, SinkClosedError, TransactionError
from consumer.kafka.records import TopicPartition
from consumer.kafka.transactional_ids import CLOSE_TIMEOUT_S, transactional_id
from schemas.records import OutRecord

__all__ = ["ConfluentTransactionalSink", "failure_reason", "group_only_metadata"]

log = logging.getLogger(__name__)

INIT_ATTEMPT_S: Final = 5.0
"""One ``init_transactions`` call waits at most this long; :meth:`open` calls it again (it
may be retried after a timeout) until its own ``timeout_s``."""

_FENCED_CODES: Final = frozenset(
    {
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    }
)

# confluent-kafka's Producer.close() aborts an open transaction and warns when that fails;
# a closing partition's transaction was aborted (or found fenced) here first.
warnings.filterwarnings(
    "ignore", message="Producer abort_transaction failed during close", category=RuntimeWarning
)

GroupMetadata = Callable[[], Awaitable[object]]
"""An async callable returning the consumer's ``consumer_group_metadata()``."""


def failure_reason(err: BaseException, fatal: object = None) -> str:
    """The :attr:`TransactionError.failed` reason of one partition's failed commit: ``err``,
    or ``fatal`` (the producer's fatal error from librdkafka's ``error_cb``) first."""
    for candidate in (fatal, kafka_error(err)):
        if isinstance(candidate, KafkaError) and (
            candidate.fatal() or candidate.code() in _FENCED_CODES
        ):
            return FENCED
    if isinstance(err, SinkClosedError):
        return "unacknowledged_send"
    kafka_err = kafka_error(err)
    if kafka_err is not None and kafka_err.txn_requires_abort():
        return "aborted"
    return "unknown_outcome"


def group_only_metadata(client: KafkaClientSettings, group_id: str) -> object:
    """The consumer group metadata of ``group_id`` alone (generation -1, no member id), from a
    ``Consumer`` that never subscribes (see the module docstring). Blocking (its close)."""
    consumer = Consumer(
        {
            **client_config(client),
            "group.id": group_id,
            "enable.auto.commit": False,
            "logger": librdkafka_logger("txn-group"),
        }
    )
    try:
        return consumer.consumer_group_metadata()
    finally:
        consumer.close()


@dataclass(eq=False)
class ConfluentTransactionalSink:
    """Replies and offsets of each input partition in its own Kafka transactions (librdkafka).

    Attributes:
        client: the brokers and security.
        settings: the delivery deadline of one send (and of each transactional call).
        default_topic: where a record without a topic goes.
        group_id: the consumer group whose offsets the transactions commit.
        id_prefix: first part of every transactional id (:func:`transactional_id`).
        group_metadata: the consumer's group metadata, asked at each commit; None: the group
            id's alone (see the module docstring).

    Topics this principal may not write are kept out of the transactions
    (:class:`~consumer.kafka.confluent_adapter.write_verdicts.AdminWriteVerdicts`): a record for
    one fails alone with :class:`DeliveryDeniedError`.
    """

    client: KafkaClientSettings
    settings: SinkSettings
    default_topic: str = field(kw_only=True)
    group_id: str = field(kw_only=True)
    id_prefix: str = field(default="kbatch", kw_only=True)
    group_metadata: GroupMetadata | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        self._write_verdicts = AdminWriteVerdicts(self.client)
        self._sinks: dict[TopicPartition, ConfluentSink] = {}
        self._tainted: set[TopicPartition] = set()
        self._group_only: object = None

    @property
    def open_partitions(self) -> frozenset[TopicPartition]:
        """Input partitions with a producer and an open transaction."""
        return frozenset(self._sinks)

    @property
    def _timeout_s(self) -> float:
        return self.settings.send_timeout_ms / 1000

    async def start(self) -> None:
        """Nothing to connect before the first partition is assigned (see :meth:`open`)."""

    async def stop(self) -> None:
        """Close every partition (:meth:`close`); idempotent."""
        await asyncio.gather(*(self.close(tp) for tp in list(self._sinks)))

    async def open(self, tp: TopicPartition, timeout_s: float | None = None) -> None:
        """Start ``tp``'s producer (``init_transactions``: fences any earlier one under its
        transactional id and completes or aborts its open transaction) and begin a
        transaction. A partition open already is left as it is.

        Args:
            timeout_s: at most this many seconds for ``init_transactions``; None: no bound.

        Raises:
            KafkaSecurityError: the broker refused the client (TLS, SASL, the transactional
                id's ACL).
            KafkaUnavailableError: no producer id (none within ``timeout_s``).
        """
        if tp in self._sinks:
            return
        sink = ConfluentSink(
            self.client,
            self.settings,
            default_topic=self.default_topic,
            transactional_id=transactional_id(self.id_prefix, self.group_id, tp),
            write_verdicts=self._write_verdicts,
        )
        sink.start_polling()
        loop = asyncio.get_running_loop()
        give_up = None if timeout_s is None else loop.time() + timeout_s
        while True:
            attempt_s = INIT_ATTEMPT_S
            if give_up is not None:
                attempt_s = min(attempt_s, max(0.0, give_up - loop.time()))
            try:
                await blocking(sink.producer.init_transactions, attempt_s)
                break
            except KafkaException as err:
                kafka_err = kafka_error(err)
                late = give_up is not None and loop.time() >= give_up
                if kafka_err is not None and kafka_err.retriable() and not late:
                    continue
                await sink.abandon()
                within = f" within {timeout_s:g} s" if late else ""
                context = f"the producer of {tp} got no producer id{within}"
                raise sink.unavailable(context, err) from None
        sink.producer.begin_transaction()
        self._sinks[tp] = sink

    async def close(self, tp: TopicPartition) -> None:
        """Abort ``tp``'s open transaction (what was sent since its last commit never becomes
        visible) and stop its producer; a partition not open is a no-op."""
        sink = self._sinks.pop(tp, None)
        self._tainted.discard(tp)
        if sink is None:
            return
        with contextlib.suppress(KafkaException, TimeoutError):
            await asyncio.wait_for(
                blocking(sink.producer.abort_transaction, CLOSE_TIMEOUT_S), CLOSE_TIMEOUT_S + 1
            )
        await sink.abandon()  # nothing of an aborted transaction is worth waiting for

    async def send_from(
        self, tp: TopicPartition, records: Sequence[OutRecord]
    ) -> list[asyncio.Future[None]]:
        """Send ``records`` — replies or dead letters of input partition ``tp``'s records — in
        ``tp``'s open transaction; one future each, as :meth:`ConfluentSink.send`. When ``tp``
        is not open each future raises :class:`SinkClosedError`."""
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
        """Not available: every record belongs to an input partition's transaction.

        Raises:
            TypeError: always.
        """
        raise TypeError("a transactional sink sends per input partition: send_from(tp, ...)")

    async def commit(
        self, offsets: Mapping[TopicPartition, int], metadata: Mapping[TopicPartition, str]
    ) -> dict[TopicPartition, int]:
        """Commit each partition's transaction with its consumed ``offsets`` and ``metadata``,
        then begin the next. Partitions not open are left out. Returns the offsets committed.

        Raises:
            TransactionError: a partition's transaction was not committed; that partition is
                closed, the others are committed (``err.committed``).
        """
        # The sinks as the call found them: a revoke may close a partition meanwhile.
        sinks = {tp: self._sinks[tp] for tp in offsets if tp in self._sinks}
        if not sinks:
            return {}
        group = await self._metadata()
        results = await asyncio.gather(
            *(
                self._commit_one(tp, sink, offsets[tp], metadata.get(tp, ""), group)
                for tp, sink in sinks.items()
            ),
            return_exceptions=True,
        )
        outcome = dict(zip(sinks, results, strict=True))
        committed = {tp: offsets[tp] for tp, r in outcome.items() if r is None}
        failed = {tp: r for tp, r in outcome.items() if r is not None}
        if failed:
            reasons = {tp: failure_reason(r, sinks[tp].fatal_error) for tp, r in failed.items()}
            await asyncio.gather(
                *(self.close(tp) for tp in failed if self._sinks.get(tp) is sinks[tp])
            )
            raise TransactionError.not_committed(failed, committed, reasons)
        return committed

    async def close_failed(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, str]:
        """Close each of ``tps`` whose producer failed (a fatal error from librdkafka: fenced,
        or a send that failed without a verdict, which taints the transaction); returns each
        one's :attr:`TransactionError.failed` reason (:data:`FENCED` or ``aborted``).

        Such a partition's open transaction can never commit and its records stay unfinished,
        so no :meth:`commit` would name it: the caller reports these as failed commits.
        """
        failed = {
            tp: sink
            for tp in tps
            if (sink := self._sinks.get(tp)) is not None
            and (sink.fatal_error is not None or tp in self._tainted)
        }
        reasons = {}
        for tp, sink in failed.items():
            fatal = sink.fatal_error
            if fatal is None:  # a send without a verdict: the abort says whether it was fenced
                fatal = await self._abort_error(sink)
            reason = failure_reason(SinkClosedError(), fatal)
            reasons[tp] = FENCED if reason == FENCED else "aborted"
            log.warning(
                "the transactional producer of %s failed (%s): closed",
                tp,
                sink.fatal_error if sink.fatal_error is not None else "a send without a verdict",
            )
        await asyncio.gather(*(self.close(tp) for tp in failed))
        return reasons

    @staticmethod
    async def _abort_error(sink: ConfluentSink) -> KafkaError | None:
        """Abort ``sink``'s open transaction; librdkafka's error when it refused (a fenced
        producer's abort fails with its fatal error), else None."""
        try:
            await asyncio.wait_for(
                blocking(sink.producer.abort_transaction, CLOSE_TIMEOUT_S), CLOSE_TIMEOUT_S + 1
            )
        except KafkaException as err:
            return kafka_error(err)
        except TimeoutError:
            return None
        return None

    async def _metadata(self) -> object:
        if self.group_metadata is not None:
            return await self.group_metadata()
        if self._group_only is None:
            self._group_only = await blocking(group_only_metadata, self.client, self.group_id)
        return self._group_only

    def _check_ack(
        self, tp: TopicPartition, sink: ConfluentSink, ack: asyncio.Future[None]
    ) -> None:
        """A send of ``tp``'s that failed without a verdict may still be written: ``tp``'s
        open transaction is then aborted, never committed."""
        if (
            not ack.cancelled()
            and isinstance(ack.exception(), SinkClosedError)
            and self._sinks.get(tp) is sink
        ):
            self._tainted.add(tp)

    async def _commit_one(
        self, tp: TopicPartition, sink: ConfluentSink, offset: int, metadata: str, group: object
    ) -> None:
        """Commit ``tp``'s transaction within the send deadline (twice over: the offsets, then
        the commit, which first flushes the transaction's records).

        Raises:
            SinkClosedError: a send of the transaction failed without a verdict.
            KafkaException: librdkafka refused or timed out (:func:`failure_reason`).
            TimeoutError: a call did not return in time: outcome unknown.
        """
        if tp in self._tainted:
            raise SinkClosedError(f"a send of {tp}'s transaction was not acknowledged")
        producer = sink.producer
        timeout_s = self._timeout_s
        position = KafkaTP(tp[0], tp[1], offset, metadata=metadata)
        await asyncio.wait_for(
            blocking(producer.send_offsets_to_transaction, [position], group, timeout_s),
            timeout_s + 1,
        )
        await asyncio.wait_for(blocking(producer.commit_transaction, timeout_s), timeout_s + 1)
        producer.begin_transaction()
