"""The request source on confluent-kafka (librdkafka): one ``Consumer`` in a consumer group,
read in poll-sized chunks; a drop-in for :class:`consumer.kafka.source.KafkaSource`
(:class:`consumer.kafka.transport.GroupSource`).

Threading. A ``Consumer`` is not thread-safe, and librdkafka runs its callbacks (rebalance,
``error_cb``, ``logger``) inside ``consume()`` on the thread that calls it. So one daemon
thread, the *owner*, does every call on it:

- it loops ``consume(1, WAKE_S)`` (returns at the first record), then ``consume(n - 1, 0)``
  (what else is fetched already), ``n`` = ``max_poll_records``; the records, grouped by
  partition, go to the event loop in one ``call_soon_threadsafe``;
- between two such calls it runs the commands the loop queued (pause, resume, seek, commit,
  committed, end offsets, position); each answers its asyncio future through
  ``call_soon_threadsafe``. A command waits at most ``WAKE_S`` for the ``consume`` under way.
  The queue is :class:`~consumer.kafka.confluent_adapter.owner_thread.OwnerCommands`, the
  range readers' too; the loop around ``consume`` is this module's (the range readers'
  :class:`~consumer.kafka.confluent_adapter.owner_thread.ConsumerThread` neither wakes on the
  first record nor pauses librdkafka under backpressure).

Backpressure. The owner stops taking records from librdkafka while
``BUFFERED_POLLS × max_poll_records`` records wait for :meth:`ConfluentSource.poll`. For a
short stall (up to ``HOLD_BACK_AFTER_S``) it only waits, running commands; librdkafka keeps
what it prefetched (bounded by its ``queued.max.messages.kbytes``). After that it must call
``consume`` again (rebalances are served only inside it, and librdkafka drops a member that
does not call it for ``max.poll.interval.ms``), so it pauses every assigned partition in
librdkafka (its own pause, apart from the loop's) and calls ``consume``, which then returns
nothing; the pauses are lifted once the loop has taken the records. librdkafka forgets what
it prefetched for a paused partition and fetches again from the last record handed out:
nothing is lost or read twice.

Pauses seen by the loop are exact: :meth:`ConfluentSource.pause` takes effect at once for
:meth:`~ConfluentSource.poll` (records of the partition already handed over are *held* and
returned, in order, after :meth:`~ConfluentSource.resume`), and in librdkafka at the owner's
next command round.

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
  ``session.timeout.ms`` and
  ``heartbeat.interval.ms`` are the broker's (``group.consumer.*``) and not set here.

librdkafka cannot seek a partition it has just been assigned (``_STATE`` until its fetcher
starts): such a seek is kept and tried again after each ``consume``, and the partition's
records are dropped until it succeeds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, TypeVar

from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Message,
)
from confluent_kafka import TopicPartition as KafkaTP
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]  # public, not in __all__

from consumer.kafka.config import ConsumerGroupSettings, GroupProtocol, KafkaClientSettings
from consumer.kafka.confluent_adapter.client_config import client_config
from consumer.kafka.confluent_adapter.commit_points import commit_point
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
from consumer.kafka.records import InRecord, Membership, RebalanceHandler, TopicPartition

__all__ = ["ConfluentSource", "consumer_config"]

log = logging.getLogger("consumer.kafka.confluent_adapter")

T = TypeVar("T")

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

END_OFFSETS_TIMEOUT_S: Final = 5.0
"""Longest wait for the end offsets of one :meth:`ConfluentSource.end_offsets` (seconds)."""

LEAVE_TIMEOUT_S: Final = 5.0
"""Longest wait for a static member's leave (:meth:`ConfluentSource.leave_group_on_stop`)."""

_CGMD_MAGIC: Final = b"CGMDv2:"
"""librdkafka's serialized consumer group metadata: this magic, the generation (int32,
native order), then group id, member id and instance id (``rd_kafka_consumer_group_metadata_
write``); the generation is read nowhere else."""


