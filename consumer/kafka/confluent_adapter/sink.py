"""The reply sink on confluent-kafka (librdkafka): one idempotent producer (acks=all) for
replies and dead letters; a drop-in for :class:`consumer.kafka.sink.KafkaSink`.

::

    send(records) ── produce() each, on the loop (thread-safe, queues in librdkafka) ──►
        librdkafka's threads: batch, send, retry under the same producer id and sequence
    a loop timer ── producer.poll(0) every LOOP_POLL_S while records await their reports
        (every IDLE_POLL_S otherwise: logs, errors) ──► each record's future, on the loop

The loop polls instead of a thread of its own: a poller thread woke once per delivery report
and then woke the loop (two thread wake-ups, each tens of µs of CPU on a small VM); a timer
fires in a loop iteration that runs anyway while requests flow, and a report reaches its
future at most LOOP_POLL_S late (it only gates the offset commit: the reply is already sent).

Semantics as :class:`~consumer.kafka.sink.KafkaSink` (its module docstring says why):

- Idempotent: ``message.timeout.ms=0`` (no expiry), so librdkafka retries a record it took
  itself, under the same producer id and sequence numbers, until the broker acknowledges it
  (never a second copy). A finite timeout would fail in-flight records with
  ``_MSG_TIMED_OUT`` although they may be written, and make librdkafka bump the idempotent
  epoch to go on; re-sending those could write them twice. The deadline ``send_timeout_ms``
  then only logs a warning (at most one per :data:`~consumer.kafka.sink_timing.LATE_LOG_EVERY_S`).
  A record whose delivery report fails retriably anyway is produced again with exponential
  backoff until the sink closes.
- Transactional (``transactional_id``, driven by
  :mod:`consumer.kafka.confluent_adapter.transactions`): ``message.timeout.ms`` is the send
  deadline (librdkafka needs a finite one inside transactions); a record not acknowledged in
  time fails with :class:`SinkClosedError` and is never re-sent (it may be written; the owner
  aborts the transaction). A timed-out in-flight record makes librdkafka's transaction
  abortable, which is what the owner does.
- A topic the broker does not list fails its records with :class:`DeliveryTopicMissingError`
  after :data:`~consumer.kafka.sink_timing.MISSING_TOPIC_GRACE_S`
  (``topic.metadata.propagation.max.ms``;
  ``allow.auto.create.topics=false``: kbatch writes only where its operator made a topic), and
  at once while librdkafka knows it missing (``produce`` raises ``_UNKNOWN_TOPIC``); librdkafka
  asks the broker again as records for it come, so a topic created meanwhile is written
  within a moment. The ACLs hiding or refusing the topic (``TOPIC_AUTHORIZATION_FAILED``):
  :class:`DeliveryDeniedError`. A value over ``message.max.bytes``, a partition the topic
  lacks, a broker's ``INVALID_*`` refusal: :class:`DeliveryError`.
- The key → partition rule is Java's (``partitioner=murmur2_random``, as aiokafka and
  :mod:`consumer.kafka.partitioner`), so a key lands where the aiokafka sink puts it.

One future per record (librdkafka calls back once per record, inside ``poll``; which partition
a keyed record goes to is decided in C, after :meth:`ConfluentSink.send` returns).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol, TypeVar

from confluent_kafka import KafkaError, KafkaException, Producer

from consumer.kafka.config import KafkaClientSettings, SinkSettings
from consumer.kafka.confluent_adapter.client_config import client_config
from consumer.kafka.confluent_adapter.errors import security_error
from consumer.kafka.confluent_adapter.logs import error_callback, librdkafka_logger
from consumer.kafka.errors import (
    DeliveryDeniedError,
    DeliveryError,
    DeliveryTopicMissingError,
    KafkaUnavailableError,
    SinkClosedError,
)
from consumer.kafka.sink_timing import LATE_LOG_EVERY_S, MISSING_TOPIC_GRACE_S
from schemas.records import OutRecord

__all__ = ["ConfluentSink", "TopicVerdicts", "blocking", "delivery_error", "producer_config"]

log = logging.getLogger(__name__)

T = TypeVar("T")

LOOP_POLL_S: Final = 0.005
"""How often the loop polls the producer while records await their delivery reports."""

IDLE_POLL_S: Final = 0.5
"""How often it polls with nothing awaited: librdkafka's logs and error callbacks come out of
``poll``."""

BUFFER_FULL_WAIT_S: Final = 0.005
"""How long :meth:`ConfluentSink.send` waits before producing again when librdkafka's queue
is full (``BufferError``: ``queue.buffering.max.messages``/``.kbytes``); records are never
dropped."""

RETRY_BACKOFF_S: Final = (0.05, 2.0)
"""First and longest wait before a record that failed retriably is produced again."""

_MISSING: Final = frozenset({KafkaError._UNKNOWN_TOPIC, KafkaError.UNKNOWN_TOPIC_OR_PART})
_DENIED: Final = frozenset(
    {KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.CLUSTER_AUTHORIZATION_FAILED}
)
_CLOSED: Final = frozenset(
    {
        KafkaError._PURGE_QUEUE,
        KafkaError._PURGE_INFLIGHT,
        KafkaError._MSG_TIMED_OUT,
        KafkaError._FATAL,
        KafkaError._FENCED,
        KafkaError._STATE,
        KafkaError._DESTROY,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
    }
)
"""Codes after which a record's fate is unknown or the producer unusable: SinkClosedError."""


