"""Backfill's readers on both Kafka clients against the real broker: the aiokafka ones
(:mod:`consumer.kafka.range_source`, :mod:`consumer.kafka.group_range`) and their confluent-kafka
drop-ins (:mod:`consumer.kafka.confluent_adapter.range_source`, ``.group_range``) keep one
contract, so each test runs over both (ids ``aiokafka`` / ``confluent``).

Synchronisation is by deadlines on observable state (a plan finished, an assignment taken),
never by sleeping.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as KafkaTP

from consumer.kafka.committed import committed_with_metadata
from consumer.kafka.config import KafkaClientSettings
from consumer.kafka.confluent_adapter.group_range import ConfluentGroupRangeSource
from consumer.kafka.confluent_adapter.range_source import ConfluentRangeSource
from consumer.kafka.errors import RangeSourceError
from consumer.kafka.group_range import GroupRangeSource
from consumer.kafka.offset_metadata import MAX_METADATA_BYTES, decode_completed, encode_completed
from consumer.kafka.range_source import RangeSource
from consumer.kafka.ranges import AtOffsets, AtTime, Earliest, Latest
from consumer.kafka.records import InRecord
from tests.conftest import TopicFactory, unique_group

pytestmark = pytest.mark.integration

BASE_MS = 1_714_521_600_000  # 2024-05-01T00:00:00Z

RANGE_CLASSES = [
    pytest.param(RangeSource, id="aiokafka"),
    pytest.param(ConfluentRangeSource, id="confluent"),
]
GROUP_CLASSES = [
    pytest.param(GroupRangeSource, id="aiokafka"),
    pytest.param(ConfluentGroupRangeSource, id="confluent"),
]
GROUP_PAIRS = [
    pytest.param((GroupRangeSource, GroupRangeSource), id="aiokafka"),
    pytest.param((ConfluentGroupRangeSource, ConfluentGroupRangeSource), id="confluent"),
    # one group, a member on each client: both speak the classic protocol's roundrobin
    pytest.param((GroupRangeSource, ConfluentGroupRangeSource), id="mixed"),
]


def settings(bootstrap: str) -> KafkaClientSettings:
    return KafkaClientSettings(bootstrap=bootstrap)


async def produce(
    bootstrap: str, topic: str, partitions: int, per_partition: int, transactional: bool = False
) -> None:
    """``per_partition`` records in each partition: value ``p:i``, stamped ``BASE_MS + i s``;
    in one committed transaction when ``transactional`` (the log then ends at its marker)."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        transactional_id=f"{topic}.tx" if transactional else None,
    )
    await producer.start()
    try:
        if transactional:
            await producer.begin_transaction()
        futures = [
            await producer.send(
                topic, f"{p}:{i}".encode(), partition=p, timestamp_ms=BASE_MS + i * 1000
            )
            for p in range(partitions)
            for i in range(per_partition)
        ]
        if transactional:
            await producer.commit_transaction()
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


@pytest.fixture
async def opened() -> AsyncIterator[Callable[[Any], Any]]:
    """Start readers; every one started is stopped afterwards."""
    started: list[Any] = []

    async def start(reader: Any) -> Any:
        await reader.start()
        started.append(reader)
        return reader

    yield start
    for reader in reversed(started):
        await reader.stop()


