"""A bounded source for ``kbatch backfill``: read one topic between two positions, then stop.

:class:`RangeSource` (aiokafka) resolves the bounds (:mod:`consumer.kafka.ranges`: the
bounds, what each resolves to, the plan and the resume rules) against the broker once, at start
(``beginning_offsets``, ``end_offsets``, ``offsets_for_times``, ``committed``), ``assign``-s
the partitions, ``seek``-s each to its start and reads until every partition's position
reaches its end. End offsets are fixed at start: records appended later are not read (the
job is bounded).

Errors raised: :class:`RangeSpecError` (a ``ValueError``) for unparseable bounds or a partition
the topic does not have; :class:`RangeSourceError` for a missing topic or a broker failure
(aiokafka's errors are translated here).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from aiokafka import AIOKafkaClient, AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaTP

from consumer.kafka.aiokafka_errors import map_kafka_errors
from consumer.kafka.client_config import client_kwargs, start_client
from consumer.kafka.committed import committed_with_metadata
from consumer.kafka.config import KafkaClientSettings
from consumer.kafka.errors import (
    KafkaSecurityError,
    KafkaUnavailableError,
    RangeSourceError,
    RangeSpecError,
)
from consumer.kafka.offset_metadata import read_completed
from consumer.kafka.ranges import (
    AtOffsets,
    Earliest,
    Latest,
    PartitionRange,
    RangeBound,
    Side,
    plan_partition,
)
from consumer.kafka.records import InRecord, TopicPartition

__all__ = [
    "PlannedRead",
    "RangeSource",
    "RangeSourceError",
    "RangeSpecError",
    "fetch_in_range",
    "start_range_consumer",
]

log = logging.getLogger(__name__)


# ---- I/O -----------------------------------------------------------------------------------------


class PlannedRead:
    """A fixed plan being read and committed: :class:`RangeSource`, and one assignment of a
    job's group (:class:`consumer.kafka.group_range.AssignedRange`). Subclasses set
    ``topic``, ``_consumer``, ``_plan`` and ``_active`` (the partitions still being read)."""

    topic: str
    _consumer: AIOKafkaConsumer
    _plan: dict[int, PartitionRange]
    _active: set[int]

    @property
    def plan(self) -> Mapping[int, PartitionRange]:
        """The per-partition ranges (empty before :meth:`RangeSource.resolve`)."""
        return self._plan

    @property
    def finished(self) -> frozenset[int]:
        """Partitions whose read position reached their end (nothing more will be polled)."""
        return frozenset(p for p in self._plan if p not in self._active)

    async def commit(
        self,
        offsets: Mapping[TopicPartition, int],
        metadata: Mapping[TopicPartition, str] | None = None,
    ) -> None:
        """Commit ``offsets`` (next offset to read, per partition of :attr:`topic`) for the
        job's group, each with its ``metadata`` string ("" when not given;
        :mod:`consumer.kafka.offset_metadata`); as :meth:`KafkaSource.commit`.

        Raises:
            RangeSourceError: the broker refused (a group member: the partitions moved) or
                could not be reached.
        """
        if not offsets:
            return
        meta = metadata or {}
        with map_kafka_errors(RangeSourceError, f"commit of {dict(offsets)} failed"):
            await self._consumer.commit(
                {KafkaTP(*tp): (off, meta.get(tp, "")) for tp, off in offsets.items()}
            )


class RangeSource(PlannedRead):
    """Reads ``topic`` over a fixed range per partition, committing under ``group_id``.

    Call :meth:`start`, then :meth:`resolve` once, then :meth:`poll` until :attr:`finished`
    covers every partition of :attr:`plan`; :meth:`commit` progress as records finish.

    Args:
        client: the brokers and their TLS/SASL settings, passed to aiokafka unchanged.
        topic: the source topic.
        group_id: the consumer group the job commits under (it never joins it: partitions
            are assigned manually, so two jobs with one group would overwrite each other's
            commits).
        max_partition_fetch_bytes: aiokafka's per-partition fetch size.
    """

    def __init__(
        self,
        *,
        client: KafkaClientSettings,
        topic: str,
        group_id: str,
        max_partition_fetch_bytes: int = 1 << 20,
    ) -> None:
        self.topic = topic
        self.group_id = group_id
        self._client = client
        self._consumer = AIOKafkaConsumer(
            group_id=group_id,
            client_id="kbatch-backfill",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            max_partition_fetch_bytes=max_partition_fetch_bytes,
            **client_kwargs(client),
        )
        self._plan: dict[int, PartitionRange] = {}
        self._active: set[int] = set()
        self._started = False

    async def start(self) -> None:
        """Connect.

        Raises:
            RangeSourceError: the broker cannot be reached.
            KafkaSecurityError: the broker refused the client (TLS check, SASL login).
        """
        await start_range_consumer(self._consumer)
        self._started = True

    async def stop(self) -> None:
        """Close the consumer (idempotent; commits nothing)."""
        if self._started:
            self._started = False
            await self._consumer.stop()

    async def partitions(self) -> list[int]:
        """The source topic's partitions, sorted (asked of the broker).

        Raises:
            RangeSourceError: the topic does not exist, or the broker failed to answer.
        """
        with map_kafka_errors(RangeSourceError, f"listing the partitions of {self.topic}"):
            return await self._partitions()

    async def resolve(
        self, from_bound: RangeBound, to_bound: RangeBound
    ) -> dict[int, PartitionRange]:
        """Fix each partition's range now, assign the non-empty ones and seek to their starts.

        Raises:
            RangeSourceError: the topic does not exist, or the broker failed to answer.
            RangeSpecError: a ``P:OFFSET`` bound names a partition the topic does not have.
        """
        with map_kafka_errors(RangeSourceError, f"resolving the range of {self.topic}"):
            partitions = await self._partitions()
            tps = [KafkaTP(self.topic, p) for p in partitions]
            log_start = await self._consumer.beginning_offsets(tps)
            log_end = await self._consumer.end_offsets(tps)
            starts = await self._offsets(from_bound, "from", partitions, log_start, log_end)
            ends = await self._offsets(to_bound, "to", partitions, log_start, log_end)
            points = await committed_with_metadata(self._consumer, tps)
        committed = {p: points.get((self.topic, p), (None, ""))[0] for p in partitions}
        completed = {
            p: read_completed(off, meta, where=(self.topic, p))
            for (_, p), (off, meta) in points.items()
        }
        plan = {
            p: plan_partition(
                p,
                start_offset=starts[p],
                end_offset=ends[p],
                log_start=log_start[KafkaTP(self.topic, p)],
                log_end=log_end[KafkaTP(self.topic, p)],
                committed=committed[p],
                completed=completed.get(p, frozenset()),
            )
            for p in partitions
        }
        for r in plan.values():
            if committed[r.partition] is not None and r.resumed_from is None:
                log.info(
                    "partition %d: committed offset %s of group %s is outside [%d, %d]: ignored",
                    r.partition,
                    committed[r.partition],
                    self.group_id,
                    r.range_start,
                    r.end,
                )
        self._plan = plan
        self._active = {p for p, r in plan.items() if r.remaining > 0}
        assigned = [KafkaTP(self.topic, p) for p in sorted(self._active)]
        self._consumer.assign(assigned)
        for tp in assigned:
            self._consumer.seek(tp, plan[tp.partition].start)
        return plan

    async def poll(self, max_records: int, timeout_ms: int) -> list[InRecord]:
        """One fetch of at most ``max_records`` records inside the ranges, in offset order per
        partition. A partition whose position reaches its end is paused and leaves
        :attr:`finished`'s complement; records at or past an end are dropped.

        Raises:
            RangeSourceError: a non-retriable fetch error (aiokafka retries the others).
        """
        if not self._active:
            return []
        return await fetch_in_range(
            self._consumer, self.topic, self._plan, self._active, max_records, timeout_ms
        )

    # -- internals -------------------------------------------------------------------------------

    async def _partitions(self) -> list[int]:
        # A short-lived client: the consumer's cluster view only covers topics it already uses.
        client = AIOKafkaClient(
            **client_kwargs(self._client),
            client_id="kbatch-backfill-metadata",
        )
        try:
            await client.bootstrap()
            cluster = await client.fetch_all_metadata()
        finally:
            await client.close()
        found = cluster.partitions_for_topic(self.topic)
        if not found:
            raise RangeSourceError(f"topic {self.topic!r} does not exist (or has no partitions)")
        return sorted(found)

    async def _offsets(
        self,
        bound: RangeBound,
        side: Side,
        partitions: Iterable[int],
        log_start: Mapping[KafkaTP, int],
        log_end: Mapping[KafkaTP, int],
    ) -> dict[int, int]:
        parts = list(partitions)
        default = log_start if side == "from" else log_end
        if isinstance(bound, Earliest):
            return {p: log_start[KafkaTP(self.topic, p)] for p in parts}
        if isinstance(bound, Latest):
            return {p: log_end[KafkaTP(self.topic, p)] for p in parts}
        if isinstance(bound, AtOffsets):
            unknown = sorted(set(bound.offsets) - set(parts))
            if unknown:
                raise RangeSpecError(
                    f"--{side}: topic {self.topic!r} has no partition(s) {unknown} "
                    f"(it has {len(parts)})"
                )
            return {p: bound.offsets.get(p, default[KafkaTP(self.topic, p)]) for p in parts}
        found = await self._consumer.offsets_for_times(
            {KafkaTP(self.topic, p): bound.timestamp_ms for p in parts}
        )
        out: dict[int, int] = {}
        for p in parts:
            tp = KafkaTP(self.topic, p)
            hit = found.get(tp)
            out[p] = log_end[tp] if hit is None else int(hit.offset)
        return out


async def fetch_in_range(
    consumer: AIOKafkaConsumer,
    topic: str,
    plan: Mapping[int, PartitionRange],
    active: set[int],
    max_records: int,
    timeout_ms: int,
) -> list[InRecord]:
    """One fetch of at most ``max_records`` records of ``active``'s partitions of ``topic``,
    records at or past a partition's ``plan`` end dropped; a partition whose position reached
    its end leaves ``active`` (changed in place) and is paused.

    Raises:
        RangeSourceError: a non-retriable fetch error (aiokafka retries the others).
    """
    tps = [KafkaTP(topic, p) for p in sorted(active)]
    with map_kafka_errors(RangeSourceError, f"fetching {topic}"):
        batches = await consumer.getmany(*tps, timeout_ms=timeout_ms, max_records=max_records)
    out: list[InRecord] = []
    for tp, records in batches.items():
        end = plan[tp.partition].end
        out.extend(InRecord.from_consumer_record(r) for r in records if r.offset < end)
    for tp in tps:
        # Known after the seek, so this does no I/O; it moves past transaction markers too.
        if await consumer.position(tp) >= plan[tp.partition].end:
            active.discard(tp.partition)
            consumer.pause(tp)
    return out


async def start_range_consumer(consumer: AIOKafkaConsumer) -> None:
    """Start ``consumer`` (standalone backfill's or a job's).

    Raises:
        RangeSourceError: the broker cannot be reached.
        KafkaSecurityError: the broker refused the client (TLS check, SASL login).
    """
    try:
        await start_client(consumer.start, consumer.stop, "cannot connect to Kafka")
    except KafkaSecurityError:
        raise
    except KafkaUnavailableError as err:
        raise RangeSourceError(str(err)) from err
