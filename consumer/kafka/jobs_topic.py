"""The compacted jobs topic (docs/JOBS.md): create it, write a record, read it from the start.

Records are opaque ``(key, value)`` bytes here; :mod:`consumer.jobs.records` gives them meaning.
The topic has one partition (job records are few and their order matters per key only, but one
partition keeps ``status`` a single read) and ``cleanup.policy=compact``: the latest value of
each key survives. Its replicas: ``--jobs-topic-replication-factor``, else the cluster's
default (:mod:`consumer.kafka.durability`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as KafkaTP
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResourceType
from aiokafka.errors import KafkaError, TopicAlreadyExistsError

from consumer.kafka.aiokafka_errors import map_kafka_errors
from consumer.kafka.client_config import FIRST_ANSWER_TIMEOUT_S, client_kwargs, start_client
from consumer.kafka.config import KafkaClientSettings
from consumer.kafka.durability import (
    choose_replication,
    cluster_replication,
    read_config,
    topic_durability,
)
from consumer.kafka.errors import JobsTopicError, KafkaUnavailableError

__all__ = ["JobsTopicReader", "ensure_jobs_topic", "read_jobs_topic", "write_jobs_record"]

COMPACTED = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.1"}

log = logging.getLogger(__name__)


async def ensure_jobs_topic(
    client: KafkaClientSettings,
    topic: str,
    *,
    replication_factor: int | None = None,
    request_topic: str | None = None,
    create: bool = True,
) -> bool:
    """Create ``topic`` (1 partition, compacted) when missing; True when it was created. With
    ``create`` False (serve's ``--no-create-topics``) a missing topic is an error instead.

    Replicas: ``replication_factor``, else the cluster's default, else ``min(3, brokers)``
    (:func:`consumer.kafka.durability.choose_replication`); ``min.insync.replicas`` is the
    broker's default, as for the other topics kbatch creates. An existing topic must be
    compacted: a data topic named by mistake (``--jobs-topic`` set to a job's source, say) is
    refused rather than written job records into. Where the broker does not let this client
    read the topic's configuration (ACLs without DescribeConfigs), the check is skipped. With
    ``request_topic`` (serve's), a WARNING says so when the jobs topic is less durable than it
    (:meth:`~consumer.kafka.durability.Durability.weaker_than`): a broker loss the requests
    survive would stop ``kbatch backfill status`` and ``submit``.

    Raises:
        KafkaUnavailableError: no broker answered (KafkaSecurityError: refused).
        JobsTopicError: the broker refused to create it, it exists and is not compacted, or
            it is missing and ``create`` is False.
    """
    admin = AIOKafkaAdminClient(**client_kwargs(client))
    await start_client(
        admin.start,
        admin.close,
        f"no Kafka broker answered at {client.bootstrap}",
        FIRST_ANSWER_TIMEOUT_S,
    )
    try:
        created = await _create_or_check(admin, topic, replication_factor, create)
        if request_topic is not None:
            await _compare_durability(admin, topic, request_topic)
        return created
    finally:
        await admin.close()


async def _create_or_check(
    admin: AIOKafkaAdminClient, topic: str, replication_factor: int | None, create: bool
) -> bool:
    if topic in set(await admin.list_topics()):
        policy = await read_config(admin, ConfigResourceType.TOPIC, topic, "cleanup.policy")
        if policy is not None and "compact" not in policy.split(","):
            raise JobsTopicError(
                f"{topic!r} is not a jobs topic: its cleanup.policy is {policy!r} and a jobs "
                "topic is compacted (choose another --jobs-topic)"
            )
        return False
    if not create:
        raise JobsTopicError(
            f"the jobs topic {topic!r} does not exist and --no-create-topics leaves creating "
            "it to you (one partition, cleanup.policy=compact)"
        )
    with map_kafka_errors(JobsTopicError, f"creating the jobs topic {topic!r}"):
        default, brokers = await cluster_replication(admin)
    try:
        replicas, why = choose_replication(replication_factor, default, brokers)
    except ValueError as err:
        raise JobsTopicError(f"creating the jobs topic {topic!r}: {err}") from err
    try:
        with map_kafka_errors(JobsTopicError, f"creating the jobs topic {topic!r}"):
            response = await admin.create_topics(
                [NewTopic(topic, num_partitions=1, replication_factor=replicas,
                          topic_configs=COMPACTED)]
            )  # fmt: skip
    except JobsTopicError as err:
        if isinstance(err.__cause__, TopicAlreadyExistsError):
            return False
        raise
    for name, code, *rest in getattr(response, "topic_errors", ()):
        if code not in (0, TopicAlreadyExistsError.errno):
            message = rest[0] if rest else ""
            raise JobsTopicError(
                f"creating the jobs topic {name!r} with {replicas} replica(s) ({why}): "
                f"error {code} {message}"
            )
    log.info("created the jobs topic %s (compacted, %d replica(s): %s)", topic, replicas, why)
    return True


async def _compare_durability(admin: AIOKafkaAdminClient, topic: str, request_topic: str) -> None:
    """Log a WARNING when ``topic`` is less durable than ``request_topic`` (both existing)."""
    try:
        jobs = await topic_durability(admin, topic)
        requests = await topic_durability(admin, request_topic)
    except KafkaError as err:  # a check only: the jobs topic works
        log.warning("durability of %s not compared with %s: %r", topic, request_topic, err)
        return
    if jobs is not None and requests is not None and jobs.weaker_than(requests):
        log.warning(
            "the jobs topic %s is less durable than the request topic %s (%s against %s): a "
            "broker loss the requests survive can stop backfill jobs; reassign its partition "
            "to more replicas (kafka-reassign-partitions) or set min.insync.replicas",
            topic,
            request_topic,
            jobs,
            requests,
        )


async def write_jobs_record(
    client: KafkaClientSettings, topic: str, key: bytes, value: bytes | None
) -> None:
    """Write one record (``value`` None: a tombstone) with a short-lived producer, acks=all.

    Raises:
        KafkaUnavailableError: no broker answered.
        JobsTopicError: the write failed.
    """
    writer = JobsTopicWriter(client, topic)
    await writer.start()
    try:
        await writer.write(key, value)
    finally:
        await writer.stop()


class JobsTopicWriter:
    """A producer of jobs-topic records (acks=all, idempotent).

    The aiokafka producer is made by :meth:`start`: one made and never started logs
    "Unclosed AIOKafkaProducer" at ERROR when it is collected (serve with a jobs topic it
    cannot use would print that after its one "backfill jobs off" line)."""

    def __init__(self, client: KafkaClientSettings, topic: str) -> None:
        self.topic = topic
        self._client = client
        self._producer: AIOKafkaProducer | None = None

    async def start(self) -> None:
        """Connect. Raises KafkaUnavailableError: no broker answered."""
        producer = AIOKafkaProducer(
            acks="all",
            enable_idempotence=True,
            client_id="kbatch-jobs",
            **client_kwargs(self._client),
        )
        await start_client(producer.start, producer.stop, "cannot connect to Kafka (jobs topic)")
        self._producer = producer

    async def stop(self) -> None:
        """Flush and close (idempotent)."""
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()

    async def write(self, key: bytes, value: bytes | None) -> None:
        """Write and wait for the acknowledgement. Raises JobsTopicError: it failed."""
        assert self._producer is not None, "start() first"
        with map_kafka_errors(JobsTopicError, f"writing {key!r} to {self.topic}"):
            await self._producer.send_and_wait(self.topic, value, key=key)


class JobsTopicReader:
    """Reads the jobs topic from its beginning, without a group (every reader sees everything).

    Call :meth:`start`, then :meth:`poll` repeatedly; :meth:`caught_up` says whether what was
    polled reaches the end offsets asked at start (the state written before this reader began).
    Like the writer's producer, the aiokafka consumer is made by :meth:`start`.
    """

    def __init__(self, client: KafkaClientSettings, topic: str) -> None:
        self.topic = topic
        self._client = client
        self._live: AIOKafkaConsumer | None = None  # made and started by start()
        self._tps: list[KafkaTP] = []
        self._ends: dict[KafkaTP, int] = {}

    @property
    def _consumer(self) -> AIOKafkaConsumer:
        assert self._live is not None, "start() first"
        return self._live

    async def start(self) -> None:
        """Connect, assign every partition of the topic at its beginning.

        Raises:
            KafkaUnavailableError: no broker answered.
            JobsTopicError: the topic does not exist.
        """
        consumer = AIOKafkaConsumer(
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            client_id="kbatch-jobs-reader",
            **client_kwargs(self._client),
        )
        await start_client(consumer.start, consumer.stop, "cannot connect to Kafka (jobs topic)")
        self._live = consumer  # stop() closes it from here on, whatever follows fails
        with map_kafka_errors(JobsTopicError, f"reading {self.topic}"):
            partitions = None
            for _ in range(20):  # metadata of a topic created a moment ago may lag
                partitions = self._consumer.partitions_for_topic(self.topic)
                if partitions:
                    break
                await self._consumer._client.force_metadata_update()
                await asyncio.sleep(0.1)
            if not partitions:
                raise JobsTopicError(
                    f"jobs topic {self.topic!r} does not exist (kbatch serve creates it)"
                )
            self._tps = [KafkaTP(self.topic, p) for p in sorted(partitions)]
            self._consumer.assign(self._tps)
            await self._consumer.seek_to_beginning(*self._tps)
            self._ends = await self._consumer.end_offsets(self._tps)

    async def stop(self) -> None:
        """Close (idempotent)."""
        consumer, self._live = self._live, None
        if consumer is not None:
            await consumer.stop()

    async def poll(self, timeout_ms: int) -> list[tuple[bytes | None, bytes | None]]:
        """The next records, ``(key, value)`` in topic order.

        Raises:
            JobsTopicError: a non-retriable fetch error.
        """
        with map_kafka_errors(JobsTopicError, f"reading {self.topic}"):
            batches = await self._consumer.getmany(timeout_ms=timeout_ms, max_records=500)
        return [(r.key, r.value) for tp in self._tps for r in batches.get(tp, [])]

    async def caught_up(self) -> bool:
        """Whether every record written before :meth:`start` was polled."""
        for tp in self._tps:
            if await self._consumer.position(tp) < self._ends.get(tp, 0):
                return False
        return True


async def read_jobs_topic(
    client: KafkaClientSettings, topic: str, timeout_s: float = 15.0
) -> list[tuple[bytes | None, bytes | None]]:
    """Every record of the jobs topic up to its end now (for ``kbatch backfill status``).

    Raises:
        KafkaUnavailableError: no broker answered.
        JobsTopicError: the topic does not exist, or it could not be read within ``timeout_s``.
    """
    reader = JobsTopicReader(client, topic)
    try:
        await reader.start()
        out: list[tuple[bytes | None, bytes | None]] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not await reader.caught_up():
            if loop.time() > deadline:
                raise JobsTopicError(f"reading {topic} did not reach its end in {timeout_s:g} s")
            out.extend(await reader.poll(200))
        return out
    finally:
        with contextlib.suppress(KafkaError, KafkaUnavailableError):
            await reader.stop()
