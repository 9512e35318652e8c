"""``kbatch backfill``'s bounded source on confluent-kafka: the drop-in of
:class:`consumer.kafka.range_source.RangeSource` (same methods, semantics and errors; the pure
parts, bounds and :func:`~consumer.kafka.ranges.plan_partition`, are :mod:`consumer.kafka.ranges`).

One :class:`~consumer.kafka.confluent_adapter.owner_thread.ConsumerThread` owns the
``Consumer``. :meth:`ConfluentRangeSource.resolve` asks everything in one command on that
thread (metadata, ``get_watermark_offsets``: the log start and, under ``read_committed``, the
last stable offset, as aiokafka's ``end_offsets``; ``offsets_for_times``; ``committed`` with its
metadata), then ``assign``-s each non-empty partition at its start offset; the thread
consumes from then on and hands the loop chunks. A partition is finished when its position
(which moves past transaction markers), the offset after its last record, or a
``_PARTITION_EOF`` event (``enable.partition.eof``) reaches its end. Commits are synchronous,
explicit ``TopicPartition(topic, partition, offset, metadata=...)``, with auto-commit and
auto offset store off.

Errors raised: as :class:`~consumer.kafka.range_source.RangeSource`: :class:`RangeSpecError`,
:class:`RangeSourceError`, :class:`KafkaSecurityError` (librdkafka's errors translated by
:func:`~consumer.kafka.confluent_adapter.errors.map_confluent_errors`; messages share
aiokafka's context, the cause is librdkafka's text).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message
from confluent_kafka import TopicPartition as KafkaTP

from consumer.kafka.config import KafkaClientSettings
from consumer.kafka.confluent_adapter.client_config import client_config
from consumer.kafka.confluent_adapter.commit_points import commit_point
from consumer.kafka.confluent_adapter.errors import map_confluent_errors
from consumer.kafka.confluent_adapter.owner_thread import Chunk, ConsumerThread
from consumer.kafka.errors import (
    KafkaSecurityError,
    KafkaUnavailableError,
    RangeSourceError,
)
from consumer.kafka.offset_metadata import (
    read_completed,
)
from consumer.kafka.ranges import (
    AtTime,
    PartitionRange,
    RangeBound,
    Side,
    bound_offsets,
    plan_partition,
)
from consumer.kafka.records import InRecord, TopicPartition

__all__ = [
    "CONNECT_TIMEOUT_S",
    "REQUEST_TIMEOUT_S",
    "ConfluentPlannedRead",
    "ConfluentRangeSource",
    "record_of",
]

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 30.0
"""How long one metadata, offsets or commit request may wait for the broker (seconds), as
aiokafka's ``request_timeout_ms`` bounds its requests."""

CONNECT_TIMEOUT_S = 30.0
"""How long :meth:`ConfluentRangeSource.start` waits for a first broker to answer (seconds;
it fails sooner when librdkafka reports every broker down or a refused TLS/SASL login)."""


def record_of(msg: Message) -> InRecord:
    """The plain copy of a confluent-kafka ``Message`` (not an error event)."""
    raw = msg.headers() or []
    pairs = raw.items() if isinstance(raw, dict) else raw
    headers = tuple(
        (name, value if isinstance(value, bytes) else (value or "").encode())
        for name, value in pairs
    )
    return InRecord(
        msg.topic() or "",
        msg.partition() or 0,
        msg.offset() or 0,
        msg.key(),
        msg.value(),
        headers,
        msg.timestamp()[1],
    )


def partitions_of(consumer: Consumer, topic: str) -> list[int]:
    """``topic``'s partitions, sorted (a metadata request; on the owner thread).

    Raises:
        RangeSourceError: the topic does not exist (or has no partitions).
        confluent_kafka.KafkaException: another error of the request or of the topic.
    """
    metadata = consumer.list_topics(topic, timeout=REQUEST_TIMEOUT_S)
    found = metadata.topics.get(topic)
    err = None if found is None else found.error
    if (
        found is None
        or not found.partitions
        or (err is not None and err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART)
    ):
        raise RangeSourceError(f"topic {topic!r} does not exist (or has no partitions)")
    if err is not None:
        raise KafkaException(err)
    return sorted(found.partitions)


def watermarks(
    consumer: Consumer, topic: str, partitions: Iterable[int]
) -> dict[int, tuple[int, int]]:
    """Partition → ``(log start, end)`` asked of the broker (the end is the last stable
    offset under ``read_committed``); on the owner thread.

    Raises:
        confluent_kafka.KafkaException: the broker did not answer.
    """
    return {
        p: consumer.get_watermark_offsets(
            KafkaTP(topic, p), timeout=REQUEST_TIMEOUT_S, cached=False
        )
        for p in partitions
    }


