"""The wire contract, end to end: a real ``kbatch serve`` process, the real broker, tiny models."""

from __future__ import annotations

import asyncio
import json
import struct
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from pathlib import Path

import msgpack
import pytest

from consumer.kafka.admin import delete_topics
from schemas.codec import Encoding
from schemas.errors import ErrorCode
from tests.conftest import TopicFactory, unique_group
from tests.integration.harness import (
    ReplyRecord,
    Req,
    ServeProcess,
    committed_offsets,
    poll_until,
    produce,
    read_all,
    read_topic,
    request,
)


@dataclass
class Topics:
    requests: str
    replies: str
    dlq: str
    group: str


@pytest.fixture
async def topics(new_topic: TopicFactory) -> Topics:
    return Topics(
        requests=await new_topic("req", partitions=2),
        replies=await new_topic("rep", partitions=3),
        dlq=await new_topic("dlq"),
        group=unique_group("serve"),
    )


@pytest.fixture
async def embed_server(
    tmp_path: Path, kafka_bootstrap: str, topics: Topics, tiny_embed_dir: Path
) -> AsyncIterator[ServeProcess]:
    server = ServeProcess.start(
        tmp_path,
        bootstrap=kafka_bootstrap,
        request_topic=topics.requests,
        reply_topic=topics.replies,
        dlq_topic=topics.dlq,
        group_id=topics.group,
        model=str(tiny_embed_dir),
        # the Spring test's own reply topic (new_topic: test.own-rep.<hex>) and the never
        # created one of the missing-topic test (unique_group: test.never-created.<hex>)
        extra=[
            "--max-wait-ms",
            "5",
            "--allowed-reply-topics",
            r"test\.(own-rep|never-created)\..*",
        ],
    )
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def n_records(n: int) -> Callable[[list[object]], bool]:
    return lambda rs: len(rs) >= n


async def test_round_trip_embed(
    kafka_bootstrap: str, topics: Topics, embed_server: ServeProcess
) -> None:
    await produce(
        kafka_bootstrap, topics.requests, [request("k1", "hello world", meta={"trace": "a1"})]
    )
    (rec,) = await read_topic(kafka_bootstrap, topics.replies, n_records(1), 60)
    assert rec.key == b"k1"
    assert rec.headers["kbatch-status"] == b"ok"
    assert rec.headers["content-type"] == b"application/msgpack"
    reply = rec.reply
    assert reply.status == "ok" and reply.v == 1
    assert reply.dedup is False and reply.truncated is False
    assert reply.meta == {"trace": "a1"}
    assert reply.result is not None and reply.timing is not None
    embedding = (
        reply.result["embedding"] if isinstance(reply.result, dict) else reply.result.embedding
    )
    assert len(embedding) == 32
    assert abs(sum(x * x for x in embedding) - 1.0) < 1e-3  # L2-normalised (Normalize module)
    assert reply.timing.batch_size >= 1 and reply.timing.padded_len >= 3
    assert reply.model.name


async def test_spring_headers_reply_topic_partition_and_correlation(
    kafka_bootstrap: str, topics: Topics, new_topic: TopicFactory, embed_server: ServeProcess
) -> None:
    own_replies = await new_topic("own-rep", partitions=4)
    correlation = bytes(range(16))
    req = request("spring-1", "from a ReplyingKafkaTemplate")
    headers = (
        ("kafka_replyTopic", own_replies.encode()),
        ("kafka_replyPartition", struct.pack(">i", 3)),
        ("kafka_correlationId", correlation),
    )
    await produce(kafka_bootstrap, topics.requests, [Req(req.key, req.value, headers)])
    (rec,) = await read_topic(kafka_bootstrap, own_replies, n_records(1), 60)
    assert rec.partition == 3
    assert rec.headers["kafka_correlationId"] == correlation
    assert rec.key == b"spring-1"
    assert rec.reply.status == "ok"


