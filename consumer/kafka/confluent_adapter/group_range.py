"""A job's source read through the job's own consumer group, on confluent-kafka: the drop-in of
:class:`consumer.kafka.group_range.GroupRangeSource` (same methods, semantics and errors).

The classic group protocol with the ``roundrobin`` assignor (aiokafka's default, under the same
protocol name: aiokafka and confluent members can share a job's group). librdkafka runs the
rebalance callbacks inside ``consume`` on the owner thread
(:class:`~consumer.kafka.confluent_adapter.owner_thread.ConsumerThread`): an assignment is
assigned there at each range's start, every partition paused (nothing is read before the
job's plan seeks it)
and handed to the loop; a revocation (or a loss) runs :attr:`ConfluentGroupRangeSource.on_revoke`
on the loop while the thread waits, serving the job's commits, and the partitions go only
after it returned, as aiokafka awaits its rebalance listener.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException
from confluent_kafka import TopicPartition as KafkaTP

from consumer.kafka.config import KafkaClientSettings
from consumer.kafka.confluent_adapter.client_config import client_config
from consumer.kafka.confluent_adapter.errors import map_confluent_errors
from consumer.kafka.confluent_adapter.owner_thread import ConsumerThread
from consumer.kafka.confluent_adapter.range_source import (
    ConfluentPlannedRead,
    committed_points,
    start_thread,
    watermarks,
)
from consumer.kafka.errors import RangeSourceError
from consumer.kafka.offset_metadata import read_completed
from consumer.kafka.ranges import PartitionRange, plan_partition
from consumer.kafka.records import InRecord

__all__ = ["ConfluentAssignedRange", "ConfluentGroupRangeSource"]

log = logging.getLogger("kbatch.jobs")


class ConfluentGroupRangeSource:
    """The job's source topic through its consumer group (confluent-kafka).

    Args:
        client: brokers and security
            (:func:`~consumer.kafka.confluent_adapter.client_config.client_config`).
        topic: the source topic.
        group_id: the job's group.
        ranges: partition → ``[start, end)``, resolved at submit.
        session_timeout_ms / heartbeat_interval_ms: the group's failure detection (a killed
            member's partitions move after ``session_timeout_ms``).
        client_id: librdkafka's ``client.id``.

    Raises:
        KafkaSecurityError: a CA, key, password or token file cannot be read.
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
        owner thread keeps calling consume, so the member stays in the group) until it turns
        False (serve's flow control pausing bulk sources first)."""
        config: dict[str, Any] = {
            **client_config(client),
            "group.id": group_id,
            "client.id": client_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "partition.assignment.strategy": "roundrobin",
            "session.timeout.ms": session_timeout_ms,
            "heartbeat.interval.ms": heartbeat_interval_ms,
        }
        self._thread = ConsumerThread(config, name=f"kbatch-job {group_id}")
        self._assignment: list[int] | None = None  # a new generation not yet taken
        self._current: list[int] = []
        self._changed = asyncio.Event()
        self._all_paused = False  # keepalive paused every assigned partition
        self._started = False

    async def start(self) -> None:
        """Connect and subscribe (joining the group happens on the owner thread).

        Raises:
            RangeSourceError: the broker cannot be reached.
            KafkaSecurityError: the broker refused the client.
        """
        await start_thread(self._thread)
        self._started = True
        with map_confluent_errors(RangeSourceError, f"subscribing to {self.topic}"):
            await self._thread.call(
                lambda c: c.subscribe(
                    [self.topic],
                    on_assign=self._on_assign,
                    on_revoke=self._on_revoke,
                    on_lost=self._on_revoke,
                )
            )
        self._thread.consuming = True

    async def stop(self) -> None:
        """Leave the group and close (idempotent; commits nothing itself)."""
        if self._started:
            self._started = False
            self.on_revoke = None
            await self._thread.close()

    # -- rebalance callbacks: on the owner thread, inside consume() or close() -------------------

    def _on_assign(self, consumer: Consumer, tps: list[KafkaTP]) -> None:
        # At an explicit offset (the range's start), paused: the plan seeks and resumes them.
        # Assigned without one, librdkafka would fetch the committed offset first and start
        # the partition there when that answer comes, undoing a seek made meanwhile.
        at = [
            KafkaTP(tp.topic, tp.partition, self.ranges.get(tp.partition, (OFFSET_BEGINNING,))[0])
            for tp in tps
        ]
        log.debug("group %s: assigned %s", self.group_id, sorted(tp.partition for tp in at))
        consumer.assign(at)
        if at:
            consumer.pause(at)
        self._thread.to_loop(self._assigned, sorted(tp.partition for tp in tps))

    def _on_revoke(self, consumer: Consumer, tps: list[KafkaTP]) -> None:
        log.debug("group %s: revoked %s", self.group_id, sorted(tp.partition for tp in tps))
        self._thread.await_on_loop(self._revoked)
        consumer.unassign()

    # -- on the loop -----------------------------------------------------------------------------

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
        within ``timeout_s`` (the owner thread keeps the consumer polled meanwhile, so the
        group does not drop an idle member). Their plan: :meth:`plan`."""
        if self._assignment is None:
            await self.keepalive()
            try:
                await asyncio.wait_for(self._changed.wait(), timeout_s)
            except TimeoutError:
                return None
        self._changed.clear()
        partitions, self._assignment = self._assignment or [], None
        return [p for p in partitions if p in self.ranges]

    async def plan(self, partitions: list[int]) -> ConfluentAssignedRange:
        """The plan of an assignment's ``partitions``: read their committed offsets (after
        ``--exactly-once`` opened their producers: :meth:`DeliveryMode.read_back
        <consumer.finish.checkpoint.DeliveryMode.read_back>`) and log bounds, then seek each
        non-empty one to its start.

        Raises:
            RangeSourceError: the committed offsets or log bounds could not be read.
        """

        def ask(
            consumer: Consumer,
        ) -> tuple[dict[int, tuple[int, int]], dict[int, tuple[int, str]]]:
            return (
                watermarks(consumer, self.topic, partitions),
                committed_points(consumer, self.topic, partitions),
            )

        with map_confluent_errors(
            RangeSourceError, f"planning {self.topic} for group {self.group_id}"
        ):
            marks, points = await self._thread.call(ask)
        plan: dict[int, PartitionRange] = {}
        for p in partitions:
            start, end = self.ranges[p]
            log_start, log_end = marks[p]
            committed, meta = points.get(p, (None, ""))
            completed = (
                read_completed(committed, meta, where=(self.topic, p))
                if committed is not None
                else frozenset()
            )
            plan[p] = plan_partition(
                p,
                start_offset=start,
                end_offset=end,
                log_start=log_start,
                log_end=max(log_end, log_start),
                committed=committed,
                completed=completed,
            )
        return ConfluentAssignedRange(self, plan, await self._seek(plan))

    async def keepalive(self) -> None:
        """Pause every assigned partition (the owner thread keeps polling)."""
        try:
            with map_confluent_errors(RangeSourceError, f"polling {self.topic}"):
                await self._thread.call(_pause_all)
            self._all_paused = True  # the next plan's poll resumes its partitions
        except RangeSourceError as err:
            log.debug("keepalive: %s", err)

    async def all_at_end(self) -> bool:
        """Whether the group's committed offset of every partition is at its range's end
        (the job is complete); asks the group coordinator.

        Raises:
            RangeSourceError: the coordinator could not be asked.
        """
        parts = [p for p, (s, e) in self.ranges.items() if e > s]
        with map_confluent_errors(RangeSourceError, f"committed offsets of {self.group_id}"):
            points = await self._thread.call(lambda c: committed_points(c, self.topic, parts))
        return all(points.get(p, (-1, ""))[0] >= self.ranges[p][1] for p in parts)

    # -- used by ConfluentAssignedRange ----------------------------------------------------------

    async def _seek(self, plan: Mapping[int, PartitionRange]) -> set[int]:
        active = {p for p, r in plan.items() if r.remaining > 0}

        def seek(consumer: Consumer) -> None:
            for p, r in plan.items():
                tp = KafkaTP(self.topic, p, r.start)
                if p in active:
                    consumer.seek(tp)
                    consumer.resume([tp])
                else:
                    consumer.pause([tp])

        with map_confluent_errors(RangeSourceError, f"seeking {self.topic}"):
            await self._thread.call(seek)
        self._thread.discard({(self.topic, p) for p in plan})
        return active

    def _holds(self, partitions: set[int]) -> bool:
        return partitions <= set(self._current)


def _pause_all(consumer: Consumer) -> None:
    assigned = consumer.assignment()
    if assigned:
        consumer.pause(assigned)


class ConfluentAssignedRange(ConfluentPlannedRead):
    """One assignment's fixed plan: the ``RangeSourceLike`` a ``BackfillJob`` runs over (as
    :class:`consumer.kafka.group_range.AssignedRange`; built by
    :meth:`ConfluentGroupRangeSource.plan`, which seeked ``active``).

    Reading stops (every partition reported finished, nothing more polled) once the
    assignment is revoked: the job then drains and commits what it read.
    """

    def __init__(
        self, source: ConfluentGroupRangeSource, plan: dict[int, PartitionRange], active: set[int]
    ) -> None:
        self._source = source
        self._thread = source._thread
        self.topic = source.topic
        self._plan = plan
        self._active = active
        self._paused = False

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
        if not self._source._holds(self._active):
            self._active.clear()  # revoked: the job drains and stops
            return []
        tps = [KafkaTP(self.topic, p) for p in sorted(self._active)]
        try:
            if self._source.pause_reading():
                if not self._paused:
                    await self._thread.call(lambda c: c.pause(tps))
                    self._paused = True
                await asyncio.sleep(timeout_ms / 1000)  # a poll's wait: nothing comes paused
                return []
            if self._paused or self._source._all_paused:
                await self._thread.call(lambda c: c.resume(tps))
                self._paused = self._source._all_paused = False
            return await self._read(max_records, timeout_ms)
        except KafkaException:  # the assignment went away meanwhile?
            if self._source._holds(self._active):
                with map_confluent_errors(RangeSourceError, f"polling {self.topic}"):
                    raise
            self._active.clear()
            return []
