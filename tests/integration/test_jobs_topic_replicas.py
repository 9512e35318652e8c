"""The jobs topic's replicas and the durability warning, against the real single broker
(consumer/kafka/jobs_topic.py). The three-node case is in
``tests/chaos/test_cluster_faults.py`` (the topic survives the SIGKILL of its leader)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from consumer.kafka.admin import create_topics, delete_topics
from consumer.kafka.config import KafkaClientSettings
from consumer.kafka.durability import Durability, topic_durability
from consumer.kafka.errors import JobsTopicError
from consumer.kafka.jobs_topic import COMPACTED, ensure_jobs_topic
from tests.integration.harness import ServeProcess, poll_until

pytestmark = pytest.mark.integration

WARNING = "is less durable than the request topic"


@pytest.fixture
async def names(kafka_bootstrap: str) -> AsyncIterator[list[str]]:
    """Unique topic names for one test (deleted afterwards)."""
    made = [f"test.jobs-rf.{uuid.uuid4().hex[:10]}.{i}" for i in range(3)]
    yield made
    await delete_topics(kafka_bootstrap, made)


async def durability(bootstrap: str, topic: str) -> Durability | None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return await topic_durability(admin, topic)
    finally:
        await admin.close()


async def test_a_created_jobs_topic_takes_the_clusters_default(
    kafka_bootstrap: str, names: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="consumer.kafka.jobs_topic")
    client = KafkaClientSettings(bootstrap=kafka_bootstrap)
    assert await ensure_jobs_topic(client, names[0])
    assert await durability(kafka_bootstrap, names[0]) == Durability(1, 1)  # the broker's own
    assert f"created the jobs topic {names[0]} (compacted, 1 replica(s): the cluster's " \
        "default.replication.factor)" in caplog.text  # fmt: skip
    assert not await ensure_jobs_topic(client, names[0])  # existing: left as it is


async def test_a_replication_factor_the_cluster_cannot_hold_is_refused_naming_it(
    kafka_bootstrap: str, names: list[str]
) -> None:
    client = KafkaClientSettings(bootstrap=kafka_bootstrap)
    with pytest.raises(JobsTopicError, match=r"with 2 replica\(s\) \(as requested\)"):
        await ensure_jobs_topic(client, names[0], replication_factor=2)  # one broker


async def test_a_jobs_topic_less_durable_than_the_request_topic_is_warned_about(
    kafka_bootstrap: str, names: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    """One broker: the request topic's min.insync.replicas set to 2, the jobs topic at the
    broker's 1 (on three nodes it is the replica count: tests/chaos)."""
    jobs, requests, strict = names
    await create_topics(kafka_bootstrap, [jobs], config=COMPACTED)
    await create_topics(kafka_bootstrap, [requests])
    await create_topics(kafka_bootstrap, [strict], config={"min.insync.replicas": "2"})
    client = KafkaClientSettings(bootstrap=kafka_bootstrap)
    caplog.set_level(logging.INFO, logger="consumer.kafka.jobs_topic")
    assert not await ensure_jobs_topic(client, jobs, request_topic=requests)
    assert WARNING not in caplog.text  # as durable: no warning
    assert not await ensure_jobs_topic(client, jobs, request_topic=strict)
    (line,) = [r.getMessage() for r in caplog.records if WARNING in r.getMessage()]
    assert "(1 replica(s), min.insync.replicas 1 against 1 replica(s), min.insync.replicas 2)" \
        in line and jobs in line and strict in line  # fmt: skip