def committed_points(
    consumer: Consumer, topic: str, partitions: Iterable[int]
) -> dict[int, tuple[int, str]]:
    """Partition → ``(offset, metadata)`` of each that has a committed offset in the
    consumer's group; on the owner thread.

    Raises:
        confluent_kafka.KafkaException: the coordinator refused or did not answer.
    """
    tps = [KafkaTP(topic, p) for p in partitions]
    if not tps:
        return {}
    out: dict[int, tuple[int, str]] = {}
    for tp in consumer.committed(tps, timeout=REQUEST_TIMEOUT_S):
        if tp.error is not None:
            raise KafkaException(tp.error)
        if tp.offset >= 0:
            out[tp.partition] = (tp.offset, tp.metadata or "")
    return out


@dataclass(frozen=True, slots=True)
class _Snapshot:
    """What :meth:`ConfluentRangeSource.resolve` asks of the broker, in one command."""

    watermarks: dict[int, tuple[int, int]]
    by_time: dict[int, dict[int, int | None]]  # timestamp_ms → partition → offset (None: none)
    committed: dict[int, tuple[int, str]]


class ConfluentPlannedRead:
    """A fixed plan being read and committed over a :class:`ConsumerThread`: the confluent
    counterpart of :class:`consumer.kafka.range_source.PlannedRead`. Subclasses set ``topic``,
    ``_thread``, ``_plan`` and ``_active`` (the partitions still being read)."""

    topic: str
    _thread: ConsumerThread
    _plan: dict[int, PartitionRange]
    _active: set[int]

    @property
    def plan(self) -> Mapping[int, PartitionRange]:
        """The per-partition ranges (empty before :meth:`ConfluentRangeSource.resolve`)."""
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
        tps = [commit_point(t, p, off, meta.get((t, p), "")) for (t, p), off in offsets.items()]

        def commit(consumer: Consumer) -> None:
            for tp in consumer.commit(offsets=tps, asynchronous=False):
                if tp.error is not None:
                    raise KafkaException(tp.error)

        with map_confluent_errors(RangeSourceError, f"commit of {dict(offsets)} failed"):
            await self._thread.call(commit)

    async def _read(self, max_records: int, timeout_ms: int) -> list[InRecord]:
        """One take of at most ``max_records`` records of the active partitions, records at or
        past a partition's end dropped; a partition whose position reached its end leaves
        ``_active`` and is paused.

        Raises:
            RangeSourceError: a non-retriable fetch error (librdkafka retries the others).
        """
        try:
            chunk = await self._thread.take(max_records, timeout_ms / 1000)
        except KafkaUnavailableError as err:
            raise RangeSourceError(f"fetching {self.topic}: {err}") from err
        out, reached = self._absorb(chunk)
        done = sorted(p for p in self._active if reached.get(p, -1) >= self._plan[p].end)
        if done:
            self._active.difference_update(done)
            tps = [KafkaTP(self.topic, p) for p in done]
            with map_confluent_errors(RangeSourceError, f"pausing {self.topic}"):
                await self._thread.call(lambda c: c.pause(tps))
        return out

    def _absorb(self, chunk: Chunk) -> tuple[list[InRecord], dict[int, int]]:
        out: list[InRecord] = []
        reached: dict[int, int] = {}
        for m in chunk.messages:
            p = m.partition()
            if m.topic() != self.topic or p is None or p not in self._active:
                continue
            offset = m.offset() or 0
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    reached[p] = max(reached.get(p, 0), offset)
                elif err.retriable():
                    log.debug("fetching %s [%d]: %s", self.topic, p, err.str())
                else:
                    with map_confluent_errors(RangeSourceError, f"fetching {self.topic}"):
                        raise KafkaException(err)
                continue
            reached[p] = max(reached.get(p, 0), offset + 1)
            if offset < self._plan[p].end:
                out.append(record_of(m))
        for (t, p), position in chunk.positions.items():
            if t == self.topic:
                reached[p] = max(reached.get(p, 0), position)
        return out, reached


