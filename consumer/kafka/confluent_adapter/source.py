"""The request source on confluent-kafka (librdkafka): one ``Consumer`` in a consumer group,
read in poll-sized chunks; a drop-in for :class:`consumer.kafka.source.KafkaSource`
(:class:`consumer.kafka.transport.GroupSource`).

This module is the event loop's side: the buffer :meth:`ConfluentSource.poll` reads, the
assignment and pauses as the loop sees them, and the commands it queues. Every call on the
``Consumer`` is made by its owner thread,
:class:`~consumer.kafka.confluent_adapter.source_owner.SourceOwner` (its module explains the
threading, the backpressure and the rebalances).

Pauses seen by the loop are exact: :meth:`ConfluentSource.pause` takes effect at once for
:meth:`~ConfluentSource.poll` (records of the partition already handed over are *held* and
returned, in order, after :meth:`~ConfluentSource.resume`), and in librdkafka at the owner's
next command round.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, TypeVar

from confluent_kafka import ConsumerGroupTopicPartitions, IsolationLevel, KafkaException
from confluent_kafka import TopicPartition as KafkaTP
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]  # public, not in __all__

from consumer.kafka.config import ConsumerGroupSettings, GroupProtocol, KafkaClientSettings
from consumer.kafka.confluent_adapter.client_config import client_config
from consumer.kafka.confluent_adapter.commit_points import commit_point
from consumer.kafka.confluent_adapter.logs import librdkafka_logger
from consumer.kafka.confluent_adapter.owner_thread import OwnerCommands, resolve
from consumer.kafka.confluent_adapter.source_owner import BUFFERED_POLLS as BUFFERED_POLLS
from consumer.kafka.confluent_adapter.source_owner import HOLD_BACK_AFTER_S as HOLD_BACK_AFTER_S
from consumer.kafka.confluent_adapter.source_owner import LEAVE_TIMEOUT_S as LEAVE_TIMEOUT_S
from consumer.kafka.confluent_adapter.source_owner import REQUEST_TIMEOUT_S as REQUEST_TIMEOUT_S
from consumer.kafka.confluent_adapter.source_owner import START_TIMEOUT_S as START_TIMEOUT_S
from consumer.kafka.confluent_adapter.source_owner import WAKE_S as WAKE_S
from consumer.kafka.confluent_adapter.source_owner import SourceOwner
from consumer.kafka.errors import CommitError, KafkaLayerError, KafkaUnavailableError
from consumer.kafka.records import InRecord, Membership, RebalanceHandler, TopicPartition

__all__ = ["ConfluentSource", "consumer_config"]

log = logging.getLogger("consumer.kafka.confluent_adapter")

T = TypeVar("T")

END_OFFSETS_TIMEOUT_S: Final = 5.0
"""Longest wait for the end offsets of one :meth:`ConfluentSource.end_offsets` (seconds)."""


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
    timeout is ``max.poll.interval.ms``. What each group protocol's properties mean for the
    rebalances: :mod:`consumer.kafka.confluent_adapter.source_owner`.

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
        self._group_id = group_id
        self._handler = handler
        self._start_at_earliest = group.auto_offset_reset == "earliest"
        self._cooperative = group_protocol == "consumer"
        config = consumer_config(client, group, group_id=group_id, group_protocol=group_protocol)
        # Offsets asked of the brokers (end offsets, an idle partition's start) go through an
        # admin client, never the owner thread: a round trip there stops consume() meanwhile.
        self._admin_config: dict[str, Any] = {
            **client_config(client),
            "logger": librdkafka_logger("admin"),
        }
        self._admin: AdminClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._commands = OwnerCommands("kbatch-source")  # woken: stop, buffer room
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
        # ---- the owner thread's side (the Consumer, and what only its thread touches) ----
        self._owner = SourceOwner(
            config,
            self._commands,
            deliver=self._deliver,
            fail=self._fail,
            seek_applied=self._seek_applied,
            assigned_on_loop=self._assigned_on_loop,
            revoked_on_loop=self._revoked_on_loop,
            bootstrap=client.bootstrap,
            group_id=group_id,
            instance_id=group.group_instance_id,
            topics=tuple(topics),
            max_poll_records=max_poll_records,
            cooperative=self._cooperative,
            leave_on_stop=group.leave_group_on_shutdown,
        )

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
            target=self._owner.run,
            args=(loop, started, self._stopped),
            name="kbatch-source",
            daemon=True,
        )
        self._thread.start()
        await started

    def leave_group_on_stop(self) -> None:
        """Make :meth:`stop` leave the group even as a static member (a wedged engine:
        :mod:`consumer.serve.wedge`), so the group moves the partitions at once instead of
        keeping them for a restart within the session timeout."""
        self._owner.leave_on_stop = True

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
        self._owner.stop()
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
        self._owner.taken += taken
        if self._owner.stalled and taken:
            self._owner.stalled = False
            self._commands.wake()  # the owner thread waits for room
        return out

    def _deliver(self, records: list[InRecord]) -> None:
        """On the loop: records the owner took from librdkafka (one call per ``consume``)."""
        if self._seeking:
            kept = [r for r in records if r.tp not in self._seeking]
            self._owner.taken += len(records) - len(kept)
            records = kept
        self._buffer.extend(records)
        self._ready.set()

    def _fail(self, error: KafkaLayerError) -> None:
        """On the loop: a failure from the owner thread, raised by every later :meth:`poll`."""
        if self._failure is None:
            self._failure = error
        self._ready.set()

    def _drop(self, tps: set[TopicPartition] | frozenset[TopicPartition]) -> None:
        """Forget the buffered and held records of ``tps``."""
        for tp in tps:
            self._held.pop(tp, None)
        if any(r.tp in tps for r in self._buffer):
            kept = deque(r for r in self._buffer if r.tp not in tps)
            self._owner.taken += len(self._buffer) - len(kept)
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
            self._send(lambda: self._owner.pause_now(targets))

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
                self._owner.taken -= len(held)
                self._ready.set()
        self._send(lambda: self._owner.resume_now(targets))

    def paused(self) -> frozenset[TopicPartition]:
        """The partitions paused in the client right now."""
        return frozenset(self._paused)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Read ``tp`` from ``offset`` next (a partition no longer assigned is left alone)."""
        if tp not in self._assigned:
            return
        self._drop({tp})
        self._seeking[tp] = self._seeking.get(tp, 0) + 1
        self._send(lambda: self._owner.seek_now(tp, offset))

    def _seek_applied(self, tp: TopicPartition) -> None:
        """On the loop: the owner ran one seek of ``tp`` (once none is left, its records are no
        longer dropped on delivery)."""
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
            lambda: self._owner.commit_now(targets, context), CommitError(f"{context}: closed")
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
            return await self._call(lambda: self._owner.committed_now(tp), (None, ""))
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
        at = await self._call(lambda: self._owner.position_now(tp), None)
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
            self._owner.group_metadata_now, KafkaUnavailableError("the Kafka source is stopped")
        )

    # ---- commands (loop → owner thread) ---------------------------------------------------------

    def _send(self, command: Callable[[], None]) -> None:
        """Queue ``command`` for the owner thread, not waiting for it (errors logged)."""
        if self._thread is not None and not self._owner.stopping:
            self._commands.send(command)

    def _call(self, fn: Callable[[], T], closed: T | BaseException) -> asyncio.Future[T]:
        """Run ``fn`` on the owner thread; its result or error on the loop. ``closed``: the
        result (or the error raised) once the source is stopped."""
        if self._thread is not None and not self._owner.stopping:
            return self._commands.call(fn, closed)
        fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        resolve(fut, *((None, closed) if isinstance(closed, BaseException) else (closed, None)))
        return fut

    # ---- rebalances (loop; the owner awaits these inside librdkafka's callbacks) ----------------

    async def _assigned_on_loop(self, tps: frozenset[TopicPartition], member: Membership) -> None:
        """``tps`` assigned (already in librdkafka, so the handler can pause them)."""
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
        """``tps`` revoked or lost: still assigned in librdkafka until this returns, so the
        handler's commit is still the owner's."""
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