async def test_json_request_gets_json_reply(
    kafka_bootstrap: str, topics: Topics, embed_server: ServeProcess
) -> None:
    await produce(kafka_bootstrap, topics.requests, [request("j1", "json please", Encoding.JSON)])
    (rec,) = await read_topic(kafka_bootstrap, topics.replies, n_records(1), 60)
    assert rec.headers["content-type"] == b"application/json"
    assert rec.raw.startswith(b"{")
    assert rec.reply.status == "ok"


async def test_duplicates_are_computed_once(
    kafka_bootstrap: str, topics: Topics, embed_server: ServeProcess
) -> None:
    copies = [request("same-key", "retry me", meta={"copy": i}) for i in range(5)]
    await produce(kafka_bootstrap, topics.requests, copies)
    replies = await read_topic(kafka_bootstrap, topics.replies, n_records(5), 60)
    assert sorted(r.reply.meta["copy"] for r in replies if r.reply.meta) == [0, 1, 2, 3, 4]
    assert [r.reply.dedup for r in replies].count(False) == 1
    assert all(r.reply.status == "ok" for r in replies)
    first = next(r for r in replies if not r.reply.dedup)
    assert all(r.reply.result == first.reply.result for r in replies)
    assert all(r.reply.timing == first.reply.timing for r in replies)  # the source's timing
    metrics = embed_server.metrics()
    assert metrics["kbatch_dedup_hits_total"] == 4


async def test_a_key_reused_for_another_text_is_refused_and_the_partition_moves_on(
    kafka_bootstrap: str, topics: Topics, embed_server: ServeProcess
) -> None:
    """Contract 1.4: ``same-1`` with "cats are great", then with "the stock market crashed",
    in msgpack and in JSON, while the first is in flight (one poll) and after its answer: the
    other text is answered idempotency_key_reused without a result, never the first text's
    vector; a true copy is still a dedup; nothing is dead-lettered; offsets are committed."""
    cats, market = "cats are great", "the stock market crashed"

    def req(n: int, key: str, text: str, encoding: Encoding) -> Req:
        return replace(request(key, text, encoding, meta={"n": n}), partition=0)

    def numbered(n: int) -> Callable[[list[ReplyRecord]], bool]:
        return lambda rs: len({r.reply.meta["n"] for r in rs if r.reply.meta}) >= n

    in_flight = [
        req(0, "same-1", cats, Encoding.MSGPACK),
        req(1, "same-1", market, Encoding.MSGPACK),
        req(2, "same-j", cats, Encoding.JSON),
        req(3, "same-j", market, Encoding.JSON),
    ]
    await produce(kafka_bootstrap, topics.requests, in_flight)
    await read_topic(kafka_bootstrap, topics.replies, numbered(4), 60)
    after = [
        req(4, "same-1", market, Encoding.MSGPACK),
        req(5, "same-j", market, Encoding.JSON),
        req(6, "same-1", cats, Encoding.MSGPACK),  # a true copy: answered from the first
        req(7, "after", market, Encoding.MSGPACK),  # its own key: computed
    ]
    await produce(kafka_bootstrap, topics.requests, after)
    got = {
        r.reply.meta["n"]: r
        for r in await read_topic(kafka_bootstrap, topics.replies, numbered(8), 60)
        if r.reply.meta
    }
    for n in (1, 3, 4, 5):
        rec = got[n]
        assert rec.headers["kbatch-status"] == b"error"
        assert rec.reply.result is None and rec.reply.timing is None and not rec.reply.dedup
        assert rec.reply.error is not None
        assert rec.reply.error.code is ErrorCode.IDEMPOTENCY_KEY_REUSED
    for n in (3, 5):  # JSON in, JSON out, and no result field at all
        assert got[n].headers["content-type"] == b"application/json"
        assert "result" not in json.loads(got[n].raw)
    assert "result" not in msgpack.unpackb(got[4].raw)
    assert [(got[n].reply.status, got[n].reply.dedup) for n in (0, 2, 6, 7)] == [
        ("ok", False), ("ok", False), ("ok", True), ("ok", False)
    ]  # fmt: skip
    assert got[6].reply.result == got[0].reply.result
    assert got[7].reply.result != got[0].reply.result  # the market's own vector
    metrics = embed_server.metrics()
    assert metrics["kbatch_idempotency_key_reused_total"] == 4
    assert metrics["kbatch_dedup_hits_total"] == 1
    assert not [name for name in metrics if name.startswith("kbatch_dead_letters_total{")]

    def committed_past_all() -> bool:
        offsets = asyncio.run(committed_offsets(kafka_bootstrap, topics.group, topics.requests, 2))
        return offsets[0] == len(in_flight) + len(after)

    await asyncio.to_thread(poll_until, committed_past_all, 30, "commit past offset 7", 0.5)