def consumer_config(
    client: KafkaClientSettings,
    group: ConsumerGroupSettings,
    *,
    group_id: str,
    group_protocol: GroupProtocol,
) -> dict[str, object]:
    """The librdkafka consumer's properties (without the callbacks): auto-commit and offset
    store off, ``read_committed``, the group's timeouts, metadata refreshed every 30 s (a
    topic created after start is seen within 30 s, as :class:`KafkaSource` does).

    ``rebalance_timeout_ms`` has no librdkafka property: the classic JoinGroup's rebalance
    timeout is ``max.poll.interval.ms``.

    Raises:
        KafkaSecurityError: a CA/key/password/token file cannot be read.
    """
    config: dict[str, object] = {
        **client_config(client),
        "group.id": group_id,
        "client.id": f"kbatch-{group.group_instance_id or 'consumer'}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "isolation.level": "read_committed",
        "auto.offset.reset": group.auto_offset_reset,
        "max.poll.interval.ms": group.max_poll_interval_ms,
        "topic.metadata.refresh.interval.ms": 30_000,
    }
    if group.group_instance_id is not None:
        config["group.instance.id"] = group.group_instance_id
    if group_protocol == "consumer":
        config["group.protocol"] = "consumer"
    else:
        config["session.timeout.ms"] = group.session_timeout_ms
        config["heartbeat.interval.ms"] = group.heartbeat_interval_ms
        config["partition.assignment.strategy"] = "roundrobin"
    return config


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


