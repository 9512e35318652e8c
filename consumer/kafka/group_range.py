"""A job's source read through the job's own consumer group (group subscription).

Several serve members subscribe with the job's group id; the broker shares the source topic's
partitions among them and moves a dead member's partitions to the others. Each *assignment*
becomes one fixed plan (:class:`AssignedRange`, a ``RangeSourceLike`` for
:class:`consumer.backfill.job.BackfillJob`): the job's ``[start, end)`` offsets of the assigned
partitions (resolved once at submit), each resumed from the group's committed offset and its
no-replay metadata (:func:`consumer.kafka.range_source.plan_partition`, as a standalone
backfill resumes). The revoke callback (:attr:`GroupRangeSource.on_revoke`) is awaited before
the partitions go: the job finishes what it read and commits there, so the next owner
resumes from a committed offset and skips the offsets finished above it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
from aiokafka import TopicPartition as KafkaTP
from aiokafka.errors import IllegalStateError

from consumer.kafka.aiokafka_errors import map_kafka_errors
from consumer.kafka.client_config import client_kwargs
from consumer.kafka.committed import committed_with_metadata
from consumer.kafka.config import KafkaClientSettings
from consumer.kafka.errors import RangeSourceError
from consumer.kafka.offset_metadata import read_completed
from consumer.kafka.range_source import PlannedRead, fetch_in_range, start_range_consumer
from consumer.kafka.ranges import PartitionRange, plan_partition
from consumer.kafka.records import InRecord

__all__ = ["AssignedRange", "GroupRangeSource"]

log = logging.getLogger("kbatch.jobs")


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, owner: GroupRangeSource) -> None:
        self._owner = owner

    async def on_partitions_revoked(self, revoked: object) -> None:
        await self._owner._revoked()

    async def on_partitions_assigned(self, assigned: object) -> None:
        self._owner._assigned(sorted(tp.partition for tp in assigned))  # type: ignore[attr-defined]


class GroupRangeSource:
    """The job's source topic through its consumer group.

    Args:
        client: brokers and security, as every aiokafka client.
        topic: the source topic.
        group_id: the job's group.
        ranges: partition → ``[start, end)``, resolved at submit.
        session_timeout_ms / heartbeat_interval_ms: the group's failure detection (a killed
            member's partitions move after ``session_timeout_ms``).
    """

    def __init__(
        self,
        *,
        client: KafkaClientSettings,
        topic: str,
        group_id: str,
        ranges: Mapping[int, tuple[int, int]],
        session_timeout_ms: int = 10_000,
        heartbeat_interval_ms: int = 1_000,
        client_id: str = "kbatch-job",
    ) -> None:
        self.topic = topic
        self.group_id = group_id
        self.ranges = dict(ranges)
        self.on_revoke: Callable[[], Awaitable[None]] | None = None
        self.pause_reading: Callable[[], bool] = lambda: False
        """Asked before each poll: True pauses the assigned partitions (a Kafka pause: the
        poll still runs, so the member stays in the group) until it turns False (serve's flow
        control pausing bulk sources first)."""
        self._consumer = AIOKafkaConsumer(
            group_id=group_id,
            client_id=client_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            session_timeout_ms=session_timeout_ms,
            heartbeat_interval_ms=heartbeat_interval_ms,
            **client_kwargs(client),
        )
        self._assignment: list[int] | None = None  # a new generation not yet taken
        self._current: list[int] = []
        self._changed = asyncio.Event()
        self._started = False

    async def start(self) -> None:
        """Connect and subscribe (joining the group happens in the background).

        Raises:
            RangeSourceError: the broker cannot be reached.
            KafkaSecurityError: the broker refused the client.
        """
        await start_range_consumer(self._consumer)
        self._started = True
        self._consumer.subscribe([self.topic], listener=_Listener(self))

    async def stop(self) -> None:
        """Leave the group and close (idempotent; commits nothing itself)."""
        if self._started:
            self._started = False
            self.on_revoke = None
            await self._consumer.stop()

    def _assigned(self, partitions: list[int]) -> None:
        self._assignment = partitions
        self._current = partitions
        self._changed.set()

    async def _revoked(self) -> None:
        self._current = []
        if self.on_revoke is not None:
            await self.on_revoke()

    async def next_assignment(self, timeout_s: float) -> list[int] | None:
        """The job's partitions of a new assignment (maybe none), or None when none came
        within ``timeout_s`` (also keeps the consumer polled, so the group does not drop an
        idle member). Their plan: :meth:`plan`."""
        if self._assignment is None:
            await self.keepalive()
            try:
                await asyncio.wait_for(self._changed.wait(), timeout_s)
            except TimeoutError:
                return None
        self._changed.clear()
        partitions, self._assignment = self._assignment or [], None
        return [p for p in partitions if p in self.ranges]

    async def plan(self, partitions: list[int]) -> AssignedRange:
        """The plan of an assignment's ``partitions``: read their committed offsets (after
        ``--exactly-once`` opened their producers: :meth:`DeliveryMode.read_back
        <consumer.finish.checkpoint.DeliveryMode.read_back>`) and log bounds.

        Raises:
            RangeSourceError: the committed offsets or log bounds could not be read.
        """
        tps = [KafkaTP(self.topic, p) for p in partitions]
        with map_kafka_errors(RangeSourceError, f"planning {self.topic} for group {self.group_id}"):
            log_start = await self._consumer.beginning_offsets(tps) if tps else {}
            log_end = await self._consumer.end_offsets(tps) if tps else {}
            points = await committed_with_metadata(self._consumer, tps)
        plan: dict[int, PartitionRange] = {}
        for tp in tps:
            start, end = self.ranges[tp.partition]
            committed, meta = points.get((self.topic, tp.partition), (None, ""))
            completed = (
                read_completed(committed, meta, where=(self.topic, tp.partition))
                if committed is not None
                else frozenset()
            )
            plan[tp.partition] = plan_partition(
                tp.partition,
                start_offset=start,
                end_offset=end,
                log_start=log_start[tp],
                log_end=max(log_end[tp], log_start[tp]),
                committed=committed,
                completed=completed,
            )
        return AssignedRange(self, plan)

    async def keepalive(self) -> None:
        """One empty poll (every assigned partition is paused or at its end)."""
        try:
            with map_kafka_errors(RangeSourceError, f"polling {self.topic}"):
                for tp in self._consumer.assignment():
                    self._consumer.pause(tp)
                await self._consumer.getmany(timeout_ms=0)
        except (IllegalStateError, RangeSourceError) as err:
            log.debug("keepalive poll: %s", err)

    async def all_at_end(self) -> bool:
        """Whether the group's committed offset of every partition is at its range's end
        (the job is complete); asks the group coordinator.

        Raises:
            RangeSourceError: the coordinator could not be asked.
        """
        tps = [KafkaTP(self.topic, p) for p, (s, e) in self.ranges.items() if e > s]
        with map_kafka_errors(RangeSourceError, f"committed offsets of {self.group_id}"):
            points = await committed_with_metadata(self._consumer, tps)
        return all(
            points.get((self.topic, tp.partition), (-1, ""))[0] >= self.ranges[tp.partition][1]
            for tp in tps
        )

    # -- used by AssignedRange -------------------------------------------------------------------

    def _seek(self, plan: Mapping[int, PartitionRange]) -> set[int]:
        active: set[int] = set()
        for p, r in plan.items():
            tp = KafkaTP(self.topic, p)
            if r.remaining > 0:
                self._consumer.seek(tp, r.start)
                self._consumer.resume(tp)
                active.add(p)
            else:
                self._consumer.pause(tp)
        return active

    def _holds(self, partitions: set[int]) -> bool:
        return partitions <= set(self._current)


class AssignedRange(PlannedRead):
    """One assignment's fixed plan: the ``RangeSourceLike`` a ``BackfillJob`` runs over.

    Reading stops (every partition reported finished, nothing more polled) once the
    assignment is revoked: the job then drains and commits what it read.
    """

    def __init__(self, source: GroupRangeSource, plan: dict[int, PartitionRange]) -> None:
        self._source = source
        self._consumer = source._consumer
        self.topic = source.topic
        self._plan = plan
        self._active = source._seek(plan)

    def positions(self) -> dict[int, int]:
        """Partition → where reading stands (for progress records)."""
        return {p: r.start for p, r in self._plan.items()}

    async def poll(self, max_records: int, timeout_ms: int) -> list[InRecord]:
        """As :meth:`consumer.kafka.range_source.RangeSource.poll`, over the assigned plan.

        Raises:
            RangeSourceError: a non-retriable fetch error.
        """
        if not self._active:
            return []
        tps = [KafkaTP(self.topic, p) for p in sorted(self._active)]
        if not self._source._holds(self._active):
            self._active.clear()  # revoked: the job drains and stops
            return []
        try:
            if self._source.pause_reading():
                self._consumer.pause(*tps)
                await self._consumer.getmany(timeout_ms=timeout_ms)  # nothing: all paused
                return []
            self._consumer.resume(*tps)
            return await fetch_in_range(
                self._consumer, self.topic, self._plan, self._active, max_records, timeout_ms
            )
        except IllegalStateError:  # the assignment went away meanwhile
            self._active.clear()
            return []