async def test_poison_records_are_dead_lettered_and_the_partition_keeps_flowing(
    kafka_bootstrap: str, topics: Topics, embed_server: ServeProcess
) -> None:
    poison = [
        Req(b"bad-bytes", b"\xc1\xff\x00 not msgpack"),  # undecodable
        Req(None, msgpack.packb({"text": "no key"})),  # no key, no correlation id: DLQ only
        Req(b"bad-ct", b"{}", (("content-type", b"text/plain"),)),  # unknown content-type
        Req(b"bad-version", msgpack.packb({"text": "hi", "v": 2})),  # unsupported_version
        Req(b"empty-text", msgpack.packb({"text": ""})),
        Req(
            b"bad-partition",
            msgpack.packb({"text": "x"}),
            (("kafka_replyPartition", b"\x00\x01\x02"),),
        ),
        Req(b"tombstone", None),  # a null value (a compacted topic's delete marker)
    ]
    good = [request(f"good-{i}", f"fine text {i}") for i in range(4)]
    # Null header values are legal in Kafka: a null correlation id is no correlation id.
    good[3] = Req(good[3].key, good[3].value, (("kafka_correlationId", None), ("x-null", None)))
    await produce(
        kafka_bootstrap, topics.requests, [*poison[:3], *good[:2], *poison[3:], *good[2:]]
    )
    dead = await read_topic(kafka_bootstrap, topics.dlq, n_records(7), 60, decode=False)
    assert {d.key for d in dead} == {
        None,
        b"bad-bytes",
        b"bad-ct",
        b"bad-version",
        b"empty-text",
        b"bad-partition",
        b"tombstone",
    }
    by_key = {d.key: d for d in dead}
    assert by_key[b"bad-version"].headers["kbatch.error.code"] == b"unsupported_version"
    assert by_key[b"bad-bytes"].headers["kbatch.error.code"] == b"invalid_request"
    assert by_key[b"bad-bytes"].raw == b"\xc1\xff\x00 not msgpack"  # value unchanged
    assert by_key[b"bad-ct"].headers["content-type"] == b"text/plain"  # headers unchanged
    assert by_key[b"bad-bytes"].headers["kbatch.source.topic"] == topics.requests.encode()
    assert by_key[b"bad-bytes"].headers["kbatch.source.offset"].isdigit()

    replies = await read_topic(kafka_bootstrap, topics.replies, n_records(10), 60)
    statuses = {r.key: r.reply.status for r in replies}
    assert all(statuses[f"good-{i}".encode()] == "ok" for i in range(4))
    assert (
        by_key[b"tombstone"].raw == b""
        and by_key[b"tombstone"].headers["kbatch.error.code"] == b"invalid_request"
    )
    for key in (
        b"bad-bytes",
        b"bad-ct",
        b"bad-version",
        b"empty-text",
        b"bad-partition",
        b"tombstone",
    ):
        assert statuses[key] == "error", key
    assert None not in statuses
    error_codes = {r.key: r.reply.error.code for r in replies if r.reply.error is not None}
    assert error_codes[b"bad-version"] == "unsupported_version"