CLOSE_TIMEOUT_S: Final = 5.0
"""At most this long for ``Producer.close`` after a purge (it aborts an open transaction
first, which waits for the coordinator); a close that takes longer is left to its thread."""


class TopicVerdicts(Protocol):
    """Which topics this principal may not write (asked of the broker, kept a while)."""

    async def denied(self, topics: set[str]) -> frozenset[str]: ...


async def blocking(call: Callable[..., T], *args: Any) -> T:
    """Run librdkafka's blocking ``call(*args)`` on a daemon thread of its own and await its
    result: a call that outlives its awaiter (cancelled, timed out) never holds up the
    interpreter's exit, as a thread of the default executor would."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, err: BaseException | None) -> None:
        if done.cancelled():
            return
        if err is not None:
            done.set_exception(err)
        else:
            done.set_result(result)  # type: ignore[arg-type]

    def run() -> None:
        try:
            result = call(*args)
        except BaseException as err:  # handed to the awaiter
            outcome: tuple[T | None, BaseException | None] = (None, err)
        else:
            outcome = (result, None)
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(settle, *outcome)

    threading.Thread(target=run, name="kbatch-librdkafka-call", daemon=True).start()
    return await done


def producer_config(
    client: KafkaClientSettings, settings: SinkSettings, transactional_id: str | None
) -> dict[str, object]:
    """The librdkafka producer configuration of a reply sink (see the module docstring).

    Raises:
        KafkaSecurityError: a security file cannot be read (:func:`client_config`).
    """
    config: dict[str, object] = {
        **client_config(client),
        "client.id": "kbatch-sink",
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 2,
        "partitioner": "murmur2_random",
        "allow.auto.create.topics": False,
        "topic.metadata.propagation.max.ms": int(MISSING_TOPIC_GRACE_S * 1000),
        "request.timeout.ms": settings.send_timeout_ms,
        "message.timeout.ms": 0,  # no expiry: librdkafka retries until acknowledged
    }
    if transactional_id is not None:
        config["transactional.id"] = transactional_id
        config["message.timeout.ms"] = settings.send_timeout_ms
        config["transaction.timeout.ms"] = max(60_000, settings.send_timeout_ms)
    return config


def delivery_error(err: KafkaError, topic: str) -> DeliveryError | SinkClosedError | None:
    """The sink's error for librdkafka's ``err`` about a record for ``topic``; None when the
    record may be produced again (retriable, idempotent sink only)."""
    code = err.code()
    if code in _MISSING:
        return DeliveryTopicMissingError(f"topic {topic} does not exist")
    if code in _DENIED:
        return DeliveryDeniedError(f"the broker's ACLs deny writing to {topic}")
    if err.fatal() or code in _CLOSED:
        return SinkClosedError(f"not acknowledged: {err.str()}")
    if err.retriable():
        return None
    return DeliveryError(f"{err.name()}: {err.str()} ({topic})")


def _reported(
    append: Callable[[tuple[Any, ...]], None],
    ack: asyncio.Future[None],
    record: OutRecord,
    attempt: int,
    waiting: _Waiting,
    err: Any,
    _msg: Any,
) -> None:
    """librdkafka's delivery callback (inside ``poll``, on the thread that polls: the loop,
    or a blocking call's thread that flushes): the report onto the sink's queue of reports
    (``append``), for the loop's next harvest."""
    append((ack, record, attempt, waiting, err))