class ConfluentRangeSource(ConfluentPlannedRead):
    """Reads ``topic`` over a fixed range per partition, committing under ``group_id``: the
    confluent-kafka drop-in of :class:`consumer.kafka.range_source.RangeSource`.

    Call :meth:`start`, then :meth:`resolve` once, then :meth:`poll` until :attr:`finished`
    covers every partition of :attr:`plan`; :meth:`commit` progress as records finish.

    Args:
        client: the brokers and their TLS/SASL settings
            (:func:`~consumer.kafka.confluent_adapter.client_config.client_config`).
        topic: the source topic.
        group_id: the consumer group the job commits under (it never joins it: partitions
            are assigned manually, so two jobs with one group would overwrite each other's
            commits).
        max_partition_fetch_bytes: librdkafka's ``max.partition.fetch.bytes``.

    Raises:
        KafkaSecurityError: a CA, key, password or token file cannot be read.
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
        config: dict[str, Any] = {
            **client_config(client),
            "group.id": group_id,
            "client.id": "kbatch-backfill",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "max.partition.fetch.bytes": max_partition_fetch_bytes,
        }
        self._thread = ConsumerThread(config, name=f"kbatch-backfill {topic}")
        self._plan: dict[int, PartitionRange] = {}
        self._active: set[int] = set()
        self._started = False

    async def start(self) -> None:
        """Connect.

        Raises:
            RangeSourceError: the broker cannot be reached.
            KafkaSecurityError: the broker refused the client (TLS check, SASL login).
        """
        await start_thread(self._thread)
        self._started = True

    async def stop(self) -> None:
        """Close the consumer (idempotent; commits nothing)."""
        if self._started:
            self._started = False
            await self._thread.close()

    async def partitions(self) -> list[int]:
        """The source topic's partitions, sorted (asked of the broker).

        Raises:
            RangeSourceError: the topic does not exist, or the broker failed to answer.
        """
        with map_confluent_errors(RangeSourceError, f"listing the partitions of {self.topic}"):
            return await self._thread.call(lambda c: partitions_of(c, self.topic))

    async def resolve(
        self, from_bound: RangeBound, to_bound: RangeBound
    ) -> dict[int, PartitionRange]:
        """Fix each partition's range now, assign the non-empty ones at their starts.

        Raises:
            RangeSourceError: the topic does not exist, or the broker failed to answer.
            RangeSpecError: a ``P:OFFSET`` bound names a partition the topic does not have.
        """
        stamps = {b.timestamp_ms for b in (from_bound, to_bound) if isinstance(b, AtTime)}

        def ask(consumer: Consumer) -> _Snapshot:
            partitions = partitions_of(consumer, self.topic)
            by_time: dict[int, dict[int, int | None]] = {}
            for ts in sorted(stamps):
                found = consumer.offsets_for_times(
                    [KafkaTP(self.topic, p, ts) for p in partitions], timeout=REQUEST_TIMEOUT_S
                )
                for tp in found:
                    if tp.error is not None:
                        raise KafkaException(tp.error)
                by_time[ts] = {tp.partition: tp.offset if tp.offset >= 0 else None for tp in found}
            return _Snapshot(
                watermarks=watermarks(consumer, self.topic, partitions),
                by_time=by_time,
                committed=committed_points(consumer, self.topic, partitions),
            )

        with map_confluent_errors(RangeSourceError, f"resolving the range of {self.topic}"):
            snap = await self._thread.call(ask)
        log_start = {p: low for p, (low, _) in snap.watermarks.items()}
        log_end = {p: high for p, (_, high) in snap.watermarks.items()}

        def side(bound: RangeBound, name: Side) -> dict[int, int]:
            times = snap.by_time.get(bound.timestamp_ms, {}) if isinstance(bound, AtTime) else {}
            return bound_offsets(bound, name, self.topic, log_start, log_end, times)

        starts, ends = side(from_bound, "from"), side(to_bound, "to")
        plan = {
            p: plan_partition(
                p,
                start_offset=starts[p],
                end_offset=ends[p],
                log_start=log_start[p],
                log_end=log_end[p],
                committed=snap.committed.get(p, (None, ""))[0],
                completed=read_completed(*snap.committed[p], where=(self.topic, p))
                if p in snap.committed
                else frozenset(),
            )
            for p in sorted(log_start)
        }
        for r in plan.values():
            if r.partition in snap.committed and r.resumed_from is None:
                log.info(
                    "partition %d: committed offset %s of group %s is outside [%d, %d]: ignored",
                    r.partition,
                    snap.committed[r.partition][0],
                    self.group_id,
                    r.range_start,
                    r.end,
                )
        self._plan = plan
        self._active = {p for p, r in plan.items() if r.remaining > 0}
        assigned = [KafkaTP(self.topic, p, plan[p].start) for p in sorted(self._active)]
        with map_confluent_errors(RangeSourceError, f"assigning {self.topic}"):
            await self._thread.call(lambda c: c.assign(assigned))
        self._thread.consuming = bool(assigned)
        return plan

    async def poll(self, max_records: int, timeout_ms: int) -> list[InRecord]:
        """One take of at most ``max_records`` records inside the ranges, in offset order per
        partition. A partition whose position reaches its end is paused and leaves
        :attr:`finished`'s complement; records at or past an end are dropped.

        Raises:
            RangeSourceError: a non-retriable fetch error (librdkafka retries the others).
        """
        if not self._active:
            return []
        records = await self._read(max_records, timeout_ms)
        if not self._active:  # every partition at its end: the thread only serves commits now
            self._thread.consuming = False
        return records


async def start_thread(thread: ConsumerThread) -> None:
    """Start ``thread`` and wait for a broker to answer (standalone backfill's or a job's); the
    thread is closed again when none does.

    Raises:
        RangeSourceError: the broker cannot be reached (``cannot connect to Kafka: …``).
        KafkaSecurityError: the broker refused the client (TLS check, SASL login).
    """
    thread.start()
    try:
        await thread.connect("cannot connect to Kafka", CONNECT_TIMEOUT_S)
    except KafkaSecurityError:
        await thread.close()
        raise
    except KafkaUnavailableError as err:
        await thread.close()
        raise RangeSourceError(str(err)) from err