async def read_to_end(source: Any, timeout_s: float = 20) -> list[InRecord]:
    """Poll until every partition of the plan is finished; fails after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    out: list[InRecord] = []
    while not set(source.plan) <= source.finished:
        assert time.monotonic() < deadline, f"not finished: {set(source.plan) - source.finished}"
        out.extend(await source.poll(100, 200))
    return out


def offsets_read(records: Sequence[InRecord]) -> list[tuple[int, int]]:
    return sorted((r.partition, r.offset) for r in records)


@pytest.mark.parametrize("cls", RANGE_CLASSES)
async def test_range_by_offsets_reads_exactly_those_records_once(
    cls: Any, kafka_bootstrap: str, new_topic: TopicFactory, opened: Any
) -> None:
    topic = await new_topic("cfr", partitions=2)
    await produce(kafka_bootstrap, topic, 2, 10)
    source = await opened(
        cls(client=settings(kafka_bootstrap), topic=topic, group_id=unique_group())
    )
    plan = await source.resolve(AtOffsets({0: 2, 1: 3}), AtOffsets({0: 8}))
    assert {p: (r.start, r.end) for p, r in plan.items()} == {0: (2, 8), 1: (3, 10)}
    records = await read_to_end(source)
    got = offsets_read(records)
    assert got == [(0, o) for o in range(2, 8)] + [(1, o) for o in range(3, 10)]
    assert {r.value for r in records if r.partition == 0} == {
        f"0:{i}".encode() for i in range(2, 8)
    }
    assert all(r.timestamp_ms == BASE_MS + r.offset * 1000 for r in records)
    assert await source.poll(100, 0) == []  # finished: nothing more, not even past the end


@pytest.mark.parametrize("cls", RANGE_CLASSES)
async def test_range_by_time_reads_the_records_stamped_inside(
    cls: Any, kafka_bootstrap: str, new_topic: TopicFactory, opened: Any
) -> None:
    topic = await new_topic("cfr", partitions=2)
    await produce(kafka_bootstrap, topic, 2, 10)
    source = await opened(
        cls(client=settings(kafka_bootstrap), topic=topic, group_id=unique_group())
    )
    plan = await source.resolve(AtTime(BASE_MS + 3000), AtTime(BASE_MS + 6000))
    assert {p: (r.start, r.end) for p, r in plan.items()} == {0: (3, 6), 1: (3, 6)}
    assert offsets_read(await read_to_end(source)) == [(p, o) for p in (0, 1) for o in (3, 4, 5)]


@pytest.mark.parametrize("cls", RANGE_CLASSES)
async def test_range_to_now_ends_at_a_transaction_marker(
    cls: Any, kafka_bootstrap: str, new_topic: TopicFactory, opened: Any
) -> None:
    """The log ends with a commit marker (offset 5, after records 0-4): reading finishes."""
    topic = await new_topic("cfr", partitions=1)
    await produce(kafka_bootstrap, topic, 1, 5, transactional=True)
    source = await opened(
        cls(client=settings(kafka_bootstrap), topic=topic, group_id=unique_group())
    )
    plan = await source.resolve(Earliest(), Latest())
    assert (plan[0].start, plan[0].end) == (0, 6)
    assert offsets_read(await read_to_end(source)) == [(0, o) for o in range(5)]


@pytest.mark.parametrize("cls", RANGE_CLASSES)
async def test_partitions_are_listed_sorted(
    cls: Any, kafka_bootstrap: str, new_topic: TopicFactory, opened: Any
) -> None:
    topic = await new_topic("cfr", partitions=3)
    source = await opened(
        cls(client=settings(kafka_bootstrap), topic=topic, group_id=unique_group())
    )
    assert await source.partitions() == [0, 1, 2]


@pytest.mark.parametrize("cls", RANGE_CLASSES)
async def test_commit_with_metadata_is_read_back_by_both_clients(
    cls: Any, kafka_bootstrap: str, new_topic: TopicFactory, opened: Any
) -> None:
    topic = await new_topic("cfr", partitions=1)
    await produce(kafka_bootstrap, topic, 1, 10)
    group = unique_group()
    client = settings(kafka_bootstrap)
    writer = await opened(cls(client=client, topic=topic, group_id=group))
    await writer.resolve(Earliest(), Latest())
    meta = encode_completed(3, [5, 7]).text
    await writer.commit({(topic, 0): 3}, {(topic, 0): meta})
    await writer.stop()
    for reader_cls in (RangeSource, ConfluentRangeSource):
        reader = await opened(reader_cls(client=client, topic=topic, group_id=group))
        plan = await reader.resolve(Earliest(), Latest())
        assert (plan[0].start, plan[0].resumed_from, plan[0].completed) == (3, 3, {5, 7}), (
            reader_cls.__name__
        )


@pytest.mark.parametrize("cls", RANGE_CLASSES)
async def test_an_empty_range_is_finished_at_once(
    cls: Any, kafka_bootstrap: str, new_topic: TopicFactory, opened: Any
) -> None:
    topic = await new_topic("cfr", partitions=2)
    await produce(kafka_bootstrap, topic, 1, 5)  # partition 1 stays empty
    source = await opened(
        cls(client=settings(kafka_bootstrap), topic=topic, group_id=unique_group())
    )
    plan = await source.resolve(AtOffsets({0: 4}), AtOffsets({0: 4}))
    assert {p: r.remaining for p, r in plan.items()} == {0: 0, 1: 0}
    assert source.finished == {0, 1}
    assert await source.poll(100, 100) == []


@pytest.mark.parametrize("cls", RANGE_CLASSES)
async def test_a_missing_topic_is_a_range_source_error(
    cls: Any, kafka_bootstrap: str, opened: Any
) -> None:
    topic = f"{unique_group('missing')}"
    source = await opened(
        cls(client=settings(kafka_bootstrap), topic=topic, group_id=unique_group())
    )
    with pytest.raises(RangeSourceError, match=re.escape(f"topic '{topic}' does not exist")):
        await source.partitions()
    with pytest.raises(RangeSourceError, match=re.escape(f"topic '{topic}' does not exist")):
        await source.resolve(Earliest(), Latest())


async def test_no_broker_is_the_same_error_on_both_clients(opened: Any) -> None:
    client = KafkaClientSettings(bootstrap="127.0.0.1:1")  # nothing listens on port 1
    for cls in (RangeSource, ConfluentRangeSource):
        with pytest.raises(RangeSourceError, match=r"^cannot connect to Kafka: "):
            await opened(cls(client=client, topic="t", group_id=unique_group()))


@pytest.mark.parametrize("classes", GROUP_PAIRS)
async def test_a_group_range_is_split_over_two_members(
    classes: tuple[Any, Any], kafka_bootstrap: str, new_topic: TopicFactory, opened: Any
) -> None:
    topic = await new_topic("cfr", partitions=4)
    await produce(kafka_bootstrap, topic, 4, 6)
    group = unique_group()
    ranges = {0: (0, 6), 1: (1, 5), 2: (0, 6), 3: (2, 6)}
    members = [
        await opened(
            cls(client=settings(kafka_bootstrap), topic=topic, group_id=group, ranges=ranges)
        )
        for cls in classes
    ]
    held: list[list[int]] = [[], []]

    async def follow(i: int) -> None:
        got = await members[i].next_assignment(timeout_s=0.2)
        if got is not None:
            held[i] = got

    deadline = time.monotonic() + 45
    while not (held[0] and held[1] and sorted(held[0] + held[1]) == [0, 1, 2, 3]):
        assert time.monotonic() < deadline, f"no split of the group: {held}"
        await asyncio.gather(follow(0), follow(1))
    assert not set(held[0]) & set(held[1])
    plans = [await m.plan(h) for m, h in zip(members, held, strict=True)]
    read = await asyncio.gather(
        *(read_group_to_end(m, pl, ranges) for m, pl in zip(members, plans, strict=True))
    )
    for i, (partitions, got) in enumerate(read):
        held[i] = partitions
        assert offsets_read(got) == sorted((p, o) for p in partitions for o in range(*ranges[p])), (
            f"member {i}"
        )
    assert sorted(held[0] + held[1]) == [0, 1, 2, 3]
    plans = [await m.plan(h) for m, h in zip(members, held, strict=True)]
    await plans[0].commit({(topic, p): ranges[p][1] for p in held[0]})
    await plans[1].commit({(topic, p): ranges[p][1] for p in held[1]})
    assert await members[0].all_at_end()


async def read_group_to_end(
    member: Any, assigned: Any, ranges: dict[int, tuple[int, int]], timeout_s: float = 30
) -> tuple[list[int], list[InRecord]]:
    """Read ``member``'s ``assigned`` plan to the end of its ranges: its partitions and the
    records read. A rebalance meanwhile (a new topic's metadata settling) revokes the plan:
    the new assignment is followed and read again from its start (nothing committed)."""
    deadline = time.monotonic() + timeout_s
    while True:
        partitions = sorted(assigned.plan)
        got = await read_to_end(assigned, deadline - time.monotonic())
        if offsets_read(got) == sorted((p, o) for p in partitions for o in range(*ranges[p])):
            return partitions, got
        assigned = await member.plan(await wait_assignment(member, deadline - time.monotonic()))


async def wait_assignment(member: Any, timeout_s: float = 30) -> list[int]:
    """``member``'s next non-empty assignment; fails after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert time.monotonic() < deadline, "no assignment"
        got = await member.next_assignment(timeout_s=0.2)
        if got:
            return got


@pytest.mark.parametrize("cls", GROUP_CLASSES)
async def test_a_revoked_member_commits_in_its_revoke_callback_and_the_next_resumes(
    cls: Any, kafka_bootstrap: str, new_topic: TopicFactory, opened: Any
) -> None:
    """The revoke callback runs before the partitions go and may commit (confluent: on the
    loop while the owner thread waits inside librdkafka's callback, serving the commit)."""
    topic = await new_topic("cfr", partitions=2)
    await produce(kafka_bootstrap, topic, 2, 20)
    group = unique_group()
    ranges = {0: (0, 20), 1: (0, 20)}
    client = settings(kafka_bootstrap)
    first = await opened(cls(client=client, topic=topic, group_id=group, ranges=ranges))
    assert sorted(await wait_assignment(first)) == [0, 1]
    assigned = await first.plan([0, 1])
    read: list[InRecord] = []
    deadline = time.monotonic() + 10
    while len(read) < 6:
        assert time.monotonic() < deadline, "nothing read"
        read.extend(await assigned.poll(3, 200))
    upto = {
        p: max(r.offset for r in read if r.partition == p) + 1 for p in {r.partition for r in read}
    }
    assert sum(upto.values()) < 40  # read part of the range only
    revoked: list[dict[int, bool]] = []

    async def on_revoke() -> None:
        await assigned.commit({(topic, p): o for p, o in upto.items()})
        revoked.append({p: p in assigned.finished for p in (0, 1)})

    first.on_revoke = on_revoke
    second = await opened(cls(client=client, topic=topic, group_id=group, ranges=ranges))
    taken = await wait_assignment(second, timeout_s=45)
    assert revoked, "the revoke callback did not run before the partitions moved"
    assert await assigned.poll(100, 0) == []  # revoked: reading stopped
    assert assigned.finished == {0, 1}
    plan = (await second.plan(taken)).plan
    assert {p: (r.start, r.resumed_from) for p, r in plan.items()} == {
        p: (upto.get(p, 0), upto.get(p)) for p in taken
    }


@pytest.mark.parametrize("cls", GROUP_CLASSES)
async def test_pause_reading_holds_the_records_back_until_it_turns_false(
    cls: Any, kafka_bootstrap: str, new_topic: TopicFactory, opened: Any
) -> None:
    topic = await new_topic("cfr", partitions=1)
    await produce(kafka_bootstrap, topic, 1, 5)
    member = await opened(
        cls(
            client=settings(kafka_bootstrap),
            topic=topic,
            group_id=unique_group(),
            ranges={0: (0, 5)},
        )
    )
    paused = True
    member.pause_reading = lambda: paused
    assigned = await member.plan(await wait_assignment(member))
    for _ in range(3):
        assert await assigned.poll(100, 100) == []
    paused = False
    _, got = await read_group_to_end(member, assigned, {0: (0, 5)})
    assert offsets_read(got) == [(0, o) for o in range(5)]


@pytest.mark.parametrize("cls", GROUP_CLASSES)
async def test_a_plan_reads_after_a_keepalive_paused_its_partitions(
    cls: Any, kafka_bootstrap: str, new_topic: TopicFactory, opened: Any
) -> None:
    topic = await new_topic("cfr", partitions=1)
    await produce(kafka_bootstrap, topic, 1, 5)
    ranges = {0: (1, 5)}
    member = await opened(
        cls(client=settings(kafka_bootstrap), topic=topic, group_id=unique_group(), ranges=ranges)
    )
    assigned = await member.plan(await wait_assignment(member))
    await member.keepalive()  # pauses every assigned partition: the next poll resumes them
    _, got = await read_group_to_end(member, assigned, ranges)
    assert offsets_read(got) == [(0, o) for o in range(1, 5)]


@pytest.mark.parametrize("cls", RANGE_CLASSES)
async def test_commit_metadata_at_the_brokers_limit_is_accepted(
    cls: Any, kafka_bootstrap: str, new_topic: TopicFactory, opened: Any
) -> None:
    """A ``kb1`` text of the broker's whole ``offset.metadata.max.bytes`` (confluent-kafka
    sends one byte more, its NUL: the text is encoded again one byte shorter)."""
    topic = await new_topic("cfr", partitions=1)
    await produce(kafka_bootstrap, topic, 1, 3)
    group = unique_group()
    client = settings(kafka_bootstrap)
    writer = await opened(cls(client=client, topic=topic, group_id=group))
    await writer.resolve(Earliest(), Latest())
    meta = encode_completed(0, range(1, 200_000, 3))
    assert meta.truncated and len(meta.text) > MAX_METADATA_BYTES - 8
    await writer.commit({(topic, 0): 0}, {(topic, 0): meta.text})
    await writer.stop()
    probe = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=group)
    await probe.start()
    try:
        points = await committed_with_metadata(probe, [KafkaTP(topic, 0)])
    finally:
        await probe.stop()
    offset, text = points[(topic, 0)]
    base, done = decode_completed(text)
    _, sent = decode_completed(meta.text)
    assert (offset, base) == (0, 0) and done and done <= sent
