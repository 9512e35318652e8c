"""``kbatch backfill`` as a real process against the real broker, with the tiny models.

Each test produces application events (explicit timestamps where time matters), runs the
command as a subprocess like ``tests/integration/harness.py`` runs serve, and reads what it
wrote back from Kafka. Synchronisation is by polling observable state (committed offsets,
process exit), never by sleeping.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import signal
import subprocess
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from tests.conftest import TopicFactory, unique_group
from tests.integration.harness import KBATCH, ReplyRecord, committed_offsets, read_all

pytestmark = pytest.mark.integration

BASE_MS = 1_714_521_600_000  # 2024-05-01T00:00:00Z


@dataclass(frozen=True)
class Event:
    """One source record to produce."""

    partition: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int | None = None
    headers: tuple[tuple[str, bytes], ...] = ()


async def produce_events(bootstrap: str, topic: str, events: Sequence[Event]) -> None:
    """Produce in order and wait for every acknowledgement."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        futures = [
            await producer.send(
                topic, e.value, key=e.key, partition=e.partition,
                timestamp_ms=e.timestamp_ms, headers=list(e.headers),
            )
            for e in events
        ]  # fmt: skip
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


def iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat().replace("+00:00", "Z")


def backfill_args(
    bootstrap: str, source: str, output: str, dlq: str, group: str, model: Path, *extra: str
) -> list[str]:
    return [
        KBATCH, "backfill",
        "--bootstrap", bootstrap,
        "--source-topic", source,
        "--output-topic", output,
        "--dlq-topic", dlq,
        "--group-id", group,
        "--model", str(model),
        "--task", "embed",
        "--torch-threads", "1",
        "--commit-interval-ms", "100",
        "--json",
        *extra,
    ]  # fmt: skip


@dataclass
class Run:
    code: int
    summary: dict[str, Any] | None
    log: str


def run_backfill(args: list[str], log_path: Path, timeout_s: float = 180) -> Run:
    """Run to exit; the exit code, the ``--json`` summary and the log."""
    with log_path.open("ab") as log:
        proc = subprocess.run(
            args, stdout=subprocess.PIPE, stderr=log, timeout=timeout_s,
            env={**os.environ, "PYTHONUNBUFFERED": "1"}, check=False,
        )  # fmt: skip
    lines = proc.stdout.decode().strip().splitlines()
    summary = json.loads(lines[-1]) if lines else None
    return Run(proc.returncode, summary, log_path.read_text(errors="replace"))


async def wait_for_commit(
    bootstrap: str,
    group: str,
    topic: str,
    partitions: int,
    proc: subprocess.Popen[bytes],
    min_offset: int = 1,
    timeout_s: float = 120,
) -> None:
    """Poll the group's committed offsets until one partition has committed ``min_offset``.

    Raises:
        AssertionError: the process exited first, or ``timeout_s`` passed.
    """
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False
    )
    await consumer.start()
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            assert proc.poll() is None, "the job ended before it could be interrupted"
            assert loop.time() < deadline, f"no commit of {group} within {timeout_s} s"
            for p in range(partitions):
                offset = await consumer.committed(TopicPartition(topic, p))
                if offset is not None and offset >= min_offset:
                    return
    finally:
        await consumer.stop()


def source_of(r: ReplyRecord) -> tuple[int, int]:
    return int(r.headers["kbatch.source.partition"]), int(r.headers["kbatch.source.offset"])