class ConfluentSource:
    """The consumer side of ``kbatch serve`` on confluent-kafka (module docstring).

    Args:
        client: the brokers and security.
        group: the group member's settings and timeouts.
        handler: called on revoke/assign (see :class:`RebalanceHandler`).
        group_id: the consumer group.
        topics: topics to subscribe to.
        max_poll_records: most records one ``consume`` takes (and one :meth:`poll` returns).
        group_protocol: ``classic`` or ``consumer`` (KIP-848).

    Raises:
        KafkaSecurityError: a CA/key/password/token file cannot be read.
    """

    def __init__(
        self,
        client: KafkaClientSettings,
        group: ConsumerGroupSettings,
        handler: RebalanceHandler,
        *,
        group_id: str,
        topics: Iterable[str],
        max_poll_records: int,
        group_protocol: GroupProtocol = "classic",
    ) -> None:
        self._bootstrap = client.bootstrap
        self._group_id = group_id
        self._handler = handler
        self._instance_id = group.group_instance_id
        self._leave_on_stop = group.leave_group_on_shutdown
        self._start_at_earliest = group.auto_offset_reset == "earliest"
        self._topics = tuple(topics)
        self._max_poll_records = max_poll_records
        self._cooperative = group_protocol == "consumer"
        self._librdkafka_log = librdkafka_logger("source")
        self._retried = RepeatLimiter()  # error_cb's retried errors, once a minute each
        self._config = consumer_config(
            client, group, group_id=group_id, group_protocol=group_protocol
        )
        self._config["logger"] = self._librdkafka_log
        # Offsets asked of the brokers (end offsets, an idle partition's start) go through an
        # admin client, never the owner thread: a round trip there stops consume() meanwhile.
        self._admin_config: dict[str, Any] = {
            **client_config(client),
            "logger": librdkafka_logger("admin"),
        }
        self._admin: AdminClient | None = None
        self._config["error_cb"] = self._on_error
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._commands = OwnerCommands("kbatch-confluent-source")  # woken: stop, buffer room
        self._stopping = False  # set by stop(); read by the owner thread
        self._stopped: asyncio.Future[None] | None = None
        # ---- the loop's side (touched on the event loop only) ----
        self._assigned: set[TopicPartition] = set()
        self._paused: set[TopicPartition] = set()
        self._revoking: set[TopicPartition] = set()
        self._seeking: dict[TopicPartition, int] = {}  # seeks not yet applied by the owner
        self._buffer: deque[InRecord] = deque()
        self._held: dict[TopicPartition, list[InRecord]] = {}
        self._ready = asyncio.Event()
        self._failure: KafkaLayerError | None = None
        self._membership = Membership("", -1)
        self._taken = 0  # records taken out of the buffer; read by the owner thread
        # ---- the owner thread's side ----
        self._consumer: Consumer | None = None
        self._sent = 0  # records handed to the loop
        self._owned: set[TopicPartition] = set()
        self._app_paused: set[TopicPartition] = set()
        self._held_back = False  # every owned partition paused for backpressure
        self._stalled = False  # waiting for the loop to take records (the loop reads it)
        self._pending_seeks: dict[TopicPartition, int] = {}
        self._sought: dict[TopicPartition, int] = {}
        self._closing = False
        self._fatal = False
        self._start_errors: list[KafkaError] = []
        self._starting = True

    # ---- lifecycle (loop) -----------------------------------------------------------------------

    @property
    def incremental(self) -> bool:
        """True under the consumer protocol: the handler gets only the partitions that move
        (:attr:`consumer.kafka.transport.GroupSource.incremental`)."""
        return self._cooperative

    async def start(self) -> None:
        """Connect and subscribe; partitions arrive through the rebalance handler.

        Raises:
            KafkaUnavailableError: no broker answered at ``client.bootstrap`` within
                :data:`START_TIMEOUT_S` (sooner when every connection is refused).
            KafkaSecurityError: a TLS check or the SASL login failed (``the broker at
                host:port refused the client: <cause>``).
        """
        loop = self._loop = self._commands.loop = asyncio.get_running_loop()
        started: asyncio.Future[None] = loop.create_future()
        self._stopped = loop.create_future()
        self._thread = threading.Thread(
            target=self._own, args=(started,), name="kbatch-confluent-source", daemon=True
        )
        self._thread.start()
        await started

    def leave_group_on_stop(self) -> None:
        """Make :meth:`stop` leave the group even as a static member (a wedged engine:
        :mod:`consumer.serve.wedge`), so the group moves the partitions at once instead of
        keeping them for a restart within the session timeout."""
        self._leave_on_stop = True

    async def stop(self) -> None:
        """Leave the group and close (idempotent).

        A dynamic member always leaves (``close()``: LeaveGroup, or the consumer protocol's
        leave heartbeat). A static member leaves only with ``leave_group_on_shutdown``, and
        only under the classic protocol: librdkafka's ``close()`` never sends a static member's
        LeaveGroup (KIP-345, as Kafka's Java client), but its ``unsubscribe()`` does, so the
        owner unsubscribes first and waits up to :data:`LEAVE_TIMEOUT_S` for the unassignment.
        Under the consumer protocol librdkafka's leave of a static member (member epoch -2)
        keeps its partitions, ``unsubscribe()`` as well: they move after the broker's
        ``group.consumer.session.timeout.ms`` (45 s by default; logged as a WARNING). The
        rebalance handler is not called on the way out (aiokafka does not either). A fenced
        member only closes.
        """
        if self._thread is None or self._stopped is None:
            return
        self._stopping = True
        self._commands.wake()
        await asyncio.shield(self._stopped)
        self._assigned.clear()
        self._paused.clear()
        self._buffer.clear()
        self._held.clear()
        self._membership = Membership("", -1)
        self._admin = None  # librdkafka closes it once collected

    # ---- reading (loop) -------------------------------------------------------------------------

    async def poll(self, max_records: int, timeout_ms: int) -> list[InRecord]:
        """At most ``max_records`` records, each partition's in offset order, grouped by
        partition within what one ``consume`` took; waits at most ``timeout_ms`` for the
        first; empty when paused or idle.

        Raises:
            FencedInstanceError: another member took this static member's id.
            KafkaSecurityError: the broker denies reading the topics or joining the group, or
                a TLS/SASL refusal.
            KafkaUnavailableError: librdkafka failed for good (a fatal error).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        while True:
            if self._failure is not None:
                raise self._failure
            out = self._take(max_records)
            left_s = deadline - loop.time()
            if out or left_s <= 0:
                return out
            self._ready.clear()
            try:
                async with asyncio.timeout(left_s):
                    await self._ready.wait()
            except TimeoutError:
                return []

    def _take(self, max_records: int) -> list[InRecord]:
        out: list[InRecord] = []
        buffer, paused, assigned, revoking = (
            self._buffer,
            self._paused,
            self._assigned,
            self._revoking,
        )
        taken = 0
        while buffer and len(out) < max_records:
            r = buffer.popleft()
            taken += 1
            tp = r.tp
            if tp in paused:
                self._held.setdefault(tp, []).append(r)
            elif tp in assigned and tp not in revoking:
                out.append(r)
        self._taken += taken
        if self._stalled and taken:
            self._stalled = False
            self._commands.wake()  # the owner thread waits for room
        return out

    def _deliver(self, records: list[InRecord]) -> None:
        """On the loop: records the owner took from librdkafka (one call per ``consume``)."""
        if self._seeking:
            kept = [r for r in records if r.tp not in self._seeking]
            self._taken += len(records) - len(kept)
            records = kept
        self._buffer.extend(records)
        self._ready.set()

    def _fail(self, error: KafkaLayerError) -> None:
        if self._failure is None:
            self._failure = error
        self._ready.set()

    def _drop(self, tps: set[TopicPartition] | frozenset[TopicPartition]) -> None:
        """Forget the buffered and held records of ``tps``."""
        for tp in tps:
            self._held.pop(tp, None)
        if any(r.tp in tps for r in self._buffer):
            kept = deque(r for r in self._buffer if r.tp not in tps)
            self._taken += len(self._buffer) - len(kept)
            self._buffer = kept

    # ---- the group (loop) -----------------------------------------------------------------------

    def membership(self) -> Membership:
        """This member's id and group generation (``("", -1)`` outside the group): in the
        revoke handler the generation being left, in the assign handler the new one (under
        the consumer protocol: the member epoch)."""
        return self._membership

    def assignment(self) -> frozenset[TopicPartition]:
        """The partitions this member owns now."""
        return frozenset(self._assigned)

    def pause(self, tps: Iterable[TopicPartition]) -> None:
        """Stop fetching these partitions (only those still assigned)."""
        targets = [tp for tp in tps if tp in self._assigned]
        if targets:
            self._paused.update(targets)
            self._send(lambda: self._pause_now(targets))

    def resume(self, tps: Iterable[TopicPartition]) -> None:
        """Fetch these partitions again (only those still assigned)."""
        targets = [tp for tp in tps if tp in self._assigned]
        if not targets:
            return
        for tp in targets:
            self._paused.discard(tp)
            held = self._held.pop(tp, None)
            if held:
                self._buffer.extendleft(reversed(held))
                self._taken -= len(held)
                self._ready.set()
        self._send(lambda: self._resume_now(targets))

    def paused(self) -> frozenset[TopicPartition]:
        """The partitions paused in the client right now."""
        return frozenset(self._paused)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Read ``tp`` from ``offset`` next (a partition no longer assigned is left alone)."""
        if tp not in self._assigned:
            return
        self._drop({tp})
        self._seeking[tp] = self._seeking.get(tp, 0) + 1
        self._send(lambda: self._seek_now(tp, offset))

    def _seek_applied(self, tp: TopicPartition) -> None:
        n = self._seeking.get(tp, 0) - 1
        if n > 0:
            self._seeking[tp] = n
        else:
            self._seeking.pop(tp, None)

    async def commit(
        self,
        offsets: Mapping[TopicPartition, int],
        metadata: Mapping[TopicPartition, str] | None = None,
    ) -> None:
        """Commit ``offsets`` (next offset to read, per partition) for this group, each with
        its ``metadata`` string ("" when not given; :mod:`consumer.kafka.offset_metadata`).

        Raises:
            CommitError: the group is rebalancing, the partition is no longer ours, or the
                broker refused the metadata (longer than its ``offset.metadata.max.bytes``).
            KafkaSecurityError: the broker's ACLs deny the commit.
        """
        if not offsets:
            return
        meta = metadata or {}
        targets = [commit_point(t, p, off, meta.get((t, p), "")) for (t, p), off in offsets.items()]
        context = f"commit of {dict(offsets)} failed"
        await self._call(
            lambda: self._commit_now(targets, context), CommitError(f"{context}: closed")
        )

    async def committed(self, tp: TopicPartition) -> int | None:
        """The group's committed offset of ``tp`` (None when it has none)."""
        offset, _ = await self._committed_point(tp, quiet=True)
        return offset

    async def committed_metadata(self, tp: TopicPartition) -> tuple[int | None, str]:
        """The group's committed offset of ``tp`` and its metadata string; ``(None, "")``
        when it has none or the broker does not answer (logged)."""
        return await self._committed_point(tp, quiet=False)

    async def _committed_point(self, tp: TopicPartition, *, quiet: bool) -> tuple[int | None, str]:
        try:
            return await self._call(lambda: self._committed_now(tp), (None, ""))
        except KafkaException as err:
            if not quiet:
                log.warning("committed offset of %s not available: %s", tp, err.args[0])
            return None, ""

    async def end_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The log end offset (the last stable offset under ``read_committed``) of each of
        ``tps``, asked of the partition leaders (``get_watermark_offsets``, not the cached
        fetch values), so current for paused partitions too. Empty when the broker does not
        answer within :data:`END_OFFSETS_TIMEOUT_S` (the next call tries again)."""
        targets = list(tps)
        if not targets or self._stopped is None or self._stopped.done():
            return {}
        try:
            return await self._list_offsets(targets, OffsetSpec.latest())  # type: ignore[no-untyped-call]
        except (KafkaException, TimeoutError) as err:
            log.warning("end offsets not available: %s", err.args[0] if err.args else err)
            return {}

    async def _list_offsets(
        self, tps: list[TopicPartition], spec: OffsetSpec
    ) -> dict[TopicPartition, int]:
        """``spec``'s offset of each of ``tps`` (``read_committed``: the last stable offset for
        the latest), in one admin request per leader, within :data:`END_OFFSETS_TIMEOUT_S`.

        Raises:
            KafkaException: a partition's leader refused or did not answer.
        """
        if self._admin is None:
            self._admin = AdminClient(self._admin_config)
        futures = self._admin.list_offsets(
            {KafkaTP(*tp): spec for tp in tps},
            isolation_level=IsolationLevel.READ_COMMITTED,
            request_timeout=END_OFFSETS_TIMEOUT_S,
        )
        found: dict[TopicPartition, int] = {}
        for ktp, future in futures.items():
            info = await asyncio.wait_for(asyncio.wrap_future(future), END_OFFSETS_TIMEOUT_S + 1)
            found[(ktp.topic, ktp.partition)] = int(info.offset)
        return found

    async def position(self, tp: TopicPartition) -> int | None:
        """The next offset this member will read from ``tp`` (None when not assigned, or
        before librdkafka knows where it starts)."""
        if tp not in self._assigned:
            return None
        at = await self._call(lambda: self._position_now(tp), None)
        if at is None and tp in self._assigned:
            at = await self._start_offset(tp)
        # Records handed over but not yet returned by poll() come first.
        firsts = [at] if at is not None else []
        held = self._held.get(tp)
        if held:
            firsts.append(held[0].offset)
        buffered = next((r.offset for r in self._buffer if r.tp == tp), None)
        if buffered is not None:
            firsts.append(buffered)
        return min(firsts) if firsts else None

    async def _start_offset(self, tp: TopicPartition) -> int | None:
        """Where the first fetch of ``tp`` starts while nothing was fetched yet (an idle
        partition), as aiokafka's position answers: the committed offset, else the reset
        policy's end; None when the broker does not answer."""
        try:
            committed = await self._group_committed(tp)
            if committed is not None:
                return committed
            spec = (
                OffsetSpec.earliest()  # type: ignore[no-untyped-call]
                if self._start_at_earliest
                else OffsetSpec.latest()  # type: ignore[no-untyped-call]
            )
            return (await self._list_offsets([tp], spec)).get(tp)
        except (KafkaException, TimeoutError):
            return None

    async def _group_committed(self, tp: TopicPartition) -> int | None:
        """The group's committed offset of ``tp`` asked through the admin client (None: none).

        Raises:
            KafkaException: the coordinator refused or did not answer.
        """
        if self._admin is None:
            self._admin = AdminClient(self._admin_config)
        request = ConsumerGroupTopicPartitions(self._group_id, [KafkaTP(*tp)])
        futures = self._admin.list_consumer_group_offsets(
            [request], request_timeout=END_OFFSETS_TIMEOUT_S
        )
        result = await asyncio.wait_for(
            asyncio.wrap_future(futures[self._group_id]), END_OFFSETS_TIMEOUT_S + 1
        )
        [found] = result.topic_partitions
        return int(found.offset) if found.offset >= 0 else None

    async def consumer_group_metadata(self) -> object:
        """librdkafka's opaque group metadata of this member now (for a transactional
        producer's ``send_offsets_to_transaction``).

        Raises:
            KafkaUnavailableError: the source is stopped.
        """
        return await self._call(
            self._group_metadata_now, KafkaUnavailableError("the Kafka source is stopped")
        )

    def _group_metadata_now(self) -> object:
        assert self._consumer is not None
        return self._consumer.consumer_group_metadata()

    # ---- commands (loop → owner thread) ---------------------------------------------------------

    def _send(self, command: Callable[[], None]) -> None:
        """Queue ``command`` for the owner thread, not waiting for it (errors logged)."""
        if self._thread is not None and not self._stopping:
            self._commands.send(command)

    def _call(self, fn: Callable[[], T], closed: T | BaseException) -> asyncio.Future[T]:
        """Run ``fn`` on the owner thread; its result or error on the loop. ``closed``: the
        result (or the error raised) once the source is stopped."""
        if self._thread is not None and not self._stopping:
            return self._commands.call(fn, closed)
        fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        resolve(fut, *((None, closed) if isinstance(closed, BaseException) else (closed, None)))
        return fut

    # ---- the owner thread -----------------------------------------------------------------------

    def _own(self, started: asyncio.Future[None]) -> None:
        loop = self._loop
        assert loop is not None
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
                assert self._stopped is not None
                loop.call_soon_threadsafe(resolve, self._stopped, None, None)

    def _connect(self) -> Consumer:
        """Create the consumer, wait for a broker's answer, subscribe.

        Raises:
            KafkaUnavailableError, KafkaSecurityError: see :meth:`start`.
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
        while not self._stopping:
            self._commands.serve()
            if self._stopping:
                break
            if self._fatal:  # nothing more to read; commands until stop()
                self._commands.serve(None)
                continue
            if self._sent - self._taken >= limit:  # the loop is behind: take nothing
                now_s = time.monotonic()
                stalled_s = stalled_s or now_s
                if not self._held_back and now_s - stalled_s >= HOLD_BACK_AFTER_S:
                    self._hold_back(True)
                if not self._held_back:  # a short stall: librdkafka keeps what it prefetched
                    self._stalled = True  # the loop wakes it once it has taken records
                    self._commands.serve(WAKE_S)
                    self._stalled = False
                    continue
            else:
                stalled_s = 0.0
                if self._held_back:
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
                    self._seek_now(tp, offset, retry=True)

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
        self._sent += len(records)
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
        self._held_back = hold

    def _pause_now(self, tps: list[TopicPartition]) -> None:
        assert self._consumer is not None
        targets = [tp for tp in tps if tp in self._owned]
        self._app_paused.update(targets)
        if targets:
            self._consumer.pause([KafkaTP(*tp) for tp in targets])

    def _resume_now(self, tps: list[TopicPartition]) -> None:
        assert self._consumer is not None
        targets = [tp for tp in tps if tp in self._owned]
        self._app_paused.difference_update(targets)
        if targets and not self._held_back:
            self._consumer.resume([KafkaTP(*tp) for tp in targets])

    def _seek_now(self, tp: TopicPartition, offset: int, *, retry: bool = False) -> None:
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

    def _commit_now(self, targets: list[KafkaTP], context: str) -> None:
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

    def _committed_now(self, tp: TopicPartition) -> tuple[int | None, str]:
        assert self._consumer is not None
        [found] = self._consumer.committed([KafkaTP(*tp)], timeout=REQUEST_TIMEOUT_S)
        if found.error is not None:
            raise KafkaException(found.error)
        if found.offset < 0:
            return None, ""
        return int(found.offset), found.metadata or ""

    def _position_now(self, tp: TopicPartition) -> int | None:
        assert self._consumer is not None
        if tp not in self._owned:
            return None
        if tp in self._pending_seeks:
            return self._pending_seeks[tp]
        if tp in self._sought:
            return self._sought[tp]
        [at] = self._consumer.position([KafkaTP(*tp)])
        return int(at.offset) if at.offset >= 0 else None

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

    # ---- rebalances (owner thread, inside consume) ----------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[KafkaTP]) -> None:
        tps = frozenset((p.topic, p.partition) for p in partitions)
        try:
            if self._cooperative:
                consumer.incremental_assign(partitions)
            else:
                consumer.assign(partitions)
            if partitions:
                consumer.resume(partitions)  # a pause never outlives an assignment
                if self._held_back:
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

    async def _assigned_on_loop(self, tps: frozenset[TopicPartition], member: Membership) -> None:
        self._membership = member
        if self._cooperative:
            self._assigned |= tps
        else:
            self._assigned = set(tps)
        self._paused -= tps
        try:
            await self._handler.on_assigned(tps)
        except Exception:
            log.exception("the rebalance handler failed on the assignment of %s", sorted(tps))

    async def _revoked_on_loop(self, tps: frozenset[TopicPartition], member: Membership) -> None:
        self._membership = member
        self._revoking |= tps
        self._drop(tps)  # read again from the commit by whoever owns them next
        try:
            await self._handler.on_revoked(tps)
        except Exception:
            log.exception("the rebalance handler failed on the revocation of %s", sorted(tps))
        finally:
            self._assigned -= tps
            self._paused -= tps
            self._revoking -= tps
            self._drop(tps)

    def _close(self) -> None:
        """On the owner thread: leave (see :meth:`stop`) and close the consumer."""
        consumer = self._consumer
        if consumer is None:
            return
        self._closing = True
        try:
            static_leave = self._leave_on_stop and self._instance_id is not None
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