async def existing_topics(bootstrap: str) -> set[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()


async def test_no_create_topics_creates_no_jobs_topic(
    kafka_bootstrap: str, names: list[str]
) -> None:
    """``--no-create-topics`` created the request, reply and dead-letter topics no more but still
    created the jobs topic: a missing one is now an error naming the flag, and nothing is
    created; an existing compacted one is used as before."""
    client = KafkaClientSettings(bootstrap=kafka_bootstrap)
    with pytest.raises(JobsTopicError, match="does not exist and --no-create-topics"):
        await ensure_jobs_topic(client, names[0], create=False)
    assert names[0] not in await existing_topics(kafka_bootstrap)
    await create_topics(kafka_bootstrap, [names[1]], config=COMPACTED)
    assert not await ensure_jobs_topic(client, names[1], create=False)


def serve_without_creating(
    bootstrap: str, names: list[str], tmp_path: Path, *extra: str
) -> ServeProcess:
    """``kbatch serve --no-create-topics`` (the no-op model) on ``names``: the jobs, request
    and reply topics (replies and dead letters on one topic)."""
    jobs, requests, replies = names
    return ServeProcess.start(
        tmp_path,
        bootstrap=bootstrap,
        request_topic=requests,
        reply_topic=replies,
        dlq_topic=replies,
        group_id=f"test.no-create.{uuid.uuid4().hex[:8]}",
        model="noop",
        extra=["--no-create-topics", "--jobs-topic", jobs, *extra],
    )


async def test_serve_with_no_create_topics_runs_without_jobs_and_creates_nothing(
    kafka_bootstrap: str, names: list[str], tmp_path: Path
) -> None:
    """serve answers with backfill jobs off (one error line: before, aiokafka added four
    "Unclosed AIOKafkaConsumer/Producer" ERROR lines) and leaves the jobs topic uncreated:
    kbatch writes only where its operator allowed."""
    jobs, requests, replies = names
    await create_topics(kafka_bootstrap, [requests, replies])
    server = serve_without_creating(kafka_bootstrap, names, tmp_path)
    try:
        server.wait_ready()
        log = server.log_tail(200)
    finally:
        server.stop()
    (line,) = [x for x in log.splitlines() if " ERROR " in x]  # one line, no client noise
    assert "backfill jobs off" in line and f"the jobs topic {jobs!r} does not exist" in line
    assert "Unclosed" not in log  # the jobs clients are made by start(), none left unclosed
    assert jobs not in await existing_topics(kafka_bootstrap)


async def test_serve_names_a_missing_request_topic_and_waits_for_it(
    kafka_bootstrap: str, names: list[str], tmp_path: Path
) -> None:
    """Regression: with ``--no-create-topics`` and no request topic, serve said nothing
    of its own (only aiokafka's "Topic … not found in cluster metadata", now a WARNING a
    minute). Now one ERROR line names the missing topic (not the ones that exist), nothing is
    created, and serve consumes once the operator has made it."""
    _, requests, replies = names
    await create_topics(kafka_bootstrap, [replies])
    server = serve_without_creating(kafka_bootstrap, names, tmp_path, "--no-run-jobs")
    try:
        poll_until(lambda: "serving " in server.log_tail(200), 120, "serve's start")
        errors = [x for x in server.log_tail(200).splitlines() if " ERROR " in x]
        assert len(errors) == 1, errors
        assert f"topic {requests!r} does not exist" in errors[0] and replies not in errors[0]
        assert requests not in await existing_topics(kafka_bootstrap)
        await create_topics(kafka_bootstrap, [requests])
        server.wait_ready(90)  # its metadata refresh (30 s) finds the topic; it is assigned
    finally:
        server.stop()


async def test_serve_refuses_to_start_without_its_reply_topic(
    kafka_bootstrap: str, names: list[str], tmp_path: Path
) -> None:
    """Regression: with ``--no-create-topics`` and no reply (and dead-letter) topic,
    serve consumed a request, both its reply and its dead letter were refused, and its offset
    was committed: lost. Now serve stops at start, exit 1 and one ERROR line naming the
    topic, before it joins the group: nothing consumed, nothing created."""
    _, requests, replies = names
    await create_topics(kafka_bootstrap, [requests])
    server = serve_without_creating(kafka_bootstrap, names, tmp_path, "--no-run-jobs")
    try:
        assert server.wait(120) == 1
    finally:
        server.stop()
    errors = [x for x in server.log_tail(200).splitlines() if " ERROR " in x]
    assert len(errors) == 1, errors
    assert f"topic {replies!r} does not exist with --no-create-topics: create it" in errors[0]
    assert "Traceback" not in server.log_tail(200)
    assert replies not in await existing_topics(kafka_bootstrap)