async def test_time_range_selects_exactly_the_right_records(
    tmp_path: Path, kafka_bootstrap: str, new_topic: TopicFactory, tiny_embed_dir: Path
) -> None:
    source = await new_topic("bf-src", partitions=2)
    output, dlq = await new_topic("bf-out", partitions=2), await new_topic("bf-dlq")
    # 20 events per partition, one second apart; partition 1 is offset by half a second.
    events = [
        Event(p, f"p{p}-{i}".encode(), f"event {i} of partition {p}".encode(),
              BASE_MS + i * 1000 + p * 500)
        for p in (0, 1)
        for i in range(20)
    ]  # fmt: skip
    await produce_events(kafka_bootstrap, source, events)
    start_ms, end_ms = BASE_MS + 5_000, BASE_MS + 15_000  # [T+5 s, T+15 s)
    expected = {
        (p, i)
        for p in (0, 1)
        for i in range(20)
        if start_ms <= BASE_MS + i * 1000 + p * 500 < end_ms
    }
    assert len(expected) == 20

    run = run_backfill(
        backfill_args(
            kafka_bootstrap, source, output, dlq, unique_group("bf"), tiny_embed_dir,
            "--from", iso(start_ms), "--to", iso(end_ms),
        ),
        tmp_path / "backfill.log",
    )  # fmt: skip
    assert run.code == 0, run.log[-3000:]
    assert run.summary is not None and run.summary["complete"]
    assert [(p["range_start"], p["end"]) for p in run.summary["partitions"]] == [(5, 15), (5, 15)]

    written = await read_all(kafka_bootstrap, output, partitions=2)
    assert {source_of(r) for r in written} == expected
    assert len(written) == len(expected)  # one run, no repeats
    for r in written:
        p, offset = source_of(r)
        assert r.key == f"p{p}-{offset}".encode()  # keyed by the source key
        assert r.headers["kbatch.source.topic"] == source.encode()
        assert r.headers["content-type"] == b"application/msgpack"  # raw text in: msgpack out
        assert r.reply.status == "ok" and r.reply.result is not None
        assert r.reply.model.name == tiny_embed_dir.name

    # Offsets too: [0:2, 1:18) on partition 0, [1:0, 1:3) on partition 1 (unnamed → defaults).
    output2 = await new_topic("bf-out2")
    run = run_backfill(
        backfill_args(
            kafka_bootstrap, source, output2, dlq, unique_group("bf"), tiny_embed_dir,
            "--from", "0:2", "--to", "0:4,1:3",
        ),
        tmp_path / "backfill2.log",
    )  # fmt: skip
    assert run.code == 0, run.log[-3000:]
    written = await read_all(kafka_bootstrap, output2, partitions=1)
    assert sorted(source_of(r) for r in written) == [(0, 2), (0, 3), (1, 0), (1, 1), (1, 2)]


@dataclass
class KilledBackfill:
    """A backfill of two source partitions killed with SIGKILL after its first commit."""

    output: str
    args: list[str]
    log_path: Path
    at_kill: dict[int, int | None]
    """The group's committed offset per source partition right after the kill."""


async def backfill_killed_midway(
    tmp_path: Path,
    bootstrap: str,
    new_topic: TopicFactory,
    model_dir: Path,
    n_per_partition: int,
    *extra: str,
) -> KilledBackfill:
    """Fill a 2-partition source with ``n_per_partition`` events each, start ``kbatch backfill``
    (``extra`` flags added; batches of one, so it runs long enough), SIGKILL it once a commit
    reached offset 300, and return what a resume needs."""
    source = await new_topic("bf-src", partitions=2)
    output, dlq = await new_topic("bf-out"), await new_topic("bf-dlq")
    await produce_events(
        bootstrap,
        source,
        [
            Event(p, f"{p}-{i}".encode(), (f"text {i} " * (1 + i % 9)).encode())
            for p in (0, 1)
            for i in range(n_per_partition)
        ],
    )
    group = unique_group("bf")
    args = backfill_args(
        bootstrap, source, output, dlq, group, model_dir,
        "--max-batch-size", "1", "--max-in-flight-records", "64", *extra,
    )  # fmt: skip
    log_path = tmp_path / "backfill.log"
    with log_path.open("ab") as log:
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log)
    try:
        await wait_for_commit(bootstrap, group, source, 2, proc, min_offset=300)
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    at_kill = await committed_offsets(bootstrap, group, source, 2)
    assert any(o is not None and 0 < o < n_per_partition for o in at_kill.values()), at_kill
    return KilledBackfill(output, args, log_path, at_kill)


