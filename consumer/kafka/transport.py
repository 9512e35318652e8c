"""The transport seam: what kbatch needs of a Kafka client, as Protocols, and the factories
that build the chosen client's adapters (each imports its adapter when called).

::

    serve / backfill / jobs (consumer.serve, consumer.finish, consumer.backfill)
        │   offsets, flow control, the error tree, retry / taint / replace policies
        ▼
    consumer.kafka.transport          ◄── these Protocols, and the choice of client
        ├── consumer.kafka (aiokafka adapter: source, sink, transactions, range_source …)
        └── consumer.kafka.confluent_adapter (confluent-kafka / librdkafka)

Each client is an adapter below the seam, chosen once at start-up (``--kafka-client``,
``KBATCH_KAFKA_CLIENT``). Modules above the seam import neither client
(tests/unit/test_import_boundaries.py keeps it so); adapters raise only the errors of
:mod:`consumer.kafka.errors`.

Shapes: a partition is :data:`consumer.kafka.records.TopicPartition` ``(topic, partition)``;
offsets are ints, "the next offset to read"; a record read is
:class:`consumer.kafka.records.InRecord`, one to send :class:`schemas.records.OutRecord`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Protocol

from consumer.kafka.config import ConsumerGroupSettings, KafkaClientSettings, SinkSettings
from consumer.kafka.config import GroupProtocol as GroupProtocol  # the seam's names, defined
from consumer.kafka.config import KafkaClientName as KafkaClientName  # with what they type
from consumer.kafka.errors import KafkaUnavailableError
from consumer.kafka.ranges import PartitionRange, RangeBound
from consumer.kafka.records import InRecord, Membership, TopicPartition
from consumer.kafka.records import RebalanceHandler as RebalanceHandler
from schemas.records import OutRecord


class GroupSource(Protocol):
    """One member of a consumer group reading its topics in chunks, auto-commit off.

    Errors: :class:`consumer.kafka.errors.KafkaUnavailableError` (start: no broker),
    :class:`~consumer.kafka.errors.KafkaSecurityError` (a TLS/SASL refusal or an ACL denial),
    :class:`~consumer.kafka.errors.FencedInstanceError` (another member took this static
    member's id), :class:`~consumer.kafka.errors.CommitError` (a commit refused).
    """

    @property
    def incremental(self) -> bool:
        """How the rebalance handler is called. False (eager: the classic protocol's
        range/round-robin assignors): every rebalance revokes all of this member's partitions
        and ``on_assigned`` gets the whole new assignment; pauses are forgotten (re-applied by
        the owner). True (the consumer protocol, KIP-848; cooperative assignors):
        ``on_revoked`` gets only the partitions that move away and ``on_assigned`` only those
        added; the others are never interrupted and keep their pauses."""

    async def start(self) -> None:
        """Connect and subscribe; partitions arrive through the rebalance handler."""

    async def stop(self) -> None:
        """Leave the group (a static member only after :meth:`leave_group_on_stop`) and
        close; idempotent."""

    def leave_group_on_stop(self) -> None:
        """Make :meth:`stop` leave the group even as a static member."""

    async def poll(self, max_records: int, timeout_ms: int) -> list[InRecord]:
        """At most ``max_records`` records, in partition order; waits at most ``timeout_ms``
        for the first; empty when paused or idle."""

    def membership(self) -> Membership:
        """This member's id and group generation (``("", -1)`` outside the group)."""

    def assignment(self) -> frozenset[TopicPartition]:
        """The partitions this member owns now."""

    def pause(self, tps: Iterable[TopicPartition]) -> None:
        """Stop fetching these partitions (only those still assigned)."""

    def resume(self, tps: Iterable[TopicPartition]) -> None:
        """Fetch these partitions again (only those still assigned)."""

    def paused(self) -> frozenset[TopicPartition]:
        """The partitions paused in the client now."""

    async def commit(
        self,
        offsets: Mapping[TopicPartition, int],
        metadata: Mapping[TopicPartition, str] | None = None,
    ) -> None:
        """Commit ``offsets`` for the group, each with its metadata string ("" if none)."""

    async def committed(self, tp: TopicPartition) -> int | None:
        """The group's committed offset of ``tp`` (None when it has none)."""

    async def committed_metadata(self, tp: TopicPartition) -> tuple[int | None, str]:
        """The committed offset of ``tp`` and its metadata; ``(None, "")`` when none."""

    async def end_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The log end offset of each of ``tps`` asked of the broker (empty when it does not
        answer)."""

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Read ``tp`` from ``offset`` next (a partition no longer assigned is left alone)."""

    async def position(self, tp: TopicPartition) -> int | None:
        """The next offset this member reads from ``tp`` (None when not assigned)."""


class ReplySink(Protocol):
    """An idempotent producer (acks=all) of replies and dead letters.

    A record's future raises :class:`consumer.kafka.errors.DeliveryError` (never
    deliverable: a bad topic or partition, too large, denied) or
    :class:`~consumer.kafka.errors.SinkClosedError` (closed before acknowledged).
    """

    async def start(self) -> None:
        """Connect."""

    async def stop(self) -> None:
        """Flush what is buffered (within the send deadline) and close; idempotent."""

    async def abandon(self) -> None:
        """Drop what is buffered without waiting for the broker."""

    async def send(self, records: Sequence[OutRecord]) -> list[asyncio.Future[None]]:
        """Queue ``records`` in order; one future per record (records that share a fate may
        share one future object), done when the broker acknowledged it."""


class TransactionalReplySink(Protocol):
    """``--exactly-once``: replies and offsets of each input partition in its own
    transactions (:mod:`consumer.kafka.transactions` says why and how).

    Errors: :class:`consumer.kafka.errors.TransactionError` (a commit failed; the partition is
    closed), :class:`~consumer.kafka.errors.KafkaUnavailableError` (open: no producer id).
    """

    @property
    def open_partitions(self) -> frozenset[TopicPartition]:
        """Input partitions with a producer and an open transaction."""

    async def start(self) -> None: ...

    async def stop(self) -> None:
        """Close every partition; idempotent."""

    async def open(self, tp: TopicPartition, timeout_s: float | None = None) -> None:
        """Start ``tp``'s producer (fencing an earlier one) and begin a transaction."""

    async def close(self, tp: TopicPartition) -> None:
        """Abort ``tp``'s open transaction and stop its producer."""

    async def send_from(
        self, tp: TopicPartition, records: Sequence[OutRecord]
    ) -> list[asyncio.Future[None]]:
        """Send ``records`` in ``tp``'s open transaction; one future each."""

    async def commit(
        self, offsets: Mapping[TopicPartition, int], metadata: Mapping[TopicPartition, str]
    ) -> dict[TopicPartition, int]:
        """Commit each partition's transaction with its offsets; returns those committed."""

    async def close_failed(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, str]:
        """Close each of ``tps`` whose producer failed; each one's failure reason."""

    async def send(self, records: Sequence[OutRecord]) -> list[asyncio.Future[None]]:
        """Not available: every record belongs to an input partition's transaction.

        Raises:
            TypeError: always (:meth:`send_from`).
        """


class RangeReader(Protocol):
    """``kbatch backfill``'s bounded source: one topic over a fixed range per partition,
    committing under the job's group without joining it (manual assignment)
    (:class:`consumer.kafka.range_source.RangeSource`, :class:`consumer.kafka.
    confluent_adapter.range_source.ConfluentRangeSource`).

    Call :meth:`start`, then :meth:`resolve` once, then :meth:`poll` until :attr:`finished`
    covers every partition of :attr:`plan`; :meth:`commit` progress as records finish.

    Errors: :class:`consumer.kafka.errors.RangeSourceError` (topic missing, broker down, a
    commit refused), :class:`~consumer.kafka.errors.RangeSpecError` (a bound that does not fit
    the topic), :class:`~consumer.kafka.errors.KafkaSecurityError` (a TLS/SASL refusal or an
    ACL denial).
    """

    topic: str
    group_id: str

    async def start(self) -> None:
        """Connect."""

    async def stop(self) -> None:
        """Close (idempotent; commits nothing)."""

    async def partitions(self) -> list[int]:
        """The source topic's partitions, sorted (asked of the broker)."""

    async def resolve(
        self, from_bound: RangeBound, to_bound: RangeBound
    ) -> dict[int, PartitionRange]:
        """Fix each partition's range now (log bounds, offsets by time, the group's committed
        offset and its metadata) and start reading the non-empty ones at their starts."""

    async def poll(self, max_records: int, timeout_ms: int) -> list[InRecord]:
        """At most ``max_records`` records inside the ranges, in offset order per partition;
        a partition whose position reached its end joins :attr:`finished`."""

    @property
    def plan(self) -> Mapping[int, PartitionRange]:
        """The per-partition ranges (empty before :meth:`resolve`)."""

    @property
    def finished(self) -> frozenset[int]:
        """Partitions whose read position reached their end."""

    async def commit(
        self,
        offsets: Mapping[TopicPartition, int],
        metadata: Mapping[TopicPartition, str] | None = None,
    ) -> None:
        """Commit ``offsets`` for the job's group, each with its metadata string."""


class AssignedRangeReader(Protocol):
    """One assignment's fixed plan of a :class:`GroupRangeReader`: the partitions the group
    gave this member, each resumed from the group's committed offset
    (:class:`consumer.kafka.group_range.AssignedRange`, :class:`consumer.kafka.
    confluent_adapter.group_range.ConfluentAssignedRange`). Reading stops once the assignment
    is revoked (every partition reported finished)."""

    topic: str

    @property
    def plan(self) -> Mapping[int, PartitionRange]: ...

    @property
    def finished(self) -> frozenset[int]: ...

    def positions(self) -> dict[int, int]:
        """Partition → where reading stands (for progress records)."""

    async def poll(self, max_records: int, timeout_ms: int) -> list[InRecord]: ...

    async def commit(
        self,
        offsets: Mapping[TopicPartition, int],
        metadata: Mapping[TopicPartition, str] | None = None,
    ) -> None:
        """As :meth:`RangeReader.commit`; refused once the partitions moved."""


class GroupRangeReader(Protocol):
    """A backfill job's source read through the job's own consumer group: members share the
    topic's partitions, each assignment a fixed plan (:class:`consumer.kafka.group_range.
    GroupRangeSource`, :class:`consumer.kafka.confluent_adapter.group_range.
    ConfluentGroupRangeSource`).

    Errors: :class:`consumer.kafka.errors.RangeSourceError`,
    :class:`~consumer.kafka.errors.KafkaSecurityError`.
    """

    topic: str
    group_id: str
    ranges: dict[int, tuple[int, int]]
    on_revoke: Callable[[], Awaitable[None]] | None
    """Awaited before an assignment's partitions go (the job finishes and commits there)."""
    pause_reading: Callable[[], bool]
    """Asked before each poll: True pauses the assigned partitions (the member stays in the
    group)."""

    async def start(self) -> None:
        """Connect and subscribe."""

    async def stop(self) -> None:
        """Leave the group and close (idempotent; commits nothing itself)."""

    async def next_assignment(self, timeout_s: float) -> list[int] | None:
        """The job's partitions of a new assignment (maybe none), or None when none came
        within ``timeout_s``."""

    async def plan(self, partitions: list[int]) -> AssignedRangeReader:
        """The plan of an assignment's ``partitions``, reading positioned at their starts."""

    async def keepalive(self) -> None:
        """Keep the member in the group while it reads nothing (every partition paused)."""

    async def all_at_end(self) -> bool:
        """Whether the group's committed offset of every partition is at its range's end."""


@contextlib.contextmanager
def needs_confluent() -> Iterator[None]:
    """Import the confluent adapter inside: without confluent-kafka installed (the light
    client install), one clear error instead of an import traceback.

    Raises:
        KafkaUnavailableError: confluent-kafka is not installed.
    """
    try:
        yield
    except ModuleNotFoundError as err:
        if err.name != "confluent_kafka":
            raise
        raise KafkaUnavailableError(
            "--kafka-client confluent needs confluent-kafka: pip install 'kbatch[serve]'"
        ) from None


def group_source(
    client: KafkaClientSettings,
    group: ConsumerGroupSettings,
    handler: RebalanceHandler,
    *,
    group_id: str,
    topics: Iterable[str],
    max_poll_records: int,
) -> GroupSource:
    """serve's group source on ``client.kafka_client``: the aiokafka adapter
    (:class:`consumer.kafka.source.KafkaSource`, classic protocol only) or the confluent one
    (:class:`consumer.kafka.confluent_adapter.source.ConfluentSource`, ``group.group_protocol``).

    Raises:
        ValueError: ``group_protocol="consumer"`` on aiokafka.
    """
    if client.kafka_client == "confluent":
        with needs_confluent():
            from consumer.kafka.confluent_adapter.source import ConfluentSource

        return ConfluentSource(
            client,
            group,
            handler,
            group_id=group_id,
            topics=topics,
            max_poll_records=max_poll_records,
            group_protocol=group.group_protocol,
        )
    if group.group_protocol != "classic":
        raise ValueError("group_protocol=consumer needs kafka_client=confluent")
    from consumer.kafka.source import KafkaSource

    return KafkaSource(
        client, group, handler, group_id=group_id, topics=topics, max_poll_records=max_poll_records
    )


def reply_sink(
    client: KafkaClientSettings, settings: SinkSettings, *, default_topic: str
) -> ReplySink:
    """An idempotent reply sink on ``client.kafka_client``
    (:class:`consumer.kafka.sink.KafkaSink` or
    :class:`consumer.kafka.confluent_adapter.sink.ConfluentSink`)."""
    if client.kafka_client == "confluent":
        with needs_confluent():
            from consumer.kafka.confluent_adapter.sink import ConfluentSink

        return ConfluentSink(client, settings, default_topic=default_topic)
    from consumer.kafka.sink import KafkaSink

    return KafkaSink(client, settings, default_topic=default_topic)


def transactional_sink(
    client: KafkaClientSettings,
    settings: SinkSettings,
    *,
    default_topic: str,
    group_id: str,
    id_prefix: str = "kbatch",
) -> TransactionalReplySink:
    """``--exactly-once``'s sink on ``client.kafka_client``
    (:class:`consumer.kafka.transactions.TransactionalSink` or
    :class:`consumer.kafka.confluent_adapter.transactions.ConfluentTransactionalSink`)."""
    if client.kafka_client == "confluent":
        with needs_confluent():
            from consumer.kafka.confluent_adapter.transactions import ConfluentTransactionalSink

        return ConfluentTransactionalSink(
            client, settings, default_topic=default_topic, group_id=group_id, id_prefix=id_prefix
        )
    from consumer.kafka.transactions import TransactionalSink

    return TransactionalSink(
        client, settings, default_topic=default_topic, group_id=group_id, id_prefix=id_prefix
    )


def client_description(name: KafkaClientName) -> str:
    """The client and its version, for the start-up line: ``aiokafka 0.14.0`` or
    ``confluent-kafka 2.16.1 (librdkafka 2.16.0)``."""
    if name == "confluent":
        import confluent_kafka

        return (
            f"confluent-kafka {confluent_kafka.__version__} "
            f"(librdkafka {confluent_kafka.libversion()[0]})"
        )
    import aiokafka

    return f"aiokafka {aiokafka.__version__}"


def range_reader(client: KafkaClientSettings, *, topic: str, group_id: str) -> RangeReader:
    """``kbatch backfill``'s reader of offset ranges on ``client.kafka_client``
    (:class:`consumer.kafka.range_source.RangeSource` or
    :class:`consumer.kafka.confluent_adapter.range_source.ConfluentRangeSource`)."""
    if client.kafka_client == "confluent":
        with needs_confluent():
            from consumer.kafka.confluent_adapter.range_source import ConfluentRangeSource

        return ConfluentRangeSource(client=client, topic=topic, group_id=group_id)
    from consumer.kafka.range_source import RangeSource

    return RangeSource(client=client, topic=topic, group_id=group_id)


def group_range_reader(
    client: KafkaClientSettings,
    *,
    topic: str,
    group_id: str,
    ranges: Mapping[int, tuple[int, int]],
    session_timeout_ms: int,
    heartbeat_interval_ms: int,
    client_id: str,
) -> GroupRangeReader:
    """A backfill job member's reader on ``client.kafka_client``
    (:class:`consumer.kafka.group_range.GroupRangeSource` or
    :class:`consumer.kafka.confluent_adapter.group_range.ConfluentGroupRangeSource`)."""
    if client.kafka_client == "confluent":
        with needs_confluent():
            from consumer.kafka.confluent_adapter.group_range import ConfluentGroupRangeSource

        return ConfluentGroupRangeSource(
            client=client,
            topic=topic,
            group_id=group_id,
            ranges=ranges,
            session_timeout_ms=session_timeout_ms,
            heartbeat_interval_ms=heartbeat_interval_ms,
            client_id=client_id,
        )
    from consumer.kafka.group_range import GroupRangeSource

    return GroupRangeSource(
        client=client,
        topic=topic,
        group_id=group_id,
        ranges=ranges,
        session_timeout_ms=session_timeout_ms,
        heartbeat_interval_ms=heartbeat_interval_ms,
        client_id=client_id,
    )
