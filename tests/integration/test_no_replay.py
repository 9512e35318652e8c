"""No replay, on the real broker: what a crashed ``kbatch serve`` answered above its committed
offset travels in the commit's metadata, so its successor neither recomputes nor re-answers it;
foreign or corrupt metadata is ignored.

Figures (skipped, recomputed, replies repeated) are printed.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaTP
from aiokafka.admin import AIOKafkaAdminClient

from consumer.kafka.offset_metadata import decode_completed, encode_completed
from tests.conftest import TopicFactory, unique_group
from tests.integration.harness import (
    Req,
    ServeProcess,
    kill,
    poll_until,
    produce,
    read_all,
    read_topic,
    request,
)
from tests.integration.test_backfill import backfill_args, run_backfill, source_of

SKIPPED = "kbatch_records_skipped_completed_total"
OK = 'kbatch_replies_total{status="ok"}'


async def committed_points(bootstrap: str, group: str) -> dict[int, tuple[int, str]]:
    """The group's committed (offset, metadata) per partition, asked of the broker."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        found = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    return {tp.partition: (om.offset, om.metadata) for tp, om in found.items()}


async def commit_raw(
    bootstrap: str, group: str, topic: str, points: dict[int, tuple[int, str]]
) -> None:
    """Commit (offset, metadata) per partition for ``group`` as another tool would."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False
    )
    await consumer.start()
    try:
        tps = {p: KafkaTP(topic, p) for p in points}
        consumer.assign(list(tps.values()))
        await consumer.commit({tps[p]: point for p, point in points.items()})
    finally:
        await consumer.stop()


def serve(tmp_path: Path, bootstrap: str, topics: tuple[str, str, str], group: str, model: Path,
          name: str, extra: list[str]) -> ServeProcess:  # fmt: skip
    req, rep, dlq = topics
    return ServeProcess.start(
        tmp_path, bootstrap=bootstrap, request_topic=req, reply_topic=rep, dlq_topic=dlq,
        group_id=group, model=str(model), name=name, extra=extra,
    )  # fmt: skip


async def test_sigkill_with_a_held_head_request_recomputes_only_what_was_in_flight(
    tmp_path: Path, kafka_bootstrap: str, new_topic: TopicFactory, tiny_embed_dir: Path
) -> None:
    # The head request is a long text alone in its bucket, held for its 60 s max wait (buckets
    # never mix, no adaptive flush); the 500 short ones behind it fill batches of 20 and are
    # answered. The committed offset stays at the head; the 500 travel in its metadata.
    topics = (await new_topic("req", 1), await new_topic("rep"), await new_topic("dlq"))
    req, rep, _ = topics
    group = unique_group("noreplay")
    n = 500
    head = request("head", "long " * 40)
    await produce(
        kafka_bootstrap, req, [head, *(request(f"r-{i}", f"short {i}") for i in range(n))]
    )
    holding = ["--max-wait-ms", "60000", "--no-adaptive-wait", "--batch-overhead-tokens", "0",
               "--max-batch-size", "20", "--max-partition-records", "600"]  # fmt: skip
    first = serve(tmp_path, kafka_bootstrap, topics, group, tiny_embed_dir, "first", holding)
    try:
        first.wait_ready()
        poll_until(lambda: first.metrics().get(OK, 0) >= n, 120, f"{n} replies")

        def carried() -> int:
            points = asyncio.run(committed_points(kafka_bootstrap, group))
            _, metadata = points.get(0, (-1, ""))
            return len(decode_completed(metadata)[1]) if metadata else 0

        await asyncio.to_thread(poll_until, lambda: carried() >= n, 30, "metadata with 500")
        answered_before = first.metrics().get(OK, 0)
        kill(first)
    finally:
        first.stop()
    offset, metadata = (await committed_points(kafka_bootstrap, group))[0]
    assert offset == 0  # the head, unanswered, holds the committed offset
    second = serve(tmp_path, kafka_bootstrap, topics, group, tiny_embed_dir, "second", [])
    try:
        second.wait_ready()
        replies = await read_topic(
            kafka_bootstrap, rep, lambda rs: b"head" in {r.key for r in rs}, 120
        )
        poll_until(lambda: second.metrics().get(OK, 0) >= 1, 30, "the head's reply counted")
        after = second.metrics()
    finally:
        second.stop()
    keys = [r.key for r in replies]
    repeated = len(keys) - len(set(keys))
    print(
        f"\nno replay: {answered_before:.0f} answered before SIGKILL (committed offset 0, "
        f"{len(decode_completed(metadata)[1])} offsets in its {len(metadata)}-byte metadata); "
        f"after restart {after.get(SKIPPED, 0):.0f} skipped, {after.get(OK, 0):.0f} computed, "
        f"{repeated} replies repeated"
    )
    assert set(keys) == {b"head", *(f"r-{i}".encode() for i in range(n))}
    assert after[SKIPPED] == n
    assert after[OK] == 1  # only the head, in flight at the kill
    assert repeated == 0


async def test_foreign_or_corrupt_commit_metadata_is_ignored_and_everything_answered(
    tmp_path: Path, kafka_bootstrap: str, new_topic: TopicFactory, tiny_embed_dir: Path
) -> None:
    topics = (await new_topic("req", 3), await new_topic("rep"), await new_topic("dlq"))
    req, rep, _ = topics
    group = unique_group("foreign")
    n = 60
    await produce(
        kafka_bootstrap,
        req,
        [Req(r.key, r.value, r.headers, i % 3) for i, r in
         enumerate(request(f"r-{i}", f"text {i}") for i in range(n))],
    )  # fmt: skip
    await commit_raw(
        kafka_bootstrap,
        group,
        req,
        {
            0: (0, "written by another tool"),  # foreign
            1: (0, "kb1:%%not-base64%%"),  # corrupt
            2: (0, encode_completed(5, [6, 7]).text),  # well formed, for another offset
        },
    )
    server = serve(tmp_path, kafka_bootstrap, topics, group, tiny_embed_dir, "serve", [])
    try:
        server.wait_ready()
        replies = await read_topic(
            kafka_bootstrap, rep, lambda rs: len({r.key for r in rs}) >= n, 120
        )
        metrics = server.metrics()
        alive = server.proc is not None and server.proc.poll() is None
    finally:
        server.stop()
    log = server.log_path.read_text(errors="replace")
    assert {r.key for r in replies} == {f"r-{i}".encode() for i in range(n)}
    assert alive
    assert metrics.get(SKIPPED, 0) == 0
    assert log.count("commit metadata of") >= 3, log[-3000:]  # one warning per partition


async def test_backfill_resumed_from_a_commit_with_metadata_skips_what_was_written(
    tmp_path: Path, kafka_bootstrap: str, new_topic: TopicFactory, tiny_embed_dir: Path
) -> None:
    # An earlier run (killed) committed 2 and had written offsets 3 and 5 above it.
    source, output, dlq = (
        await new_topic("bf-src"),
        await new_topic("bf-out"),
        await new_topic("bf-dlq"),
    )
    group = unique_group("bf-noreplay")
    await produce(
        kafka_bootstrap, source, [Req(f"k{i}".encode(), f"text {i}".encode()) for i in range(10)]
    )
    await commit_raw(kafka_bootstrap, group, source, {0: (2, encode_completed(2, [3, 5]).text)})
    run = run_backfill(
        backfill_args(kafka_bootstrap, source, output, dlq, group, tiny_embed_dir),
        tmp_path / "backfill.log",
    )
    assert run.code == 0, run.log[-3000:]
    assert run.summary is not None and run.summary["skipped_completed"] == 2
    written = sorted(source_of(r)[1] for r in await read_all(kafka_bootstrap, output, 1))
    assert written == [2, 4, 6, 7, 8, 9]
    assert (await committed_points(kafka_bootstrap, group))[0] == (10, "")


async def test_replicas_a_killed_replica_restarts_without_repeating_what_it_answered(
    tmp_path: Path, kafka_bootstrap: str, new_topic: TopicFactory, tiny_embed_dir: Path
) -> None:
    # --replicas 2: one member per partition, each holding its head request (as above) while
    # the 250 behind it are answered. Replica 0 is SIGKILLed and restarted by the supervisor:
    # it skips its partition's 250 and repeats nothing; the metadata is per partition.
    topics = (await new_topic("req", 2), await new_topic("rep"), await new_topic("dlq"))
    req, rep, _ = topics
    group, per = unique_group("noreplay-rep"), 250
    records = [
        Req(r.key, r.value, r.headers, p)
        for p in (0, 1)
        for r in [request(f"head-{p}", "long " * 40)]
        + [request(f"r-{p}-{i}", f"short {i}") for i in range(per)]
    ]
    holding = ["--max-wait-ms", "60000", "--no-adaptive-wait", "--batch-overhead-tokens", "0",
               "--max-batch-size", "10", "--max-partition-records", "600", "--replicas", "2",
               "--group-instance-id", f"noreplay-{group}"]  # fmt: skip
    server = serve(tmp_path, kafka_bootstrap, topics, group, tiny_embed_dir, "replicas", holding)
    try:
        # Produced once both members hold their partition: a revoke would answer the heads.
        server.wait_ready()
        await produce(kafka_bootstrap, req, records)
        poll_until(lambda: server.metrics().get(OK, 0) >= 2 * per, 120, "the later replies")

        def covered() -> list[int]:
            """Per partition: answered offsets the commit covers (its offset + metadata)."""
            points = asyncio.run(committed_points(kafka_bootstrap, group))
            return [o + (len(decode_completed(m)[1]) if m else 0) for o, m in points.values()]

        await asyncio.to_thread(
            poll_until,
            lambda: len(c := covered()) == 2 and min(c) >= per,  # both partitions committed
            30,
            "commits covering the replies",
        )
        # Both heads held (the usual case) unless a late rebalance's revoke answered them.
        held = [o for o, _ in (await committed_points(kafka_bootstrap, group)).values()] == [0, 0]
        victim = server.readyz()["replicas"][0]["pid"]
        os.kill(victim, signal.SIGKILL)

        def restarted() -> bool:
            row = server.readyz()["replicas"][0]
            return row["restarts"] == 1 and row["ready"] and row["pid"] not in (None, victim)

        poll_until(restarted, 120, "replica 0 restarted and ready")
        if held:
            poll_until(lambda: server.metrics().get(SKIPPED, 0) >= per, 60, "the restart's skips")
        skipped = server.metrics().get(SKIPPED, 0)
        # The restarted replica has read its head again (held by the 60 s wait), as the other
        # holds its own: only then can the drain answer both (a SIGTERM before its first fetch
        # leaves the head unread and uncommitted for the next start).
        poll_until(
            lambda: server.metrics().get("kbatch_in_flight_records", 0) >= 2, 60, "both heads read"
        )
        server.signal(signal.SIGTERM)  # the drain answers both heads
        assert server.wait(90) == 0, server.log_tail()
    finally:
        server.stop()
    replies = await read_all(kafka_bootstrap, rep, 1)
    keys = [r.key for r in replies]
    print(f"\nreplicas: replica 0 killed and restarted, {skipped:.0f} skipped, "
          f"{len(keys) - len(set(keys))} replies repeated")  # fmt: skip
    assert set(keys) == {r.key for r in records}
    assert skipped == per if held else skipped in (0, per)
    assert len(keys) == len(set(keys))