async def test_expired_deadline_is_never_computed(
    kafka_bootstrap: str, topics: Topics, embed_server: ServeProcess
) -> None:
    past_ms = int(time.time() * 1000) - 1_000
    await produce(
        kafka_bootstrap,
        topics.requests,
        [request("late", "too late", deadline_ms=past_ms, meta={"m": 1})],
    )
    (rec,) = await read_topic(kafka_bootstrap, topics.replies, n_records(1), 60)
    assert rec.reply.status == "expired"
    assert rec.headers["kbatch-status"] == b"expired"
    assert rec.reply.error is not None and rec.reply.error.code == "deadline_exceeded"
    assert rec.reply.meta == {"m": 1}
    metrics = embed_server.metrics()
    assert metrics["kbatch_expired_total"] == 1
    batches = sum(v for k, v in metrics.items() if k.startswith("kbatch_batch_size_count"))
    assert batches == 0  # no batch ran (in either lane)


async def test_wrong_task_and_too_long_input(
    kafka_bootstrap: str, topics: Topics, embed_server: ServeProcess
) -> None:
    long_text = "word " * 2_000
    await produce(
        kafka_bootstrap,
        topics.requests,
        [
            request("wrong-task", "classify me", task="classify"),
            request("too-long", long_text, truncate=False),
            request("cut", long_text),
        ],
    )
    replies = {
        r.key: r for r in await read_topic(kafka_bootstrap, topics.replies, n_records(3), 60)
    }
    assert replies[b"wrong-task"].reply.error is not None
    assert replies[b"wrong-task"].reply.error.code == "unsupported_task"
    assert replies[b"too-long"].reply.error is not None
    assert replies[b"too-long"].reply.error.code == "input_too_long"
    assert replies[b"cut"].reply.status == "ok" and replies[b"cut"].reply.truncated is True
    dlq_count = embed_server.metrics()
    assert not any(k.startswith("kbatch_dead_letters_total{") for k in dlq_count)


async def test_classify_scores(
    tmp_path: Path, kafka_bootstrap: str, topics: Topics, tiny_classify_dir: Path
) -> None:
    server = ServeProcess.start(
        tmp_path,
        bootstrap=kafka_bootstrap,
        request_topic=topics.requests,
        reply_topic=topics.replies,
        dlq_topic=topics.dlq,
        group_id=topics.group,
        model=str(tiny_classify_dir),
        task="classify",
    )
    try:
        server.wait_ready()
        await produce(
            kafka_bootstrap, topics.requests, [request("c1", "great movie", task="classify")]
        )
        (rec,) = await read_topic(kafka_bootstrap, topics.replies, n_records(1), 60)
    finally:
        server.stop()
    result = rec.reply.result
    assert rec.reply.status == "ok" and result is not None
    scores = result["scores"] if isinstance(result, dict) else result.scores
    label = result["label"] if isinstance(result, dict) else result.label
    assert abs(sum(scores.values()) - 1.0) < 1e-5
    assert label == max(scores, key=lambda k: scores[k])


async def test_reply_partition_that_does_not_exist_is_dead_lettered(
    kafka_bootstrap: str, topics: Topics, embed_server: ServeProcess
) -> None:
    """A client naming partition 99 of a 3-partition topic must not block its partition."""
    bad = request("no-such-partition", "hello")
    headers = (("kafka_replyPartition", struct.pack(">i", 99)),)
    await produce(
        kafka_bootstrap,
        topics.requests,
        [Req(bad.key, bad.value, headers), request("after", "still flowing")],
    )
    (dead,) = await read_topic(kafka_bootstrap, topics.dlq, n_records(1), 60, decode=False)
    assert dead.key == b"no-such-partition"
    assert dead.headers["kbatch.error.code"] == b"invalid_request"
    assert b"reply could not be delivered" in dead.headers["kbatch.error.message"]
    (after,) = await read_topic(kafka_bootstrap, topics.replies, n_records(1), 60)
    assert after.key == b"after" and after.reply.status == "ok"