async def test_sigkill_then_resume_leaves_no_gap(
    tmp_path: Path, kafka_bootstrap: str, new_topic: TopicFactory, tiny_embed_dir: Path
) -> None:
    n_per_partition = 2500
    killed = await backfill_killed_midway(
        tmp_path, kafka_bootstrap, new_topic, tiny_embed_dir, n_per_partition
    )
    output, args, log_path, at_kill = killed.output, killed.args, killed.log_path, killed.at_kill
    first_run = await read_all(kafka_bootstrap, output, partitions=1)

    run = run_backfill(args, log_path)
    assert run.code == 0, run.log[-3000:]
    assert run.summary is not None and run.summary["complete"]
    for part in run.summary["partitions"]:
        assert part["resumed_from"] == at_kill[part["partition"]]

    written = await read_all(kafka_bootstrap, output, partitions=1)
    counts = Counter(source_of(r) for r in written)
    every = {(p, o) for p in (0, 1) for o in range(n_per_partition)}
    assert set(counts) == every  # no gap
    repeated = {so: c for so, c in counts.items() if c > 1}
    # Duplicates only in the window the first run wrote but had not committed; of that window,
    # what the last commit's metadata named as written (kb1) is skipped, the rest written again.
    for (p, offset), c in repeated.items():
        assert c == 2 and offset >= (at_kill[p] or 0), (p, offset, c)
    window = sum(1 for r in first_run if source_of(r)[1] >= (at_kill[source_of(r)[0]] or 0))
    assert len(repeated) + run.summary["skipped_completed"] == window
    print(
        f"\nkill -9 then resume: {len(first_run)} written before the kill, committed {at_kill}, "
        f"{len(repeated)} duplicate(s) (the uncommitted window), {len(written)} records in all"
    )


async def test_bad_records_are_dead_lettered_and_the_job_continues(
    tmp_path: Path, kafka_bootstrap: str, new_topic: TopicFactory, tiny_embed_dir: Path
) -> None:
    source = await new_topic("bf-src")
    output, dlq = await new_topic("bf-out"), await new_topic("bf-dlq")
    json_ct = (("content-type", b"application/json"),)

    def good(i: int) -> Event:
        body = json.dumps({"payload": {"text": f"good event {i}"}, "n": i}).encode()
        return Event(
            0, f"good-{i}".encode(), body, headers=(*json_ct, ("trace", b"t"), ("trace", b"u"))
        )

    bad = [
        Event(0, b"bad-json", b"{not json", headers=(("app", b"x"),)),
        Event(0, b"bad-missing", json.dumps({"payload": {}}).encode(), headers=json_ct),
        Event(0, b"bad-number", json.dumps({"payload": {"text": 5}}).encode()),
        Event(0, b"bad-tombstone", None),
    ]
    events = [good(0), bad[0], good(1), bad[1], bad[2], good(2), bad[3], good(3)]
    await produce_events(kafka_bootstrap, source, events)

    run = run_backfill(
        backfill_args(
            kafka_bootstrap, source, output, dlq, unique_group("bf"), tiny_embed_dir,
            "--text-field", "payload.text",
        ),
        tmp_path / "backfill.log",
    )  # fmt: skip
    assert run.code == 0, run.log[-3000:]
    assert run.summary is not None
    assert (run.summary["ok"], run.summary["dead_lettered"]) == (4, 4)

    written = await read_all(kafka_bootstrap, output, partitions=1)
    assert sorted(r.key for r in written) == [f"good-{i}".encode() for i in range(4)]
    for r in written:
        assert r.headers["content-type"] == b"application/json"  # JSON in: JSON out
        assert r.reply.status == "ok"

    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        dlq, bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest"
    )
    await consumer.start()
    dead: dict[bytes | None, Any] = {}
    try:
        while len(dead) < 4:
            for records in (await consumer.getmany(timeout_ms=1000)).values():
                for rec in records:
                    dead[rec.key] = rec
    finally:
        await consumer.stop()
    offsets = {e.key: i for i, e in enumerate(events)}
    for e in bad:
        rec = dead[e.key]
        assert rec.value == e.value  # unchanged (a null value stays null)
        headers = list(rec.headers)
        assert headers[: len(e.headers)] == list(e.headers)  # original headers first, in order
        added = dict(headers[len(e.headers) :])
        assert added["kbatch.error.code"] == b"invalid_request"
        assert added["kbatch.error.message"]
        assert added["kbatch.source.topic"] == source.encode()
        assert added["kbatch.source.partition"] == b"0"
        assert added["kbatch.source.offset"] == str(offsets[e.key]).encode()
    assert b"not valid JSON" in dict(dead[b"bad-json"].headers)["kbatch.error.message"]
    assert b"has no 'text'" in dict(dead[b"bad-missing"].headers)["kbatch.error.message"]


