"""The owner thread of :class:`~consumer.kafka.confluent_adapter.source.ConfluentSource`: the
one thread that calls its librdkafka ``Consumer``, and the state only that thread touches.

Threading. A ``Consumer`` is not thread-safe, and librdkafka runs its callbacks (rebalance,
``error_cb``, ``logger``) inside ``consume()`` on the thread that calls it. So one daemon
thread, the *owner*, does every call on it:

- it loops ``consume(1, WAKE_S)`` (returns at the first record), then ``consume(n - 1, 0)``
  (what else is fetched already), ``n`` = ``max_poll_records``; the records, grouped by
  partition, go to the event loop in one ``call_soon_threadsafe``;
- between two such calls it runs the commands the loop queued (the ``*_now`` methods: pause,
  resume, seek, commit, committed, position, group metadata); each answers its asyncio future
  through ``call_soon_threadsafe``. A command waits at most ``WAKE_S`` for the ``consume``
  under way. The queue is :class:`~consumer.kafka.confluent_adapter.owner_thread.OwnerCommands`,
  the range readers' too; the loop around ``consume`` is this module's (the range readers'
  :class:`~consumer.kafka.confluent_adapter.owner_thread.ConsumerThread` neither wakes on the
  first record nor pauses librdkafka under backpressure). End offsets, and where an idle
  partition starts, are asked through an admin client on the loop's side, never here.

Backpressure. The owner stops taking records from librdkafka while
``BUFFERED_POLLS × max_poll_records`` records wait for the source's ``poll``. For a short
stall (up to ``HOLD_BACK_AFTER_S``) it only waits, running commands; librdkafka keeps what it
prefetched (bounded by its ``queued.max.messages.kbytes``). After that it must call ``consume``
again (rebalances are served only inside it, and librdkafka drops a member that does not call
it for ``max.poll.interval.ms``), so it pauses every assigned partition in librdkafka (its own
pause, apart from the loop's) and calls ``consume``, which then returns nothing; the pauses are
lifted once the loop has taken the records. librdkafka forgets what it prefetched for a paused
partition and fetches again from the last record handed out: nothing is lost or read twice.

Rebalances. The owner runs the rebalance handler's coroutine on the loop
(``run_coroutine_threadsafe``) from inside librdkafka's callback and, while it waits for it,
runs the commands the handler sends (pause, seek, commit, committed metadata, position)
without calling ``consume``. Assigned partitions are assigned in librdkafka *before* the
handler runs (so that pause works), revoked ones unassigned *after* it (so that its commit is
still the owner's).

- ``group_protocol="classic"``: eager, ``partition.assignment.strategy=roundrobin``, as
  aiokafka's default (``RoundRobinPartitionAssignor``; the same protocol name, so aiokafka and
  confluent members may share a group); every rebalance revokes every partition and assigns
  the new set, pauses forgotten (the handler re-applies them, as with aiokafka).
- ``group_protocol="consumer"`` (KIP-848): the broker assigns incrementally
  (``incremental_assign``/``incremental_unassign``): only partitions that move are revoked or
  assigned, and a partition that stays keeps its pause; a revocation is followed by an
  assignment, empty when nothing new comes (serve's handover then releases what it suspended).
  ``session.timeout.ms`` and ``heartbeat.interval.ms`` are the broker's (``group.consumer.*``)
  and not set (:func:`~consumer.kafka.confluent_adapter.source.consumer_config`).

librdkafka cannot seek a partition it has just been assigned (``_STATE`` until its fetcher
starts): such a seek is kept and tried again after each ``consume``, and the partition's
records are dropped until it succeeds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Final

from confluent_kafka import Consumer, KafkaError, KafkaException, Message
from confluent_kafka import TopicPartition as KafkaTP

from consumer.cpu.threads import name_os_thread
from consumer.kafka.confluent_adapter.errors import layer_error
from consumer.kafka.confluent_adapter.logs import (
    RepeatLimiter,
    librdkafka_logger,
    log_retried_error,
)
from consumer.kafka.confluent_adapter.owner_thread import OwnerCommands, resolve
from consumer.kafka.errors import (
    CommitError,
    FencedInstanceError,
    KafkaLayerError,
    KafkaSecurityError,
    KafkaUnavailableError,
)
from consumer.kafka.records import InRecord, Membership, TopicPartition

__all__ = [
    "BUFFERED_POLLS",
    "HOLD_BACK_AFTER_S",
    "LEAVE_TIMEOUT_S",
    "REQUEST_TIMEOUT_S",
    "START_TIMEOUT_S",
    "WAKE_S",
    "SourceOwner",
]

log = logging.getLogger("consumer.kafka.confluent_adapter")

WAKE_S: Final = 0.02
"""Longest wait of one ``consume`` for a first record (seconds): how long a command from the
loop (a commit, a pause) waits at most before the owner thread runs it while no record comes
(records end the wait at once). The pipeline awaits its commit inline, so this bounds what a
commit adds to the requests behind it: at 100 ms, p99 at 1,000 requests/s rose from ~23 to
~140 ms (``kbatch bench e2e --model sim:1,0.445``); an idle owner's 50 wakes a second cost
~7 ms of CPU a second."""

BUFFERED_POLLS: Final = 2
"""The owner thread stops taking records while this many ``max_poll_records`` wait."""

HOLD_BACK_AFTER_S: Final = 1.0
"""How long the owner thread waits for the loop to take buffered records before it pauses
every partition in librdkafka (seconds): a short stall costs nothing (librdkafka keeps what it
prefetched) and delays a rebalance by this much at most; a long one would delay it past
what a rebalance allows, so the owner goes back to ``consume`` with everything paused."""

START_TIMEOUT_S: Final = 15.0
"""Longest wait at start for a broker's answer (seconds); a refused connection to every
bootstrap broker fails sooner, as soon as librdkafka reports all brokers down."""

REQUEST_TIMEOUT_S: Final = 10.0
"""Longest wait of a committed-offset request on the owner thread (seconds). A synchronous
commit has no timeout in confluent-kafka: librdkafka's ``socket.timeout.ms`` (60 s) bounds
it, and the owner runs no other command meanwhile."""

LEAVE_TIMEOUT_S: Final = 5.0
"""Longest wait for a static member's leave (``ConfluentSource.leave_group_on_stop``)."""