class _Waiting:
    """The records of one :meth:`ConfluentSink.send` not answered yet, and its deadline timer
    (cancelled with the last answer: the timer holds the call's records)."""

    __slots__ = ("acks", "count", "records", "sending", "timer")

    def __init__(self, acks: list[asyncio.Future[None]], records: Sequence[OutRecord]) -> None:
        self.acks = acks
        self.records = records
        self.count = 0
        self.sending = True  # send is still producing the call's records
        self.timer: asyncio.TimerHandle | None = None

    def settled(self) -> None:
        """One record answered; the last (once all are produced) cancels the deadline."""
        self.count -= 1
        if self.count == 0 and not self.sending:
            self.release()

    def release(self) -> None:
        """Cancel the deadline and drop the references to the call's records."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.acks, self.records = [], ()


class ConfluentSink:
    """Sends :class:`schemas.records.OutRecord` values; ``topic=None`` means ``default_topic``.
    Same constructor and methods as :class:`consumer.kafka.sink.KafkaSink`.

    Args:
        client: the brokers and security.
        settings: the delivery deadline.
        default_topic: where a record without a topic goes.
        transactional_id: makes the producer transactional (see the module docstring);
            None: idempotent only.
        write_verdicts: asks whether each record's topic may be written before the record is
            queued (a transactional sink: a refused topic would fail the whole transaction;
            :class:`consumer.kafka.confluent_adapter.write_verdicts.AdminWriteVerdicts`);
            None: not asked.
    """

    def __init__(
        self,
        client: KafkaClientSettings,
        settings: SinkSettings,
        *,
        default_topic: str,
        transactional_id: str | None = None,
        write_verdicts: TopicVerdicts | None = None,
    ) -> None:
        self._default_topic = default_topic
        self._transactional = transactional_id is not None
        self._write_verdicts = write_verdicts
        self._attempt_timeout_s = settings.send_timeout_ms / 1000
        self._closed = False
        self._abandoned = False
        self._pending = 0  # records in librdkafka without a delivery report yet
        self._drained = asyncio.Event()
        self._drained.set()
        self._reports: collections.deque[tuple[Any, ...]] = collections.deque()
        self._retries: set[asyncio.Task[None]] = set()
        self._late_records = 0
        self._late_logged_until = -float("inf")
        self.fatal_error: object = None
        """librdkafka's fatal error (the producer is unusable: fenced, or its idempotence
        state broken), set inside ``poll``; None while there is none."""
        logger = librdkafka_logger("sink")
        config = producer_config(client, settings, transactional_id)
        config["logger"] = logger
        self.last_error: Any = None
        """librdkafka's last error callback's error (its ``error_cb``); None before one."""
        report = error_callback(logger, self._on_fatal)

        def on_error(err: Any) -> None:  # inside poll, on the thread that polls
            self.last_error = err
            report(err)

        config["error_cb"] = on_error
        self._producer = Producer(config)
        self._poll_timer: asyncio.TimerHandle | None = None
        self._polling_fast = False  # the timer's period is LOOP_POLL_S (records awaited)

    @property
    def producer(self) -> Producer:
        """The librdkafka producer (its transactions are driven by
        :class:`consumer.kafka.confluent_adapter.transactions.ConfluentTransactionalSink`)."""
        return self._producer

    def _on_fatal(self, err: object) -> None:
        self.fatal_error = err

    async def start(self) -> None:
        """Start polling on the loop and ask the broker about the default topic (creating
        nothing; the idempotent producer's id comes with the first send).

        Raises:
            KafkaSecurityError: a broker refused the client (TLS, SASL, an ACL).
            KafkaUnavailableError: no broker answered within the send deadline.
        """
        self.start_polling()
        try:
            await blocking(self._producer.list_topics, self._default_topic, self._attempt_timeout_s)
        except KafkaException as err:
            await self.abandon()
            raise self.unavailable("the reply producer cannot connect", err) from None

    def unavailable(self, context: str, err: BaseException) -> KafkaUnavailableError:
        """The error to raise when the producer got nowhere (``err``): a
        :class:`KafkaSecurityError` when librdkafka's last error (or ``err``) is a refusal
        (:func:`~consumer.kafka.confluent_adapter.errors.security_error`), else
        :class:`KafkaUnavailableError` ``context: cause``."""
        for cause in (self.last_error, err.args[0] if err.args else None):
            refused = security_error(cause, context) if isinstance(cause, KafkaError) else None
            if refused is not None:
                return refused
        cause = self.last_error if isinstance(self.last_error, KafkaError) else err
        text = cause.str() if isinstance(cause, KafkaError) else str(cause)
        return KafkaUnavailableError(f"{context}: {text}")

    def start_polling(self) -> None:
        """Start polling the producer on the running loop (delivery reports, logs, errors):
        every :data:`LOOP_POLL_S` while records are awaited, else every :data:`IDLE_POLL_S`;
        idempotent."""
        if self._poll_timer is None and not self._abandoned:
            self._arm(fast=False)

    def _arm(self, fast: bool) -> None:
        if self._poll_timer is not None:
            self._poll_timer.cancel()
        self._polling_fast = fast
        delay = LOOP_POLL_S if fast else IDLE_POLL_S
        self._poll_timer = asyncio.get_running_loop().call_later(delay, self._poll_tick)

    def _poll_fast(self) -> None:
        """Reports are awaited: poll every :data:`LOOP_POLL_S` (unless polling has not started
        or has ended)."""
        if not self._polling_fast and self._poll_timer is not None:
            self._arm(fast=True)

    def _poll_tick(self) -> None:
        self._poll_timer = None
        self.poll_now()
        if not self._abandoned:
            self._arm(fast=self._pending > 0)

    def poll_now(self) -> None:
        """Serve librdkafka's callbacks now (``poll(0)``: never waits) and settle the
        delivery reports they queued (also those a blocking call's flush served on its own
        thread). ``poll`` raises librdkafka's fatal error (a fenced transactional producer)
        once, after ``error_cb`` has had it: it is logged at DEBUG, polling goes on."""
        try:
            self._producer.poll(0)
        except KafkaException as err:
            log.debug("the reply producer's poll: %s", err)
        self._harvest()

    def _harvest(self) -> None:
        reports = self._reports
        if not reports:
            return
        batch = []
        while reports:
            batch.append(reports.popleft())
        self._delivered(batch)

    async def stop(self) -> None:
        """Wait (within ``send_timeout_ms``) for what librdkafka holds to be acknowledged, then
        close; records still unanswered fail with :class:`SinkClosedError`. Idempotent."""
        self._closed = True
        for task in list(self._retries):
            task.cancel()
        if self._poll_timer is not None and self._pending:
            try:
                await asyncio.wait_for(self._drained.wait(), self._attempt_timeout_s)
            except TimeoutError:
                log.warning(
                    "%d records not acknowledged within %g s of the sink's stop: dropped",
                    self._pending,
                    self._attempt_timeout_s,
                )
        await self.abandon()

    async def abandon(self) -> None:
        """Drop what librdkafka still holds (``purge``) without waiting for the broker; each
        unanswered record fails with :class:`SinkClosedError`. Idempotent."""
        if self._abandoned:
            return
        self._abandoned = self._closed = True
        for task in list(self._retries):
            task.cancel()
        self._producer.purge(in_queue=True, in_flight=True, blocking=False)
        if self._poll_timer is not None:
            self._poll_timer.cancel()
            self._poll_timer = None
        self.poll_now()  # the purged records' reports (and a refusal's error callback)
        try:  # serves the reports of what was still in flight, on its thread
            await asyncio.wait_for(blocking(self._producer.close), CLOSE_TIMEOUT_S)
        except TimeoutError:
            log.warning("the reply producer did not close within %g s", CLOSE_TIMEOUT_S)
        except Exception as err:  # an abort that close attempts refused (fenced, not begun)
            log.debug("the reply producer's close: %s", err)
        self._harvest()  # what close served
        await asyncio.sleep(0)  # the futures' callbacks run now

    async def send(self, records: Sequence[OutRecord]) -> list[asyncio.Future[None]]:
        """Queue ``records`` in order; one future per record, resolved when the broker
        acknowledged it. Waits only while librdkafka's queue is full.

        A record's future raises:
            DeliveryError: the record can never be delivered (a missing or denied topic, a
                partition the topic lacks, too large).
            SinkClosedError: the sink closed before the record was acknowledged (or, for a
                transactional sink, no acknowledgement within ``send_timeout_ms``).
        """
        loop = asyncio.get_running_loop()
        acks: list[asyncio.Future[None]] = []
        denied: frozenset[str] = frozenset()
        default_topic = self._default_topic
        if self._write_verdicts is not None:
            topics = {record.topic or default_topic for record in records}
            denied = await self._write_verdicts.denied(topics)
        waiting = _Waiting(acks, records)
        waiting.timer = loop.call_later(self._attempt_timeout_s, self._overdue, waiting)
        produce = self._producer.produce
        append = self._reports.append
        for record in records:
            ack: asyncio.Future[None] = loop.create_future()
            acks.append(ack)
            topic = record.topic or default_topic
            if topic in denied:
                ack.set_exception(DeliveryDeniedError(f"the broker's ACLs deny writing to {topic}"))
                continue
            if not self._closed:
                try:  # the path where nothing fails, inline (once per record)
                    produce(
                        topic,
                        value=record.value,
                        key=record.key,
                        partition=-1 if record.partition is None else record.partition,
                        headers=record.headers or None,  # type: ignore[arg-type]  # invariance
                        on_delivery=functools.partial(_reported, append, ack, record, 0, waiting),
                    )
                except Exception:  # a full queue or a refusal: _try_produce sorts it out
                    pass
                else:
                    self._pending += 1
                    waiting.count += 1
                    continue
            if not self._try_produce(ack, record, topic, 0, waiting):
                await self._produce_when_room(ack, record, topic, 0, waiting)
            if not ack.done():
                waiting.count += 1
        if self._pending:
            self._drained.clear()
            self._poll_fast()
        waiting.sending = False
        if waiting.count == 0:
            waiting.release()
        return acks

    async def _produce_when_room(
        self,
        ack: asyncio.Future[None],
        record: OutRecord,
        topic: str,
        attempt: int,
        waiting: _Waiting,
    ) -> None:
        """Produce ``record`` once librdkafka's queue has room (:data:`BUFFER_FULL_WAIT_S`
        between tries); never dropped, unless the sink closes meanwhile."""
        while not self._try_produce(ack, record, topic, attempt, waiting):
            await asyncio.sleep(BUFFER_FULL_WAIT_S)

    def _try_produce(
        self,
        ack: asyncio.Future[None],
        record: OutRecord,
        topic: str,
        attempt: int,
        waiting: _Waiting,
    ) -> bool:
        """Hand ``record`` to librdkafka; a refusal (or a closed sink) fails ``ack`` at once.
        False when librdkafka's queue is full (``BufferError``: nothing done, try again).
        ``attempt``: how many times the record was produced before."""
        if self._closed:
            ack.set_exception(SinkClosedError("the sink is closed"))
            return True
        try:
            self._producer.produce(
                topic,
                value=record.value,
                key=record.key,
                partition=-1 if record.partition is None else record.partition,
                headers=record.headers or None,  # type: ignore[arg-type]  # list invariance
                on_delivery=functools.partial(
                    _reported, self._reports.append, ack, record, attempt, waiting
                ),
            )
        except BufferError:
            return False
        except KafkaException as err:
            kafka_err: KafkaError = err.args[0]
            ack.set_exception(
                delivery_error(kafka_err, topic)
                or DeliveryError(f"cannot send to {topic}[{record.partition}]: {kafka_err.str()}")
            )
            return True
        except (TypeError, ValueError) as err:
            ack.set_exception(DeliveryError(f"cannot send to {topic}: {err}"))
            return True
        self._pending += 1
        self._drained.clear()
        self._poll_fast()
        return True

    def _delivered(
        self, batch: list[tuple[asyncio.Future[None], OutRecord, int, _Waiting, Any]]
    ) -> None:
        """The delivery reports of one poll, on the loop."""
        self._pending -= len(batch)
        if self._pending <= 0:
            self._pending = 0
            self._drained.set()
        for ack, record, attempt, waiting, err in batch:
            if ack.done():
                continue  # failed at its deadline (transactional) already
            if err is None:
                ack.set_result(None)
                waiting.count -= 1  # inline waiting.settled(): once per record
                if waiting.count == 0 and not waiting.sending:
                    waiting.release()
                continue
            topic = record.topic or self._default_topic
            if err.fatal() and self.fatal_error is None:  # before error_cb may say so
                self.fatal_error = err
            failure = delivery_error(err, topic)
            if failure is None and (self._transactional or self._closed):
                failure = SinkClosedError(f"not acknowledged: {err.str()}")
            if failure is not None:
                ack.set_exception(failure)
                waiting.settled()
                continue
            log.warning("send to %s failed (%s); retrying", topic, err.str())
            task = asyncio.ensure_future(self._retry(ack, record, topic, attempt + 1, waiting))
            self._retries.add(task)
            task.add_done_callback(self._retries.discard)

    async def _retry(
        self,
        ack: asyncio.Future[None],
        record: OutRecord,
        topic: str,
        attempt: int,
        waiting: _Waiting,
    ) -> None:
        """Produce ``record`` again after a backoff (exponential, :data:`RETRY_BACKOFF_S`);
        the sink's close fails it instead."""
        first_s, max_s = RETRY_BACKOFF_S
        try:
            await asyncio.sleep(min(max_s, first_s * 2 ** (attempt - 1)))
            if not ack.done() and not self._try_produce(ack, record, topic, attempt, waiting):
                await self._produce_when_room(ack, record, topic, attempt, waiting)
        except asyncio.CancelledError:
            if not ack.done():
                ack.set_exception(SinkClosedError(f"the sink closed while retrying {topic}"))
            raise
        finally:
            if ack.done():  # refused when produced again, or closed: its report never comes
                waiting.settled()

    def _overdue(self, waiting: _Waiting) -> None:
        """The deadline of one :meth:`send` passed with some of its records unanswered:
        idempotent, one warning per :data:`LATE_LOG_EVERY_S` (librdkafka keeps retrying
        them); transactional, they fail with :class:`SinkClosedError`."""
        acks, records = waiting.acks, waiting.records
        waiting.release()
        late = [i for i, ack in enumerate(acks) if not ack.done()]
        if not late:
            return
        if self._transactional:
            for i in late:
                acks[i].set_exception(SinkClosedError("no acknowledgement in the transaction"))
            return
        self._late_records += len(late)
        now = asyncio.get_running_loop().time()
        if now < self._late_logged_until:
            return
        topics = sorted({records[i].topic or self._default_topic for i in late})
        log.warning(
            "%d records (to %s) not acknowledged within %g s; the producer keeps retrying them",
            self._late_records,
            ", ".join(topics),
            self._attempt_timeout_s,
        )
        self._late_records = 0
        self._late_logged_until = now + LATE_LOG_EVERY_S