async def test_empty_range_exits_zero(
    tmp_path: Path, kafka_bootstrap: str, new_topic: TopicFactory, tiny_embed_dir: Path
) -> None:
    source = await new_topic("bf-src", partitions=2)
    output, dlq = await new_topic("bf-out"), await new_topic("bf-dlq")
    empty = run_backfill(
        backfill_args(kafka_bootstrap, source, output, dlq, unique_group("bf"), tiny_embed_dir),
        tmp_path / "empty-topic.log",
    )
    assert empty.code == 0, empty.log[-3000:]
    assert empty.summary is not None and empty.summary["complete"]
    assert empty.summary["records_read"] == 0

    await produce_events(
        kafka_bootstrap, source, [Event(0, b"k", b"text", BASE_MS), Event(1, b"k2", b"t", BASE_MS)]
    )
    future = run_backfill(
        backfill_args(
            kafka_bootstrap, source, output, dlq, unique_group("bf"), tiny_embed_dir,
            "--from", iso(BASE_MS + 3_600_000),
        ),
        tmp_path / "future.log",
    )  # fmt: skip
    assert future.code == 0, future.log[-3000:]
    assert future.summary is not None and future.summary["records_read"] == 0
    assert await read_all(kafka_bootstrap, output, partitions=1) == []


async def test_a_stopped_job_exits_nonzero_and_a_rerun_completes(
    tmp_path: Path, kafka_bootstrap: str, new_topic: TopicFactory, tiny_embed_dir: Path
) -> None:
    n = 3000
    source = await new_topic("bf-src")
    output, dlq = await new_topic("bf-out"), await new_topic("bf-dlq")
    await produce_events(
        kafka_bootstrap, source, [Event(0, f"k{i}".encode(), f"t {i}".encode()) for i in range(n)]
    )
    group = unique_group("bf")
    args = backfill_args(
        kafka_bootstrap, source, output, dlq, group, tiny_embed_dir,
        "--max-batch-size", "1", "--max-in-flight-records", "64",
    )  # fmt: skip
    log_path = tmp_path / "backfill.log"
    with log_path.open("ab") as log:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log)
    try:
        await wait_for_commit(kafka_bootstrap, group, source, 1, proc, min_offset=200)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert proc.returncode == 3, log_path.read_text()[-3000:]
    summary = json.loads(out.decode().strip().splitlines()[-1])
    assert summary["stopped"] and not summary["complete"]
    committed = (await committed_offsets(kafka_bootstrap, group, source, 1))[0]
    assert committed is not None and 0 < committed < n
    first = await read_all(kafka_bootstrap, output, partitions=1)
    # A graceful stop finishes and commits what it read: nothing written past the commit.
    assert {int(r.headers["kbatch.source.offset"]) for r in first} == set(range(committed))

    rerun = run_backfill(args, log_path)
    assert rerun.code == 0, rerun.log[-3000:]
    written = await read_all(kafka_bootstrap, output, partitions=1)
    assert sorted(int(r.headers["kbatch.source.offset"]) for r in written) == list(range(n))


async def test_missing_output_and_dead_letter_topics_are_created(
    tmp_path: Path, kafka_bootstrap: str, new_topic: TopicFactory, tiny_embed_dir: Path
) -> None:
    """The broker does not auto-create topics: backfill creates its output topic (as many
    partitions as the source) and its dead-letter topic (1), as serve creates its own."""
    from consumer.kafka.admin import delete_topics

    source = await new_topic("bf-src", partitions=2)
    output, dlq = f"{source}.out", f"{source}.dlq"
    await produce_events(kafka_bootstrap, source, [Event(1, b"k", b"some text", BASE_MS)])
    try:
        run = run_backfill(
            backfill_args(kafka_bootstrap, source, output, dlq, unique_group("bf"), tiny_embed_dir),
            tmp_path / "create.log",
        )
        assert run.code == 0, run.log[-3000:]
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        await producer.start()
        try:
            assert await producer.partitions_for(output) == {0, 1}
            assert await producer.partitions_for(dlq) == {0}
        finally:
            await producer.stop()
        (reply,) = await read_all(kafka_bootstrap, output, partitions=2)
        assert reply.key == b"k"
    finally:
        await delete_topics(kafka_bootstrap, [output, dlq])