_CGMD_MAGIC: Final = b"CGMDv2:"
"""librdkafka's serialized consumer group metadata: this magic, the generation (int32,
native order), then group id, member id and instance id (``rd_kafka_consumer_group_metadata_
write``); the generation is read nowhere else."""

RebalanceStep = Callable[[frozenset[TopicPartition], Membership], Coroutine[Any, Any, None]]
"""The loop's side of an assignment or a revocation: a coroutine of the partitions and the
membership they belong to."""


def _record(m: Message) -> InRecord:
    headers = m.headers()
    return InRecord(
        m.topic(),  # type: ignore[arg-type]
        m.partition(),  # type: ignore[arg-type]
        m.offset(),  # type: ignore[arg-type]
        m.key(),
        m.value(),
        tuple(headers) if headers else (),  # type: ignore[arg-type]
        m.timestamp()[1],
    )


class SourceOwner:
    """The ``Consumer`` of one :class:`~consumer.kafka.confluent_adapter.source.ConfluentSource`
    and the work of the thread that owns it (module docstring). :meth:`run` is that thread's
    body; every other method runs on it too, as a command from ``commands`` or inside
    librdkafka's callbacks, except :meth:`stop`.

    Across the threads: the loop sets :attr:`stopping` (through :meth:`stop`) and
    :attr:`leave_on_stop` and counts :attr:`taken`; the owner counts :attr:`sent`, sets
    :attr:`held_back` and :attr:`stalled` (which the loop clears, waking the owner, once it
    took records). The loop's side is reached only through the callables given here, each
    scheduled on the loop and never called on the owner thread.

    Args:
        config: the consumer's librdkafka properties (``consumer_config``); ``logger`` and
            ``error_cb`` are set here.
        commands: the queue the loop's commands come through.
        deliver: takes the records of one ``consume``.
        fail: takes a failure the loop's ``poll`` then raises.
        seek_applied: told once a seek the loop sent has been run.
        assigned_on_loop: the loop's side of an assignment, awaited inside librdkafka's
            callback once the partitions are assigned.
        revoked_on_loop: the loop's side of a revocation or a loss, awaited inside librdkafka's
            callback before the partitions are unassigned.
        bootstrap: the brokers, in the error of a failed start.
        group_id, instance_id, topics: the member, for librdkafka's errors in kbatch's terms
            (:func:`~consumer.kafka.confluent_adapter.errors.layer_error`).
        max_poll_records: most records one round of ``consume`` takes.
        cooperative: the consumer group protocol's incremental assignment.
        leave_on_stop: leave the group on close even as a static member (a dynamic one always
            leaves).
    """

    def __init__(
        self,
        config: Mapping[str, object],
        commands: OwnerCommands,
        *,
        deliver: Callable[[list[InRecord]], None],
        fail: Callable[[KafkaLayerError], None],
        seek_applied: Callable[[TopicPartition], None],
        assigned_on_loop: RebalanceStep,
        revoked_on_loop: RebalanceStep,
        bootstrap: str,
        group_id: str,
        instance_id: str | None,
        topics: tuple[str, ...],
        max_poll_records: int,
        cooperative: bool,
        leave_on_stop: bool,
    ) -> None:
        self._librdkafka_log = librdkafka_logger("source")
        self._retried = RepeatLimiter()  # error_cb's retried errors, once a minute each
        self._config = {**config, "logger": self._librdkafka_log, "error_cb": self._on_error}
        self._commands = commands
        self._deliver = deliver
        self._fail = fail
        self._seek_applied = seek_applied
        self._assigned_on_loop = assigned_on_loop
        self._revoked_on_loop = revoked_on_loop
        self._bootstrap = bootstrap
        self._group_id = group_id
        self._instance_id = instance_id
        self._topics = topics
        self._max_poll_records = max_poll_records
        self._cooperative = cooperative
        # ---- across the threads ----
        self.leave_on_stop = leave_on_stop
        """Set on the loop: leave the group on close even as a static member."""
        self.stopping = False
        """Set on the loop (:meth:`stop`): the thread closes at its next round."""
        self.taken = 0
        """Records out of the loop's buffer: polled, dropped or held (held ones count back on
        resume); written on the loop."""
        self.sent = 0
        """Records handed to the loop; written by the owner."""
        self.held_back = False
        """Every owned partition paused in librdkafka for backpressure."""
        self.stalled = False
        """The owner waits for the loop to take records (the loop clears it and wakes it)."""
        # ---- touched by the owner thread only ----
        self._loop: asyncio.AbstractEventLoop | None = None
        self._consumer: Consumer | None = None
        self._owned: set[TopicPartition] = set()
        self._app_paused: set[TopicPartition] = set()
        self._pending_seeks: dict[TopicPartition, int] = {}
        self._sought: dict[TopicPartition, int] = {}
        self._closing = False
        self._fatal = False
        self._start_errors: list[KafkaError] = []
        self._starting = True

    def stop(self) -> None:
        """On the loop: make the thread leave the group, close the consumer and end."""
        self.stopping = True
        self._commands.wake()

    # ---- the thread -----------------------------------------------------------------------------

    def run(
        self,
        loop: asyncio.AbstractEventLoop,
        started: asyncio.Future[None],
        stopped: asyncio.Future[None],
    ) -> None:
        """The owner thread: connect (``started`` answers, or raises what failed), consume until
        :meth:`stop`, close; ``stopped`` answers once the consumer is closed."""
        self._loop = loop
        name_os_thread("kbatch-source")  # top -H, ps -L: the thread's role (consumer.cpu.threads)
        try:
            try:
                self._consumer = self._connect()
            except BaseException as err:
                loop.call_soon_threadsafe(resolve, started, None, err)
                return
            loop.call_soon_threadsafe(resolve, started, None, None)
            self._consume_until_stopped()
        except Exception:
            log.exception("the Kafka consumer thread failed")
            loop.call_soon_threadsafe(
                self._fail, KafkaUnavailableError("the Kafka consumer thread failed (logged)")
            )
        finally:
            self._close()
            self._commands.end()  # what was queued too late is answered as after stop()
            with contextlib.suppress(RuntimeError):  # the loop is closed already
                loop.call_soon_threadsafe(resolve, stopped, None, None)

    def _connect(self) -> Consumer:
        """Create the consumer, wait for a broker's answer, subscribe.

        Raises:
            KafkaUnavailableError, KafkaSecurityError: see ``ConfluentSource.start``.
        """
        context = f"no Kafka broker answered at {self._bootstrap}"
        try:
            consumer = Consumer(self._config)
        except KafkaException as err:
            raise KafkaUnavailableError(f"{context}: {err.args[0]}") from None
        deadline = time.monotonic() + START_TIMEOUT_S
        cause = "no answer"
        try:
            while True:
                try:
                    consumer.list_topics(timeout=min(1.0, max(0.1, deadline - time.monotonic())))
                    break
                except KafkaException as err:
                    cause = err.args[0].str()
                consumer.poll(0)  # serves error_cb: why the connection failed
                for e in self._start_errors:
                    refusal = self._layer_error(e)
                    if refusal is not None:
                        raise refusal
                down = [e for e in self._start_errors if e.code() == KafkaError._ALL_BROKERS_DOWN]
                transport = [e for e in self._start_errors if e.code() == KafkaError._TRANSPORT]
                if transport:
                    cause = transport[-1].str()
                if down or time.monotonic() >= deadline:
                    raise KafkaUnavailableError(f"{context}: {cause}")
            consumer.subscribe(
                list(self._topics),
                on_assign=self._on_assign,
                on_revoke=self._on_revoke,
                on_lost=self._on_lost,
            )
        except BaseException:
            self._closing = True
            with contextlib.suppress(Exception):
                consumer.close()
            raise
        finally:
            self._starting = False
            self._start_errors.clear()
        return consumer

    def _layer_error(self, err: KafkaError) -> KafkaLayerError | None:
        return layer_error(
            err, group_id=self._group_id, instance_id=self._instance_id, topics=self._topics
        )

    def _on_error(self, err: KafkaError) -> None:
        """librdkafka's ``error_cb`` (on the owner thread, inside ``consume``)."""
        if self._starting:
            self._start_errors.append(err)
            return
        failure = self._layer_error(err)
        if failure is None:
            log_retried_error(self._librdkafka_log, err, self._retried)
            return
        self._raise_on_loop(failure, fatal=err.fatal())

    def _raise_on_loop(self, failure: KafkaLayerError, *, fatal: bool) -> None:
        if fatal:
            self._fatal = True
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._fail, failure)

    def _consume_until_stopped(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        limit = BUFFERED_POLLS * self._max_poll_records
        n = self._max_poll_records
        stalled_s = 0.0  # since when the buffer is full (monotonic s), 0 when it is not
        while not self.stopping:
            self._commands.serve()
            if self.stopping:
                break
            if self._fatal:  # nothing more to read; commands until stop()
                self._commands.serve(None)
                continue
            if self.sent - self.taken >= limit:  # the loop is behind: take nothing
                now_s = time.monotonic()
                stalled_s = stalled_s or now_s
                if not self.held_back and now_s - stalled_s >= HOLD_BACK_AFTER_S:
                    self._hold_back(True)
                if not self.held_back:  # a short stall: librdkafka keeps what it prefetched
                    self.stalled = True  # the loop wakes it once it has taken records
                    self._commands.serve(WAKE_S)
                    self.stalled = False
                    continue
            else:
                stalled_s = 0.0
                if self.held_back:
                    self._hold_back(False)
            try:
                messages = consumer.consume(1, WAKE_S)
                if messages:
                    messages.extend(consumer.consume(n - 1, 0))
            except KafkaLayerError as err:  # raised by a callback (oauth_cb: the token file)
                self._raise_on_loop(err, fatal=True)
                continue
            except KafkaException as err:
                failure = self._layer_error(err.args[0]) or KafkaUnavailableError(str(err))
                self._raise_on_loop(failure, fatal=True)
                continue
            if messages:
                self._hand_over(messages)
            if self._pending_seeks:
                for tp, offset in list(self._pending_seeks.items()):
                    self.seek_now(tp, offset, retry=True)

    def _hand_over(self, messages: list[Message]) -> None:
        """Group ``messages`` by partition and hand them to the loop in one call."""
        by_tp: dict[TopicPartition, list[InRecord]] = {}
        pending = self._pending_seeks
        for m in messages:
            err = m.error()
            if err is not None:
                self._message_error(err, m)
                continue
            r = _record(m)
            if r.tp in pending:  # read before the seek: dropped
                continue
            batch = by_tp.get(r.tp)
            if batch is None:
                batch = by_tp[r.tp] = []
            batch.append(r)
        if not by_tp:
            return
        records = [r for batch in by_tp.values() for r in batch]
        if self._sought:
            for tp in by_tp:
                self._sought.pop(tp, None)
        self.sent += len(records)
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._deliver, records)

    def _message_error(self, err: KafkaError, m: Message) -> None:
        if err.code() == KafkaError._PARTITION_EOF:
            return
        failure = self._layer_error(err)
        if failure is not None:
            self._raise_on_loop(failure, fatal=err.fatal())
        else:
            log_retried_error(self._librdkafka_log, err, self._retried)

    def _hold_back(self, hold: bool) -> None:
        """Pause every owned partition in librdkafka (``hold``) or lift that, keeping the
        loop's own pauses."""
        assert self._consumer is not None
        targets = [KafkaTP(*tp) for tp in self._owned - self._app_paused]
        if targets:
            (self._consumer.pause if hold else self._consumer.resume)(targets)
        self.held_back = hold

    # ---- the loop's commands (run between two consume calls) ------------------------------------

    def pause_now(self, tps: list[TopicPartition]) -> None:
        """Pause ``tps`` in librdkafka (those still owned)."""
        assert self._consumer is not None
        targets = [tp for tp in tps if tp in self._owned]
        self._app_paused.update(targets)
        if targets:
            self._consumer.pause([KafkaTP(*tp) for tp in targets])

    def resume_now(self, tps: list[TopicPartition]) -> None:
        """Resume ``tps`` in librdkafka (those still owned; held back until the loop catches
        up)."""
        assert self._consumer is not None
        targets = [tp for tp in tps if tp in self._owned]
        self._app_paused.difference_update(targets)
        if targets and not self.held_back:
            self._consumer.resume([KafkaTP(*tp) for tp in targets])

    def seek_now(self, tp: TopicPartition, offset: int, *, retry: bool = False) -> None:
        """Seek ``tp`` to ``offset``; while librdkafka cannot yet, the seek is kept and tried
        again after each ``consume`` (``retry``). The loop is told once the first try ran."""
        assert self._consumer is not None and self._loop is not None
        try:
            if tp not in self._owned:
                self._pending_seeks.pop(tp, None)
                return
            try:
                self._consumer.seek(KafkaTP(tp[0], tp[1], offset))
            except KafkaException as err:
                if err.args[0].code() != KafkaError._STATE:
                    self._pending_seeks.pop(tp, None)
                    log.warning("seek of %s to %d failed: %s", tp, offset, err.args[0])
                    return
                self._pending_seeks[tp] = offset  # its fetcher has not started yet
                return
            self._pending_seeks.pop(tp, None)
            self._sought[tp] = offset
        finally:
            if not retry:
                with contextlib.suppress(RuntimeError):
                    self._loop.call_soon_threadsafe(self._seek_applied, tp)

    def commit_now(self, targets: list[KafkaTP], context: str) -> None:
        """Commit ``targets`` synchronously.

        Raises:
            CommitError, KafkaSecurityError, FencedInstanceError: the commit failed
                (``context`` leads the message).
        """
        assert self._consumer is not None
        try:
            done = self._consumer.commit(offsets=targets, asynchronous=False)
        except KafkaException as err:
            raise self._commit_error(err.args[0], context) from None
        for tp in done or []:
            if tp.error is not None:
                raise self._commit_error(tp.error, context)

    def _commit_error(self, err: KafkaError, context: str) -> KafkaLayerError:
        failure = self._layer_error(err)
        if isinstance(failure, KafkaSecurityError):
            return KafkaSecurityError(
                f"{context}: the broker denies it: {err.name()} ({err.str()})"
            )
        if isinstance(failure, FencedInstanceError):
            return failure
        return CommitError(f"{context}: {err.str()}")

    def committed_now(self, tp: TopicPartition) -> tuple[int | None, str]:
        """The group's committed offset of ``tp`` and its metadata (``(None, "")``: none).

        Raises:
            KafkaException: the coordinator refused or did not answer in
                :data:`REQUEST_TIMEOUT_S`.
        """
        assert self._consumer is not None
        [found] = self._consumer.committed([KafkaTP(*tp)], timeout=REQUEST_TIMEOUT_S)
        if found.error is not None:
            raise KafkaException(found.error)
        if found.offset < 0:
            return None, ""
        return int(found.offset), found.metadata or ""

    def position_now(self, tp: TopicPartition) -> int | None:
        """The next offset librdkafka hands out of ``tp`` (a seek not yet read counts); None
        when not owned or not known yet."""
        assert self._consumer is not None
        if tp not in self._owned:
            return None
        if tp in self._pending_seeks:
            return self._pending_seeks[tp]
        if tp in self._sought:
            return self._sought[tp]
        [at] = self._consumer.position([KafkaTP(*tp)])
        return int(at.offset) if at.offset >= 0 else None

    def group_metadata_now(self) -> object:
        """librdkafka's opaque consumer group metadata of this member."""
        assert self._consumer is not None
        return self._consumer.consumer_group_metadata()

    def _membership_now(self) -> Membership:
        assert self._consumer is not None
        try:
            member = self._consumer.memberid() or ""
            data = self._consumer.consumer_group_metadata()
        except (KafkaException, RuntimeError):
            return Membership("", -1)
        generation = -1
        if isinstance(data, bytes) and data.startswith(_CGMD_MAGIC) and len(data) >= 11:
            (generation,) = struct.unpack_from("=i", data, len(_CGMD_MAGIC))
        return Membership(member, generation if member else -1)

    # ---- rebalances (librdkafka's callbacks, inside consume) ------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[KafkaTP]) -> None:
        tps = frozenset((p.topic, p.partition) for p in partitions)
        try:
            if self._cooperative:
                consumer.incremental_assign(partitions)
            else:
                consumer.assign(partitions)
            if partitions:
                consumer.resume(partitions)  # a pause never outlives an assignment
                if self.held_back:
                    consumer.pause(partitions)
            self._owned = (self._owned | tps) if self._cooperative else set(tps)
            self._app_paused -= tps
            if not self._closing:
                self._commands.await_on_loop(self._assigned_on_loop(tps, self._membership_now()))
        except Exception:
            log.exception("assignment of %s failed", sorted(tps))

    def _on_revoke(self, consumer: Consumer, partitions: list[KafkaTP]) -> None:
        self._revoke(consumer, partitions, lost=False)

    def _on_lost(self, consumer: Consumer, partitions: list[KafkaTP]) -> None:
        self._revoke(consumer, partitions, lost=True)

    def _revoke(self, consumer: Consumer, partitions: list[KafkaTP], *, lost: bool) -> None:
        tps = frozenset((p.topic, p.partition) for p in partitions)
        try:
            if lost:
                log.warning("partitions %s lost (the group dropped this member)", sorted(tps))
            if not self._closing:
                self._commands.await_on_loop(self._revoked_on_loop(tps, self._membership_now()))
            if self._cooperative:
                consumer.incremental_unassign(partitions)
            else:
                consumer.unassign()
        except Exception:
            log.exception("revocation of %s failed", sorted(tps))
        finally:
            self._owned -= tps
            self._app_paused -= tps
            for tp in tps:
                self._pending_seeks.pop(tp, None)
                self._sought.pop(tp, None)

    # ---- closing --------------------------------------------------------------------------------

    def _close(self) -> None:
        """Leave (see ``ConfluentSource.stop``: a static member only under the classic
        protocol, and only with :attr:`leave_on_stop`) and close the consumer."""
        consumer = self._consumer
        if consumer is None:
            return
        self._closing = True
        try:
            static_leave = self.leave_on_stop and self._instance_id is not None
            if static_leave and not self._fatal and not self._cooperative:
                consumer.unsubscribe()  # unlike close(), sends a static member's LeaveGroup
                deadline = time.monotonic() + LEAVE_TIMEOUT_S
                while consumer.assignment() and time.monotonic() < deadline:
                    consumer.consume(self._max_poll_records, 0.1)
                log.info("static member %r leaves the group on shutdown", self._instance_id)
            elif static_leave and not self._fatal:
                log.warning(
                    "static member %r cannot leave the group for good under the consumer group "
                    "protocol (librdkafka's leave of a static member keeps its partitions): "
                    "they move after the broker's group.consumer.session.timeout.ms",
                    self._instance_id,
                )
            consumer.close()
        except Exception as err:
            log.warning("closing the Kafka consumer: %s", err)
        finally:
            self._consumer = None