async def test_missing_topics_are_created_at_start(
    tmp_path: Path, kafka_bootstrap: str, tiny_embed_dir: Path
) -> None:
    name = unique_group("auto")  # nothing exists under this name yet
    server = ServeProcess.start(
        tmp_path,
        bootstrap=kafka_bootstrap,
        request_topic=f"{name}.req",
        reply_topic=f"{name}.rep",
        dlq_topic=f"{name}.dlq",
        group_id=name,
        model=str(tiny_embed_dir),
        extra=["--topic-partitions", "2"],
    )
    try:
        server.wait_ready()  # ready means partitions of the created request topic are assigned
        await produce(kafka_bootstrap, f"{name}.req", [request("auto-1", "hello")])
        (rec,) = await read_topic(kafka_bootstrap, f"{name}.rep", n_records(1), 60)
    finally:
        server.stop()
        await delete_topics(kafka_bootstrap, [f"{name}.{t}" for t in ("req", "rep", "dlq")])
    assert rec.key == b"auto-1" and rec.reply.status == "ok"


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
async def test_compressed_requests_are_answered(
    kafka_bootstrap: str, topics: Topics, embed_server: ServeProcess, codec: str
) -> None:
    # Producers often compress (Java: compression.type=lz4/zstd/snappy); aiokafka can only
    # read those batches with cramjam installed, else every fetch of the partition fails.
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, compression_type=codec)
    await producer.start()
    try:
        reqs = [request(f"{codec}-{i}", f"compressed request number {i}") for i in range(20)]
        acks = [await producer.send(topics.requests, r.value, key=r.key) for r in reqs]
        for ack in acks:
            await ack
    finally:
        await producer.stop()
    got = await read_topic(kafka_bootstrap, topics.replies, n_records(20), 60)
    assert sorted(r.key or b"" for r in got) == sorted(r.key or b"" for r in reqs)
    assert {r.headers["kbatch-status"] for r in got} == {b"ok"}


async def test_a_compressed_request_too_large_to_copy_is_cut_on_the_dlq_and_never_blocks(
    kafka_bootstrap: str, topics: Topics, embed_server: ServeProcess
) -> None:
    # Found by a black-box run: the broker takes a 2 MiB request gzip-compressed, but its
    # dead letter was over the producer's 1 MiB request size; it was never completed, so the
    # partition never committed past it and every restart replayed what followed.
    from aiokafka import AIOKafkaProducer

    big = msgpack.packb({"text": "a" * (2 << 20)})
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka_bootstrap, compression_type="gzip", max_request_size=8 << 20
    )
    await producer.start()
    try:
        await producer.send_and_wait(
            topics.requests, big, key=b"big", partition=0, headers=[("kafka_correlationId", b"c")]
        )
        good = request("after-big", "the next request on the same partition")
        await producer.send_and_wait(topics.requests, good.value, key=good.key, partition=0)
    finally:
        await producer.stop()
    (dead,) = await read_topic(kafka_bootstrap, topics.dlq, n_records(1), 60, decode=False)
    assert dead.key == b"big"
    assert dead.headers["kbatch.dlq.original-value-bytes"] == str(len(big)).encode()
    assert dead.raw == big[: 64 * 1024]
    replies = await read_topic(kafka_bootstrap, topics.replies, n_records(2), 60)
    status = {r.key: r.reply.status for r in replies}
    assert status == {b"big": "error", b"after-big": "ok"}

    def committed_past_both() -> bool:
        offsets = asyncio.run(committed_offsets(kafka_bootstrap, topics.group, topics.requests, 2))
        return offsets[0] == 2

    await asyncio.to_thread(poll_until, committed_past_both, 30, "commit past offset 1", 0.5)


async def test_topics_the_broker_refuses_to_create_stop_serve_with_one_clear_error(
    tmp_path: Path, kafka_bootstrap: str, tiny_embed_dir: Path
) -> None:
    """Replication factor 3 on a one-broker cluster: CreateTopics is refused, serve exits 1
    naming the topics and what to do (no traceback, no half-started consumer)."""
    name = unique_group("refused")
    server = ServeProcess.start(
        tmp_path,
        bootstrap=kafka_bootstrap,
        request_topic=f"{name}.req",
        reply_topic=f"{name}.rep",
        dlq_topic=f"{name}.dlq",
        group_id=name,
        model=str(tiny_embed_dir),
        extra=["--topic-replication-factor", "3"],
    )
    try:
        assert server.proc is not None
        assert await asyncio.to_thread(server.proc.wait, 60) == 1
    finally:
        server.stop()
    log = server.log_tail()
    assert f"{name}.req" in log and "could not be created" in log, log
    assert "Traceback" not in log, log


