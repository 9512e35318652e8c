"""Backfill jobs run by ``kbatch serve`` (docs/JOBS.md), against the real broker.

Two serve members (the tiny embedder) share one module: a job is submitted with the real
``kbatch backfill submit`` command, its status read from the jobs topic, its output read back
from Kafka. The kill -9 test runs last: it kills one of the two members. Synchronisation is by
polling the jobs topic and the output topic, never by sleeping.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from consumer.jobs.client import cancel_job, job_statuses, read_table
from consumer.jobs.records import TERMINAL, JobStatus
from consumer.kafka.admin import create_topics, delete_topics
from consumer.kafka.config import KafkaClientSettings
from tests.conftest import unique_group
from tests.integration.harness import (
    KBATCH,
    Req,
    ServeProcess,
    kill,
    produce,
    read_all,
    read_committed,
)

pytestmark = pytest.mark.integration


@dataclass
class Members:
    bootstrap: str
    model: Path
    jobs_topic: str
    servers: list[ServeProcess]
    topics: list[str]


@pytest.fixture(scope="module")
def members(
    tmp_path_factory: pytest.TempPathFactory, kafka_bootstrap: str, tiny_embed_dir: Path
) -> Iterator[Members]:
    """Two serve members watching a jobs topic of their own."""
    suffix = unique_group("j").rsplit(".", 1)[-1]
    req, rep, dlq, jobs = (f"test.jobs-{n}.{suffix}" for n in ("req", "rep", "dlq", "jobs"))
    asyncio.run(create_topics(kafka_bootstrap, [req, rep, dlq], partitions=2))
    tmp = tmp_path_factory.mktemp("jobs")
    servers = [
        ServeProcess.start(
            tmp,
            bootstrap=kafka_bootstrap,
            request_topic=req,
            reply_topic=rep,
            dlq_topic=dlq,
            group_id=f"test.jobs-serve.{suffix}",
            model=str(tiny_embed_dir),
            name=f"serve{i}",
            extra=["--jobs-topic", jobs, "--session-timeout-ms", "6000"],
        )
        for i in range(2)
    ]
    topics = [req, rep, dlq, jobs]
    try:
        for server in servers:
            server.wait_ready()
        yield Members(kafka_bootstrap, tiny_embed_dir, jobs, servers, topics)
    finally:
        for server in servers:
            server.stop()
        asyncio.run(delete_topics(kafka_bootstrap, topics))


async def _source(m: Members, partitions: int, n: int) -> tuple[str, str]:
    suffix = unique_group("s").rsplit(".", 1)[-1]
    source, output = f"test.jobs-src.{suffix}", f"test.jobs-out.{suffix}"
    await create_topics(m.bootstrap, [source], partitions=partitions)
    m.topics += [source, output, f"{source}.dlq"]
    records = [
        Req(f"k{i}".encode(), f"text number {i}".encode(), partition=i % partitions)
        for i in range(n)
    ]
    await produce(m.bootstrap, source, records)
    return source, output


def _submit(m: Members, source: str, output: str, *extra: str) -> str:
    args = [
        KBATCH, "backfill", "submit",
        "--bootstrap", m.bootstrap,
        "--jobs-topic", m.jobs_topic,
        "--source-topic", source,
        "--output-topic", output,
        "--model", str(m.model),
        "--commit-interval-ms", "200",
        "--json",
        *extra,
    ]  # fmt: skip
    out = subprocess.run(
        args,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    record = json.loads(out.stdout)
    assert record["state"] == "pending"
    return str(record["job_id"])


async def _status(m: Members, job: str) -> JobStatus:
    client = KafkaClientSettings(bootstrap=m.bootstrap)
    (status,) = await job_statuses(client, m.jobs_topic, job)
    return status


def _status_json(m: Members, job: str) -> dict[str, Any]:
    """What ``kbatch backfill status JOB --json`` prints."""
    shown = subprocess.run(
        [KBATCH, "backfill", "status", job, "--json", "--bootstrap", m.bootstrap,
         "--jobs-topic", m.jobs_topic],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    status: dict[str, Any] = json.loads(shown.stdout)
    return status


async def _wait_status(m: Members, job: str, ok: object, timeout_s: float) -> JobStatus:
    deadline = time.monotonic() + timeout_s
    while True:
        status = await _status(m, job)
        if ok(status):  # type: ignore[operator]
            return status
        assert time.monotonic() < deadline, f"timed out; last status {status}"
        await asyncio.sleep(0.2)  # a poll interval, not a synchronisation


async def test_submitted_job_completes_with_counts_matching_the_output(members: Members) -> None:
    n = 300
    source, output = await _source(members, 3, n)
    job = _submit(members, source, output)
    status = await _wait_status(members, job, lambda s: s.state == "completed", 90)
    written = await read_all(members.bootstrap, output, 3)
    assert sorted(
        (int(r.headers["kbatch.source.partition"]), int(r.headers["kbatch.source.offset"]))
        for r in written
    ) == sorted((i % 3, i // 3) for i in range(n))
    assert all(r.reply.status == "ok" for r in written)
    assert (status.counts.done, status.counts.failed, status.counts.skipped) == (n, 0, 0)
    assert (status.finished_offsets, status.total_offsets, status.fraction) == (n, n, 1.0)
    assert _status_json(members, job)["state"] == "completed"


async def test_cancel_stops_every_member_within_5_s(members: Members) -> None:
    n = 6000
    source, output = await _source(members, 2, n)
    job = _submit(members, source, output, "--max-in-flight-records", "2")
    await _wait_status(members, job, lambda s: s.state == "running" and s.counts.done > 0, 60)
    t0 = time.monotonic()  # from the cancel record (the CLI's own start-up is not the job's)
    await cancel_job(KafkaClientSettings(bootstrap=members.bootstrap), members.jobs_topic, job)
    status = await _wait_status(
        members,
        job,
        lambda s: s.members and all(state == "stopped" for state in s.members.values()),
        10,
    )
    took_s = time.monotonic() - t0
    assert took_s < 5, took_s
    again = subprocess.run(
        [KBATCH, "backfill", "cancel", job, "--bootstrap", members.bootstrap,
         "--jobs-topic", members.jobs_topic],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert again.stdout.strip() == f"{job}: cancelled"  # an ended job is left as it is
    assert status.state == "cancelled"
    written = await read_all(members.bootstrap, output, 2)
    assert len(written) < n  # it did stop
    later = await read_all(members.bootstrap, output, 2)
    assert len(later) == len(written)


async def test_a_job_writing_into_serves_request_topic_fails_at_once(members: Members) -> None:
    source, _ = await _source(members, 1, 10)
    request_topic = members.topics[0]
    job = _submit(members, source, request_topic)
    status = await _wait_status(members, job, lambda s: s.state == "failed", 30)
    assert f"output topic {request_topic!r} is this server's request topic" in (status.reason or "")
    assert await read_all(members.bootstrap, request_topic, 2) == []  # nothing was written


async def test_a_jobs_dead_letters_go_to_its_own_topic_not_serves(members: Members) -> None:
    """Regression: the worker dead-lettered into serve's --dlq-topic. Every
    record fails here, so the job ends ``failed`` (it used to end ``completed``): the
    record the member declares, ``status`` and ``status --json``."""
    n = 12
    source, output = await _source(members, 1, n)
    job = _submit(members, source, output, "--text-field", "body.nope")
    status = await _wait_status(members, job, lambda s: s.state in TERMINAL, 60)
    assert (status.state, status.counts.done, status.counts.failed) == ("failed", 0, n)
    assert status.reason == f"every record failed ({n} error replies or dead letters, none ok)"
    table = await read_table(KafkaClientSettings(bootstrap=members.bootstrap), members.jobs_topic)
    assert table.jobs[job].state == "failed"  # declared so by the member, not only shown
    assert _status_json(members, job)["state"] == "failed"
    own = await read_all(members.bootstrap, f"{source}.dlq", 1, decode=False)
    assert len(own) == n
    assert {r.headers["kbatch.source.topic"] for r in own} == {source.encode()}
    serves = await read_all(members.bootstrap, members.topics[2], 2, decode=False)
    assert [r for r in serves if r.headers.get("kbatch.source.topic") == source.encode()] == []


async def test_submit_refuses_a_data_topic_as_the_jobs_topic(members: Members) -> None:
    """Regression: the job record was written into the job's own source."""
    source, output = await _source(members, 1, 3)

    def submit(jobs_topic: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [KBATCH, "backfill", "submit", "--bootstrap", members.bootstrap, "--source-topic",
             source, "--output-topic", output, "--jobs-topic", jobs_topic],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip

    own = submit(source)
    assert own.returncode == 2
    assert f"--jobs-topic {source!r} is the job's source topic" in own.stderr
    plain = members.topics[1]  # serve's reply topic: an existing topic, not compacted
    other = submit(plain)
    assert other.returncode == 1
    assert f"{plain!r} is not a jobs topic: its cleanup.policy is 'delete'" in other.stderr
    assert "Traceback" not in own.stderr + other.stderr
    assert len(await read_all(members.bootstrap, source, 1, decode=False)) == 3  # untouched


async def _kill_one_member_mid_job(m: Members, *extra: str) -> tuple[int, JobStatus, list[Any]]:
    """Run a 4-partition job on both members, kill -9 the first mid-job, wait for completion;
    (records, final status, output records read ``read_committed``)."""
    n = 4000
    source, output = await _source(m, 4, n)
    job = _submit(m, source, output, "--max-in-flight-records", "4", *extra)
    await _wait_status(
        m,
        job,
        lambda s: (
            len(s.members) == 2
            and all(state == "running" for state in s.members.values())
            and s.counts.done > 0
        ),
        60,
    )
    kill(m.servers[0])
    status = await _wait_status(m, job, lambda s: s.state == "completed", 120)
    return n, status, await read_committed(m.bootstrap, output, 4)


def _scored(written: list[Any]) -> list[tuple[int, int]]:
    return sorted(
        (int(r.headers["kbatch.source.partition"]), int(r.headers["kbatch.source.offset"]))
        for r in written
    )


async def test_kill_9_of_one_member_mid_job_completes_with_every_record_scored(
    members: Members,
) -> None:
    n, status, written = await _kill_one_member_mid_job(members)
    every = sorted((i % 4, i // 4) for i in range(n))
    assert sorted(set(_scored(written))) == every  # every record, at least once
    # Counts are published before each commit: never below the records scored; what the killed
    # member wrote after its last publish is in the output and scored again (at least once).
    assert n <= status.counts.done <= len(written)
    assert status.counts.failed == 0


async def test_kill_9_under_exactly_once_scores_every_record_once(members: Members) -> None:
    members.servers[0].launch()  # the member the previous test killed
    members.servers[0].wait_ready()
    n, status, written = await _kill_one_member_mid_job(members, "--exactly-once")
    assert _scored(written) == sorted((i % 4, i // 4) for i in range(n))  # each exactly once
    assert status.counts.done >= n  # aborted writes of the killed member were counted too


SLOW_DEVICE = "sim:25,0"
"""A simulated device: 25 ms per batch, however small (consumer/model/sim_backend.py)."""


async def test_a_slow_device_shared_job_stops_within_5_s_of_a_cancel(
    tmp_path: Path, kafka_bootstrap: str
) -> None:
    """Two members on a slow device share a job with the default in-flight bound (4096 read
    ahead: ~13 s of work at 8 per 25 ms batch). The second member's join revokes the first's
    partitions, and the cancel stops both: each drops its queued items and finishes one batch.
    Regression: finishing everything read took longer than the rebalance allowed
    (two MiniLM members livelocked, a cancel took 30 s)."""
    suffix = unique_group("slow").rsplit(".", 1)[-1]
    req, rep, dlq, jobs = (f"test.jobs-slow-{n}.{suffix}" for n in ("req", "rep", "dlq", "jobs"))
    await create_topics(kafka_bootstrap, [req, rep, dlq], partitions=2)  # one per member
    servers = [
        ServeProcess.start(
            tmp_path,
            bootstrap=kafka_bootstrap,
            request_topic=req,
            reply_topic=rep,
            dlq_topic=dlq,
            group_id=f"test.jobs-slow.{suffix}",
            model=SLOW_DEVICE,
            name=f"slow{i}",
            extra=["--jobs-topic", jobs, "--max-batch-size", "8", "--session-timeout-ms", "6000"],
        )
        for i in range(2)
    ]
    m = Members(kafka_bootstrap, Path(SLOW_DEVICE), jobs, servers, [req, rep, dlq, jobs])
    try:
        for server in servers:
            server.wait_ready()
        source, output = await _source(m, 2, 10_000)
        job = _submit(m, source, output)
        await _wait_status(
            m,
            job,
            lambda s: (
                len(s.members) == 2
                and all(state == "running" for state in s.members.values())
                and s.counts.done > 0
            ),
            60,
        )
        t0 = time.monotonic()
        await cancel_job(KafkaClientSettings(bootstrap=kafka_bootstrap), jobs, job)
        status = await _wait_status(
            m,
            job,
            lambda s: s.members and all(state == "stopped" for state in s.members.values()),
            30,
        )
        took_s = time.monotonic() - t0
        assert took_s < 5, took_s
        assert status.state == "cancelled"
        assert all("drain deadline" not in s.log_path.read_text(errors="replace") for s in servers)
    finally:
        for server in servers:
            server.stop()
        await delete_topics(kafka_bootstrap, m.topics)
