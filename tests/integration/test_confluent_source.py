"""The group source's contract (:class:`consumer.kafka.transport.GroupSource`) against the real
broker, checked on both clients where it is the same: aiokafka's
:class:`~consumer.kafka.source.KafkaSource` and confluent-kafka's
:class:`~consumer.kafka.confluent_adapter.source.ConfluentSource`; then what only librdkafka
does (the consumer group protocol of KIP-848)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from consumer.kafka.config import ConsumerGroupSettings, KafkaClientSettings
from consumer.kafka.confluent_adapter.source import BUFFERED_POLLS, ConfluentSource
from consumer.kafka.errors import CommitError, FencedInstanceError, KafkaUnavailableError
from consumer.kafka.records import InRecord, Membership, TopicPartition
from consumer.kafka.source import KafkaSource
from consumer.kafka.transport import GroupProtocol, GroupSource
from tests.conftest import TopicFactory, unique_group
from tests.integration.harness import free_port

pytestmark = pytest.mark.integration

CLIENTS = [pytest.param("aiokafka", id="aiokafka"), pytest.param("confluent", id="confluent")]
FAST_GROUP = {"session_timeout_ms": 6_000, "heartbeat_interval_ms": 500}
BASE_TIMESTAMP_MS = time.time_ns() // 1_000_000 - 60_000
"""The records' timestamps start a minute before the tests: a fixed timestamp from the past
(2023's) is older than the broker's ``retention.ms`` (7 days), and its records vanished
whenever the broker's retention check (every 5 minutes) ran between a test's produce and its
reads (the log start offset moved past them: "read 0 records in 30 s")."""


@dataclass
class Recorder:
    """A rebalance handler that records its calls; ``on_assign``/``on_revoke`` (given the
    partitions) run inside them, as serve's handler calls the source there."""

    assigned: list[frozenset[TopicPartition]] = field(default_factory=list)
    revoked: list[frozenset[TopicPartition]] = field(default_factory=list)
    on_assign: Callable[[frozenset[TopicPartition]], Awaitable[None]] | None = None
    on_revoke: Callable[[frozenset[TopicPartition]], Awaitable[None]] | None = None

    async def on_assigned(self, tps: frozenset[TopicPartition]) -> None:
        if self.on_assign is not None:
            await self.on_assign(tps)
        self.assigned.append(tps)

    async def on_revoked(self, tps: frozenset[TopicPartition]) -> None:
        if self.on_revoke is not None:
            await self.on_revoke(tps)
        self.revoked.append(tps)


def make_source(
    kind: str,
    bootstrap: str,
    group_id: str,
    topics: Iterable[str],
    handler: Recorder,
    *,
    protocol: GroupProtocol = "classic",
    **group: Any,
) -> GroupSource:
    client = KafkaClientSettings(bootstrap=bootstrap)
    settings = ConsumerGroupSettings(**{**FAST_GROUP, **group})
    if kind == "aiokafka":
        return KafkaSource(
            client, settings, handler, group_id=group_id, topics=topics, max_poll_records=100
        )
    return ConfluentSource(
        client,
        settings,
        handler,
        group_id=group_id,
        topics=topics,
        max_poll_records=100,
        group_protocol=protocol,
    )


async def produce(
    bootstrap: str, topic: str, records: Iterable[tuple[int, bytes, list[tuple[str, bytes]]]]
) -> None:
    """``(partition, key, headers)`` each; value ``b"v-" + key``; timestamp
    :data:`BASE_TIMESTAMP_MS` plus the record's index (ms)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        futures = [
            await producer.send(
                topic,
                b"v-" + key,
                key=key,
                partition=partition,
                headers=headers,
                timestamp_ms=BASE_TIMESTAMP_MS + i,
            )
            for i, (partition, key, headers) in enumerate(records)
        ]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.02)


async def read(
    source: GroupSource, done: Callable[[list[InRecord]], bool], timeout_s: float
) -> list[InRecord]:
    """Poll until ``done(records so far)``; fail after ``timeout_s``."""
    got: list[InRecord] = []
    deadline = time.monotonic() + timeout_s
    while not done(got):
        if time.monotonic() > deadline:
            raise AssertionError(f"read {len(got)} records in {timeout_s} s: {got[-3:]}")
        got.extend(await source.poll(50, 50))
    return got


async def drain(source: GroupSource, for_s: float) -> list[InRecord]:
    """Everything polled during ``for_s`` seconds."""
    got: list[InRecord] = []
    deadline = time.monotonic() + for_s
    while time.monotonic() < deadline:
        got.extend(await source.poll(50, 50))
    return got


def offsets(records: list[InRecord], tp: TopicPartition) -> list[int]:
    return [r.offset for r in records if r.tp == tp]


@pytest.mark.parametrize("kind", CLIENTS)
async def test_records_arrive_in_partition_order_with_keys_headers_and_timestamps(
    kind: str, kafka_bootstrap: str, new_topic: TopicFactory
) -> None:
    topic = await new_topic("cfsrc", partitions=2)
    sent = [(i % 2, f"k{i}".encode(), [("h", b"x"), ("i", str(i).encode())]) for i in range(20)]
    await produce(kafka_bootstrap, topic, sent)
    source = make_source(kind, kafka_bootstrap, unique_group(), [topic], Recorder())
    await source.start()
    try:
        got = await read(source, lambda rs: len(rs) >= 20, 30)
    finally:
        await source.stop()
    assert offsets(got, (topic, 0)) == list(range(10))
    assert offsets(got, (topic, 1)) == list(range(10))
    for r in got:
        i = int(r.key.decode()[1:])  # type: ignore[union-attr]
        assert (r.partition, r.value) == (i % 2, b"v-" + r.key)  # type: ignore[operator]
        assert list(r.headers) == [("h", b"x"), ("i", str(i).encode())]
        assert r.timestamp_ms == BASE_TIMESTAMP_MS + i
        assert r.tp == (topic, r.partition)


@pytest.mark.parametrize("kind", CLIENTS)
async def test_pause_stops_a_partition_and_resume_brings_it_back_in_order(
    kind: str, kafka_bootstrap: str, new_topic: TopicFactory
) -> None:
    topic = await new_topic("cfsrc", partitions=2)
    p0, p1 = (topic, 0), (topic, 1)
    await produce(kafka_bootstrap, topic, [(i % 2, f"k{i}".encode(), []) for i in range(20)])
    source = make_source(kind, kafka_bootstrap, unique_group(), [topic], Recorder())
    await source.start()
    try:
        await until(lambda: source.assignment() == {p0, p1}, 30, "the assignment")
        source.pause([p0])
        assert source.paused() == {p0}
        first = await read(source, lambda rs: len(offsets(rs, p1)) >= 10, 30)
        first += await drain(source, 0.5)
        source.resume([p0])
        assert source.paused() == frozenset()
        later = await read(source, lambda rs: len(offsets(rs, p0)) >= 10, 30)
    finally:
        await source.stop()
    assert offsets(first, p0) == []
    assert offsets(first, p1) == list(range(10))
    assert offsets(later, p0) == list(range(10))


@pytest.mark.parametrize("kind", CLIENTS)
async def test_an_idle_partition_has_a_position_before_any_fetch(
    kind: str, kafka_bootstrap: str, new_topic: TopicFactory
) -> None:
    # serve's lag gauge reads it before the first record (Rebalancer.refresh_lag): an empty
    # partition starts at its end, one with records at the reset policy's end (earliest).
    topic = await new_topic("cfsrc", partitions=2)
    empty, full = (topic, 0), (topic, 1)
    await produce(kafka_bootstrap, topic, [(1, f"k{i}".encode(), []) for i in range(5)])
    source = make_source(kind, kafka_bootstrap, unique_group(), [topic], Recorder())
    await source.start()
    try:
        await until(lambda: source.assignment() == {empty, full}, 30, "the assignment")
        source.pause([empty, full])  # nothing is fetched
        assert await source.position(empty) == 0
        assert await source.position(full) == 0
    finally:
        await source.stop()


@pytest.mark.parametrize("kind", CLIENTS)
async def test_seek_position_and_end_offsets(
    kind: str, kafka_bootstrap: str, new_topic: TopicFactory
) -> None:
    topic = await new_topic("cfsrc")
    tp = (topic, 0)
    await produce(kafka_bootstrap, topic, [(0, f"k{i}".encode(), []) for i in range(10)])
    source = make_source(kind, kafka_bootstrap, unique_group(), [topic], Recorder())
    await source.start()
    try:
        got = await read(source, lambda rs: len(rs) >= 10, 30)
        assert await source.position(tp) == 10
        assert await source.end_offsets([tp]) == {tp: 10}
        source.seek(tp, 3)
        assert await source.position(tp) == 3
        again = await read(source, lambda rs: len(rs) >= 7, 30)
        again += await drain(source, 0.3)
        assert await source.position((topic, 5)) is None  # not assigned
    finally:
        await source.stop()
    assert offsets(got, tp) == list(range(10))
    assert offsets(again, tp) == list(range(3, 10))
    if isinstance(source, ConfluentSource):  # stopped: every call answers at once
        assert source.assignment() == frozenset() and await source.position(tp) is None
        assert await source.end_offsets([tp]) == {}
        assert await source.committed_metadata(tp) == (None, "")
        with pytest.raises(CommitError):
            await source.commit({tp: 1})
        assert await source.poll(10, 0) == []


@pytest.mark.parametrize("kind", CLIENTS)
async def test_a_commit_with_metadata_is_read_back_by_a_new_member(
    kind: str, kafka_bootstrap: str, new_topic: TopicFactory
) -> None:
    topic = await new_topic("cfsrc")
    tp = (topic, 0)
    await produce(kafka_bootstrap, topic, [(0, f"k{i}".encode(), []) for i in range(10)])
    group = unique_group()
    first = make_source(kind, kafka_bootstrap, group, [topic], Recorder())
    await first.start()
    try:
        await read(first, lambda rs: len(rs) >= 10, 30)
        assert await first.committed(tp) is None
        await first.commit({tp: 6}, {tp: "kb1:meta"})
    finally:
        await first.stop()
    second = make_source(kind, kafka_bootstrap, group, [topic], Recorder())
    await second.start()
    try:
        assert await second.committed_metadata(tp) == (6, "kb1:meta")
        assert await second.committed(tp) == 6
        assert await second.committed_metadata((topic, 7)) == (None, "")
        got = await read(second, lambda rs: len(rs) >= 4, 30)
        if isinstance(second, ConfluentSource):  # for send_offsets_to_transaction
            assert isinstance(await second.consumer_group_metadata(), bytes)
    finally:
        await second.stop()
    assert offsets(got, tp) == [6, 7, 8, 9]


@pytest.mark.parametrize("kind", CLIENTS)
async def test_a_handler_that_calls_the_source_inside_its_callbacks_does_not_deadlock(
    kind: str, kafka_bootstrap: str, new_topic: TopicFactory
) -> None:
    topic = await new_topic("cfsrc", partitions=2)
    await produce(kafka_bootstrap, topic, [(i % 2, f"k{i}".encode(), []) for i in range(20)])
    group = unique_group()
    sources: list[GroupSource] = []
    positions: list[int | None] = []
    memberships: list[tuple[str, Membership]] = []

    async def on_assign(tps: frozenset[TopicPartition]) -> None:  # as serve's set-up does
        source = sources[0]
        memberships.append(("assigned", source.membership()))
        source.pause(tps)
        for tp in tps:
            committed, _ = await source.committed_metadata(tp)
            source.seek(tp, 2 if committed is None else committed)
            positions.append(await source.position(tp))
        source.resume(tps)

    async def on_revoke(tps: frozenset[TopicPartition]) -> None:  # as serve's revoke does
        if tps:
            memberships.append(("revoked", sources[0].membership()))
        await sources[0].commit({tp: 5 for tp in tps}, {tp: "revoked" for tp in tps})

    handler = Recorder(on_assign=on_assign, on_revoke=on_revoke)
    sources.append(make_source(kind, kafka_bootstrap, group, [topic], handler))
    other = make_source(kind, kafka_bootstrap, group, [topic], Recorder())
    await sources[0].start()
    try:
        got = await read(sources[0], lambda rs: len(rs) >= 16, 30)
        await other.start()
        await until(lambda: bool(handler.revoked), 30, "a revocation")
        await read(sources[0], lambda _: len(handler.assigned) >= 2, 30)
        assert await sources[0].committed((topic, 0)) == 5
    finally:
        await other.stop()
        await sources[0].stop()
    assert offsets(got, (topic, 0))[:8] == list(range(2, 10))
    assert offsets(got, (topic, 1))[:8] == list(range(2, 10))
    assert positions[:2] == [2, 2]
    # aiokafka revokes nothing before its first join: the first revocation that holds some
    assert next(r for r in handler.revoked if r) == {(topic, 0), (topic, 1)}
    # The revocation in generation G, the next assignment in G + 1 by the same member: the
    # rebalance handover keeps the work of the partitions given back (consumer.serve.handover).
    (_, first), (_, revoked), (_, again) = memberships[:3]
    assert [kind for kind, _ in memberships[:3]] == ["assigned", "revoked", "assigned"]
    assert first.member_id != "" and first.generation >= 0
    assert revoked == first
    assert again.member_id == revoked.member_id and again.generation == revoked.generation + 1


@pytest.mark.parametrize("kind", CLIENTS)
async def test_no_broker_is_an_unavailable_error_within_seconds(kind: str) -> None:
    bootstrap = f"127.0.0.1:{free_port()}"
    source = make_source(kind, bootstrap, unique_group(), ["t"], Recorder())
    started = time.monotonic()
    with pytest.raises(KafkaUnavailableError, match=f"no Kafka broker answered at {bootstrap}"):
        await source.start()
    await source.stop()
    assert time.monotonic() - started < 10


async def test_the_consumer_protocol_moves_only_the_partitions_that_move_and_keeps_pauses(
    kafka_bootstrap: str, new_topic: TopicFactory
) -> None:
    topic = await new_topic("cfsrc", partitions=4)
    everything = {(topic, p) for p in range(4)}
    group = unique_group()
    first_handler, second_handler = Recorder(), Recorder()
    first = make_source(
        "confluent", kafka_bootstrap, group, [topic], first_handler, protocol="consumer"
    )
    second = make_source(
        "confluent", kafka_bootstrap, group, [topic], second_handler, protocol="consumer"
    )
    await first.start()
    try:
        await until(lambda: first.assignment() == everything, 30, "all four at the first")
        first.pause(everything)
        await produce(kafka_bootstrap, topic, [(i % 4, f"k{i}".encode(), []) for i in range(8)])
        await second.start()
        await until(
            lambda: len(first.assignment()) == 2 and len(second.assignment()) == 2,
            45,
            "two partitions each",
        )
        kept = first.assignment()
        moved = everything - kept
        assert first.paused() == kept  # the partitions that stayed kept their pause
        at_first = await drain(first, 0.5)
        at_second = await read(second, lambda rs: len(rs) >= 4, 30)
        first.resume(kept)
        at_first += await read(first, lambda rs: len(rs) >= 4, 30)
        await second.stop()
        await until(lambda: first.assignment() == everything, 45, "all four back at the first")
    finally:
        await second.stop()
        await first.stop()
    assert {r.tp for r in at_second} == moved
    assert sorted((r.tp, r.offset) for r in at_first) == [
        (tp, o) for tp in sorted(kept) for o in (0, 1)
    ]
    # The first member's callbacks: everything, then only what moved, both ways. librdkafka
    # follows an incremental revocation with an empty assignment (serve's handover then
    # releases the suspended partitions).
    assert first_handler.revoked == [moved]
    assert [a for a in first_handler.assigned if a] == [everything, moved]
    assert first_handler.assigned[1] == frozenset()
    assert [a for a in second_handler.assigned if a] == [moved]


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
async def test_a_duplicate_static_id_is_one_fenced_error(
    protocol: GroupProtocol, kafka_bootstrap: str, new_topic: TopicFactory
) -> None:
    topic = await new_topic("cfsrc")
    group = unique_group()
    members = [
        make_source(
            "confluent",
            kafka_bootstrap,
            group,
            [topic],
            Recorder(),
            protocol=protocol,
            group_instance_id="same",
        )
        for _ in range(2)
    ]
    await members[0].start()
    errors: list[FencedInstanceError] = []
    try:
        await until(lambda: bool(members[0].assignment()), 30, "the first member's assignment")
        await members[1].start()
        deadline = time.monotonic() + 30
        while not errors and time.monotonic() < deadline:
            for member in members:
                try:
                    await member.poll(10, 50)
                except FencedInstanceError as err:
                    errors.append(err)
        survivors = [m for m in members if not _raises(m)]
        for member in survivors:
            await member.poll(10, 200)  # the other keeps working
    finally:
        for member in members:
            await member.stop()
    assert len(errors) == 1, errors
    assert len(survivors) == 1
    assert "--group-instance-id 'same'" in str(errors[0])


async def test_backpressure_bounds_what_waits_and_loses_nothing(
    kafka_bootstrap: str, new_topic: TopicFactory
) -> None:
    topic = await new_topic("cfsrc")
    await produce(kafka_bootstrap, topic, [(0, f"k{i}".encode(), []) for i in range(1000)])
    source = make_source("confluent", kafka_bootstrap, unique_group(), [topic], Recorder())
    assert isinstance(source, ConfluentSource)
    await source.start()
    try:
        await until(lambda: source._owner.sent >= 200, 30, "the first records handed over")
        # Nothing polled: the owner waits, then pauses everything in librdkafka.
        await until(lambda: source._owner.held_back, 10, "the owner thread holding back")
        buffered = source._owner.sent - source._owner.taken
        got = await read(source, lambda rs: len(rs) >= 1000, 30)
        got += await drain(source, 0.3)
    finally:
        await source.stop()
    assert buffered <= (BUFFERED_POLLS + 1) * 100  # a consume() more at most
    assert not source._owner.held_back
    assert offsets(got, (topic, 0)) == list(range(1000))  # none lost, none twice


async def test_a_static_member_told_to_leave_hands_its_partitions_over_at_once(
    kafka_bootstrap: str, new_topic: TopicFactory
) -> None:
    """Classic only: under the consumer protocol librdkafka's leave of a static member keeps
    its partitions until the broker's session timeout (ConfluentSource.stop)."""
    protocol: GroupProtocol = "classic"
    topic = await new_topic("cfsrc", partitions=2)
    everything = {(topic, 0), (topic, 1)}
    group = unique_group()
    static = make_source(
        "confluent", kafka_bootstrap, group, [topic], Recorder(), protocol=protocol,
        group_instance_id="leaving", session_timeout_ms=45_000, heartbeat_interval_ms=1_000,
    )  # fmt: skip
    other = make_source(
        "confluent", kafka_bootstrap, group, [topic], Recorder(), protocol=protocol,
        session_timeout_ms=45_000, heartbeat_interval_ms=1_000,
    )  # fmt: skip
    await static.start()
    await other.start()
    try:
        await until(
            lambda: len(static.assignment()) == 1 and len(other.assignment()) == 1,
            45,
            "one partition each",
        )
        static.leave_group_on_stop()
        stopped = time.monotonic()
        await static.stop()
        await until(lambda: other.assignment() == everything, 20, "both at the other member")
        moved_s = time.monotonic() - stopped
    finally:
        await static.stop()
        await other.stop()
    assert moved_s < 20  # well within the 45 s session timeout


def _raises(source: GroupSource) -> bool:
    return getattr(source, "_failure", None) is not None