async def test_reply_topic_that_does_not_exist_is_dead_lettered(
    kafka_bootstrap: str, topics: Topics, embed_server: ServeProcess
) -> None:
    """The broker creates no topic on first use: a reply topic the client never created is
    dead-lettered within the sink's grace (2 s), not after the producer's metadata wait
    (--send-timeout-ms, 30 s by default, during which the partition could not commit) nor
    retried forever, and the partition keeps flowing."""
    bad = request("no-such-topic", "hello")
    headers = (("kafka_replyTopic", unique_group("never-created").encode()),)
    await produce(
        kafka_bootstrap,
        topics.requests,
        [Req(bad.key, bad.value, headers), request("after", "still flowing")],
    )
    # Well inside the default 30 s send timeout the old code waited out.
    (dead,) = await read_topic(kafka_bootstrap, topics.dlq, n_records(1), 15, decode=False)
    (after,) = await read_topic(kafka_bootstrap, topics.replies, n_records(1), 60)
    assert dead.key == b"no-such-topic"
    assert dead.headers["kbatch.error.code"] == b"invalid_request"
    assert b"does not exist" in dead.headers["kbatch.error.message"]
    assert after.key == b"after" and after.reply.status == "ok"


async def test_a_bad_request_naming_a_topic_not_allowed_gets_no_error_reply_there(
    kafka_bootstrap: str, topics: Topics, new_topic: TopicFactory, embed_server: ServeProcess
) -> None:
    """The allow-list covers error replies: records that fail to decode and name another
    application's topic, or the request topic itself (an error reply there would be read back
    as a request and answered again), are dead-lettered ``reply_topic_not_allowed``; nothing is
    written to either topic and their offsets are committed."""
    other_app = await new_topic("other-app")  # outside the server's --allowed-reply-topics
    bad_values = {
        "v99": msgpack.packb({"v": 99, "text": "hi"}),
        "no-text": msgpack.packb({"v": 1}),
        "not-msgpack": b"\xc1\xff\x00 not msgpack",
    }
    bad = [
        Req(f"{name}@{where}".encode(), value, (("kafka_replyTopic", topic.encode()),), 0)
        for where, topic in (("other-app", other_app), ("requests", topics.requests))
        for name, value in bad_values.items()
    ]
    after = request("after", "still flowing")
    sent = await produce(
        kafka_bootstrap, topics.requests, [*bad, Req(after.key, after.value, partition=0)]
    )
    answered = await read_topic(
        kafka_bootstrap, topics.replies, lambda rs: any(r.key == b"after" for r in rs), 60
    )
    assert [r.reply.status for r in answered if r.key == b"after"] == ["ok"]

    def all_committed() -> bool:
        offsets = asyncio.run(committed_offsets(kafka_bootstrap, topics.group, topics.requests, 2))
        return (offsets[0] or 0) >= sent

    await asyncio.to_thread(poll_until, all_committed, 30, f"commit at offset {sent}", 0.5)
    assert await read_all(kafka_bootstrap, other_app, 1, decode=False) == []
    # Only what the test wrote: no error reply came back as a request.
    assert len(await read_all(kafka_bootstrap, topics.requests, 2, decode=False)) == sent
    assert [r.key for r in await read_all(kafka_bootstrap, topics.replies, 3)] == [b"after"]
    dead = await read_topic(kafka_bootstrap, topics.dlq, n_records(6), 60, decode=False)
    assert {d.key: d.headers["kbatch.error.code"] for d in dead} == {
        r.key: b"reply_topic_not_allowed" for r in bad
    }
    messages = {d.key: d.headers["kbatch.error.message"] for d in dead}
    assert b"unsupported_version" in messages[b"v99@other-app"]
    assert other_app.encode() in messages[b"no-text@other-app"]
