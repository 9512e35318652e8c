"""The request source: one aiokafka consumer in a consumer group, read in poll-sized chunks.

Auto-commit is off: the pipeline commits what :class:`consumer.kafka.offsets.OffsetTracker`
says is safe. Pauses are the backpressure; aiokafka forgets them on every rebalance, so the
rebalance handler re-applies them (``RebalanceHandler.on_assigned``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Mapping

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
from aiokafka import TopicPartition as KafkaTP
from aiokafka.errors import IllegalStateError, KafkaError

from consumer.kafka.aiokafka_errors import DENIALS, describe_denial, map_kafka_errors
from consumer.kafka.client_config import client_kwargs, start_client
from consumer.kafka.committed import committed_with_metadata
from consumer.kafka.config import ConsumerGroupSettings, KafkaClientSettings
from consumer.kafka.errors import CommitError, FencedInstanceError, KafkaSecurityError
from consumer.kafka.records import InRecord, Membership, RebalanceHandler, TopicPartition
from consumer.kafka.static_fence import StaticFenceDetector

log = logging.getLogger(__name__)


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, handler: RebalanceHandler, source: KafkaSource) -> None:
        self._handler = handler
        self._source = source

    async def on_partitions_revoked(self, revoked: Iterable[KafkaTP]) -> None:
        await self._handler.on_revoked(frozenset((tp.topic, tp.partition) for tp in revoked))
        await self._source._check_fenced()

    async def on_partitions_assigned(self, assigned: Iterable[KafkaTP]) -> None:
        self._source._joined = True
        await self._handler.on_assigned(frozenset((tp.topic, tp.partition) for tp in assigned))


class KafkaSource:
    """The consumer side of ``kbatch serve``.

    Args:
        client: the brokers and security.
        group: the group member's settings and timeouts.
        handler: called on revoke/assign (see :class:`RebalanceHandler`).
        group_id: the consumer group.
        topics: topics to subscribe to.
        max_poll_records: most records one fetch returns.
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
    ) -> None:
        self._bootstrap = client.bootstrap
        self._group_id = group_id
        self._handler = handler
        self._instance_id = group.group_instance_id
        self._leave_on_stop = group.leave_group_on_shutdown
        self._fence = StaticFenceDetector() if group.group_instance_id is not None else None
        self._fenced: FencedInstanceError | None = None
        self._joined = False
        self._topics = tuple(topics)
        self._consumer = AIOKafkaConsumer(
            group_id=group_id,
            group_instance_id=group.group_instance_id,
            client_id=f"kbatch-{group.group_instance_id or 'consumer'}",
            enable_auto_commit=False,
            auto_offset_reset=group.auto_offset_reset,
            isolation_level="read_committed",
            max_poll_records=max_poll_records,
            session_timeout_ms=group.session_timeout_ms,
            heartbeat_interval_ms=group.heartbeat_interval_ms,
            max_poll_interval_ms=group.max_poll_interval_ms,
            rebalance_timeout_ms=group.rebalance_timeout_ms,
            # A topic created after start is seen within 30 s (aiokafka's default: 5 min).
            metadata_max_age_ms=30_000,
            **client_kwargs(client),
        )

    incremental = False
    """aiokafka rebalances eagerly (:attr:`consumer.kafka.transport.GroupSource.incremental`)."""

    async def start(self) -> None:
        """Connect and subscribe; partitions arrive through the rebalance handler.

        Raises:
            KafkaUnavailableError: no broker answered at ``client.bootstrap``.
        """
        await start_client(
            self._consumer.start,
            self._consumer.stop,
            f"no Kafka broker answered at {self._bootstrap}",
        )
        self._consumer.subscribe(list(self._topics), listener=_Listener(self._handler, self))

    def leave_group_on_stop(self) -> None:
        """Make :meth:`stop` leave the group even as a static member (a wedged engine:
        :mod:`consumer.serve.wedge`), so the group moves the partitions at once instead of
        keeping them for a restart within the session timeout."""
        self._leave_on_stop = True

    async def stop(self) -> None:
        """Leave the group and close (idempotent).

        A static member leaves only with ``leave_group_on_shutdown``: aiokafka skips the
        LeaveGroup of a member with a ``group_instance_id`` (Kafka's Java client does too, so
        that a restart keeps the assignment) and 0.14 has no LeaveGroup v3 (KIP-345's removal
        by instance id); its LeaveGroup v0-1 by member id, sent after the heartbeats stopped,
        removes a static member as well, so the broker rebalances at once.
        """
        coordinator = self._consumer._coordinator
        if self._leave_on_stop and self._fenced is None and coordinator is not None:
            # aiokafka's close sends its LeaveGroup only when this is None (group_coordinator
            # _maybe_leave_group); read nowhere else on the way out.
            coordinator._group_instance_id = None
            if self._instance_id is not None:  # a dynamic member always leaves: nothing to say
                log.info("static member %r leaves the group on shutdown", self._instance_id)
        if self._fenced is not None:
            # The coordination task waits in the revoke listener (_check_fenced): end it
            # there, before it rejoins and takes the id back from the member that keeps it.
            task = self._consumer._coordinator._coordination_task
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._consumer.stop()

    async def _check_fenced(self) -> None:
        """After a revoke: when this static member lost its membership (aiokafka reset its
        member id) often enough to be fenced (:mod:`consumer.kafka.static_fence`), never
        rejoin: :meth:`poll` raises and the owner stops."""
        if (
            self._fence is None
            or not self._joined  # the first join: no membership to lose yet
            or self._consumer._coordinator.member_id != ""
        ):
            return
        if self._fence.lost(time.monotonic()):
            self._fenced = FencedInstanceError(
                f"another member of group {self._group_id!r} uses --group-instance-id "
                f"{self._instance_id!r} and took this one's place: give every member its own "
                "id (the pod name; replicas add -<i>)"
            )
            await asyncio.Event().wait()  # until stop() cancels the coordination task

    async def poll(self, max_records: int, timeout_ms: int) -> list[InRecord]:
        """One ``getmany`` chunk, flattened in partition order; empty when paused or idle.

        Raises:
            FencedInstanceError: another member took this static member's id.
            KafkaSecurityError: the broker denies reading the topics or joining the group.
        """
        if self._fenced is not None:
            raise self._fenced
        try:
            batches = await self._consumer.getmany(timeout_ms=timeout_ms, max_records=max_records)
        except DENIALS as err:
            raise KafkaSecurityError(
                f"reading {', '.join(self._topics)} as group {self._group_id}: the broker "
                f"denies it: {describe_denial(err)}"
            ) from None
        return [InRecord.from_consumer_record(r) for records in batches.values() for r in records]

    def membership(self) -> Membership:
        """This member's id and group generation now (``("", -1)`` outside the group). In
        the revoke listener: the generation being left; in the assign listener: the new one."""
        coordinator = self._consumer._coordinator
        if coordinator is None:
            return Membership("", -1)
        return Membership(str(coordinator.member_id or ""), int(coordinator.generation))

    def assignment(self) -> frozenset[TopicPartition]:
        """The partitions this member owns now."""
        return frozenset((tp.topic, tp.partition) for tp in self._consumer.assignment())

    def pause(self, tps: Iterable[TopicPartition]) -> None:
        """Stop fetching these partitions (only those still assigned)."""
        owned = self.assignment()
        targets = [KafkaTP(*tp) for tp in tps if tp in owned]
        if targets:
            self._consumer.pause(*targets)

    def resume(self, tps: Iterable[TopicPartition]) -> None:
        """Fetch these partitions again (only those still assigned)."""
        owned = self.assignment()
        targets = [KafkaTP(*tp) for tp in tps if tp in owned]
        if targets:
            self._consumer.resume(*targets)

    def paused(self) -> frozenset[TopicPartition]:
        """The partitions paused in the client right now."""
        return frozenset((tp.topic, tp.partition) for tp in self._consumer.paused())

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
        """
        if not offsets:
            return
        meta = metadata or {}
        with map_kafka_errors(CommitError, f"commit of {dict(offsets)} failed"):
            await self._consumer.commit(
                {KafkaTP(*tp): (off, meta.get(tp, "")) for tp, off in offsets.items()}
            )

    async def committed(self, tp: TopicPartition) -> int | None:
        """The group's committed offset of ``tp`` (None when it has none)."""
        try:
            offset = await self._consumer.committed(KafkaTP(*tp))
        except KafkaError:
            return None
        return None if offset is None else int(offset)

    async def committed_metadata(self, tp: TopicPartition) -> tuple[int | None, str]:
        """The group's committed offset of ``tp`` and its metadata string; ``(None, "")``
        when it has none or the broker does not answer (logged)."""
        try:
            found = await committed_with_metadata(self._consumer, [KafkaTP(*tp)])
        except KafkaError as err:
            log.warning("committed offset of %s not available: %s", tp, err)
            return None, ""
        point = found.get(tp)
        return (None, "") if point is None else point

    async def end_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The log end offset (high-water mark) of each of ``tps``, asked of the broker.

        Unlike the high-water mark carried by fetch responses, this is current for paused
        partitions too (nothing is fetched from them). Empty when the broker does not answer
        (the next call tries again).
        """
        targets = [KafkaTP(*tp) for tp in tps]
        if not targets:
            return {}
        try:
            ends = await self._consumer.end_offsets(targets)
        except KafkaError as err:
            log.warning("end offsets not available: %s", err)
            return {}
        return {(tp.topic, tp.partition): int(off) for tp, off in ends.items()}

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Read ``tp`` from ``offset`` next (a partition no longer assigned is left alone)."""
        with contextlib.suppress(IllegalStateError):
            self._consumer.seek(KafkaTP(*tp), offset)

    async def position(self, tp: TopicPartition) -> int | None:
        """The next offset this member will read from ``tp`` (None when not assigned)."""
        try:
            return int(await self._consumer.position(KafkaTP(*tp)))
        except (IllegalStateError, KafkaError):
            return None
