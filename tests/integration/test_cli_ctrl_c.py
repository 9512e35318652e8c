"""Ctrl-C (SIGINT) sent to real ``kbatch`` processes against the real broker: ``load`` prints
the report of what it sent, ``serve`` interrupted while starting leaves nothing unclosed, a
first Ctrl-C drains (saying how long it may take), a second one stops now (exit 130, nothing
committed past what was answered)."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from consumer.kafka.admin import create_topics, delete_topics
from tests.conftest import unique_group
from tests.integration.harness import (
    KBATCH,
    Req,
    ServeProcess,
    committed_offsets,
    poll_until,
    produce,
    request,
)

EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143
NOISE = ("Traceback", "Unclosed", "Aborted!")


def quiet(text: str) -> None:
    for noise in NOISE:
        assert noise not in text, text[-3000:]


@pytest.fixture
def topics(kafka_bootstrap: str) -> Iterator[tuple[str, str, str]]:
    """Request, reply and dead-letter topics of one partition each, for one test."""
    suffix = unique_group("c").rsplit(".", 1)[-1]
    names = [f"test.ctrlc-{n}.{suffix}" for n in ("req", "rep", "dlq")]
    asyncio.run(create_topics(kafka_bootstrap, names, partitions=1))
    yield names[0], names[1], names[2]
    asyncio.run(delete_topics(kafka_bootstrap, names))


async def end_offset(bootstrap: str, topic: str) -> int:
    """Records written to partition 0 of ``topic``."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        return int((await consumer.end_offsets([tp]))[tp])
    finally:
        await consumer.stop()


def consumed(server: ServeProcess) -> float:
    metric = "kbatch_records_consumed_total"
    return sum(v for k, v in server.metrics().items() if k.startswith(metric))


@pytest.mark.parametrize(
    ("signum", "exit_code"),
    [(signal.SIGINT, EXIT_INTERRUPTED), (signal.SIGTERM, EXIT_TERMINATED)],
    ids=["ctrl-c", "sigterm"],
)
def test_c_load_interrupted_prints_the_report_of_what_it_sent(
    tmp_path: Path,
    kafka_bootstrap: str,
    tiny_embed_dir: Path,
    topics: tuple[str, str, str],
    signum: signal.Signals,
    exit_code: int,
) -> None:
    """Ctrl-C, or SIGTERM (``timeout``, a script's ``kill``; a background job of a script
    ignores SIGINT), ends a run with the report of what it sent; SIGTERM ended it silently."""
    req, rep, dlq = topics
    corpus = tmp_path / "texts.txt"
    corpus.write_text("".join(f"text number {i}\n" for i in range(50)))
    server = ServeProcess.start(
        tmp_path, bootstrap=kafka_bootstrap, request_topic=req, reply_topic=rep,
        dlq_topic=dlq, group_id=unique_group("cl"), model=str(tiny_embed_dir),
        extra=["--no-run-jobs"],
    )  # fmt: skip
    try:
        server.wait_ready()
        load = subprocess.Popen(
            [KBATCH, "load", "--bootstrap", kafka_bootstrap, "--request-topic", req,
             "--reply-topic", rep, "--rate", "20", "--duration-s", "120", "--warmup-s", "0",
             "--corpus", str(corpus), "--no-progress", "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        # The probe request and then 10 of the run's (the probe is not in the report's "sent").
        poll_until(lambda: consumed(server) >= 11, 90, "the probe and 10 load requests consumed")
        load.send_signal(signum)
        out, err = load.communicate(timeout=60)
    finally:
        server.stop()
    assert load.returncode == exit_code, err[-3000:]
    quiet(err)
    serve_log = server.log_path.read_text()
    assert "kbatch.model" in serve_log and "loss_type" not in serve_log  # transformers' noise
    report = json.loads(out)
    cut = report["interrupted"]
    assert 10 <= cut["sent"] < cut["scheduled"] == 2400
    assert report["summary"]["sent"] == cut["sent"]  # the report covers what was sent
    assert report["summary"]["ok"] >= 5
    assert cut["signal"] == signum.name
    prefix = f"kbatch load: interrupted ({signum.name}) at"
    lines = [line for line in err.splitlines() if line.startswith(prefix)]
    assert len(lines) == 1 and f"the {cut['sent']} of 2400 requests sent" in lines[0]


def test_c_serve_interrupted_while_starting_closes_everything(
    tmp_path: Path, kafka_bootstrap: str, tiny_embed_dir: Path, topics: tuple[str, str, str]
) -> None:
    req, rep, dlq = topics
    server = ServeProcess.start(
        tmp_path, bootstrap=kafka_bootstrap, request_topic=req, reply_topic=rep,
        dlq_topic=dlq, group_id=unique_group("cs"), model=str(tiny_embed_dir),
        extra=["--no-run-jobs"],
    )  # fmt: skip
    try:
        # The model is loading (its CPU plan logged, the Kafka clients not yet started).
        poll_until(lambda: "kbatch.model" in server.log_path.read_text(), 90, "the model load")
        server.signal(signal.SIGINT)
        code = server.wait(60)
    finally:
        server.stop()
    log = server.log_path.read_text()
    assert code in (0, EXIT_INTERRUPTED), log[-3000:]
    quiet(log)


def test_c_serve_first_ctrl_c_drains_with_its_bound_and_a_second_stops_now(
    tmp_path: Path, kafka_bootstrap: str, topics: tuple[str, str, str]
) -> None:
    req, rep, dlq = topics
    group = unique_group("cd")
    server = ServeProcess.start(  # a slow device: 300 ms a batch of one
        tmp_path, bootstrap=kafka_bootstrap, request_topic=req, reply_topic=rep,
        dlq_topic=dlq, group_id=group, model="sim:300,0",
        extra=["--no-run-jobs", "--max-batch-size", "1", "--max-wait-ms", "0",
               "--drain-timeout-s", "120"],
    )  # fmt: skip
    try:
        server.wait_ready()
        asyncio.run(produce(kafka_bootstrap, req, [request(f"k{i}", "slow") for i in range(60)]))
        poll_until(lambda: consumed(server) >= 60, 60, "all 60 requests taken")
        server.signal(signal.SIGINT)
        poll_until(lambda: "stopping: draining" in server.log_path.read_text(), 30, "the drain")
        started = time.monotonic()
        server.signal(signal.SIGINT)
        code = server.wait(30)
        stopped_s = time.monotonic() - started
    finally:
        server.stop()
    log = server.log_path.read_text()
    assert code == EXIT_INTERRUPTED, log[-3000:]
    quiet(log)
    (drain,) = [line for line in log.splitlines() if "stopping: draining" in line]
    assert (
        "(at most 117.0 s of --drain-timeout-s 120; the rest is for closing the clients); "
        "Ctrl-C again stops now" in drain
    )
    assert "stopping now (second Ctrl-C)" in log
    assert stopped_s < 15  # the rest of the drain (≥ 10 s of batches) was not waited for
    answered = asyncio.run(end_offset(kafka_bootstrap, rep))
    committed = asyncio.run(committed_offsets(kafka_bootstrap, group, req, 1))[0] or 0
    assert committed <= answered < 60  # nothing committed past what was answered


def test_c_backfill_first_ctrl_c_says_what_it_waits_for_and_a_second_stops_now(
    tmp_path: Path, kafka_bootstrap: str, topics: tuple[str, str, str]
) -> None:
    source, output, dlq = topics
    group = unique_group("cb")
    texts = [Req(f"k{i}".encode(), f"text {i}".encode()) for i in range(200)]
    asyncio.run(produce(kafka_bootstrap, source, texts))
    log_path = tmp_path / "backfill.log"
    with log_path.open("ab") as log:
        proc = subprocess.Popen(  # a slow device: 300 ms a batch of one, every record read at once
            [KBATCH, "backfill", "--bootstrap", kafka_bootstrap, "--source-topic", source,
             "--output-topic", output, "--dlq-topic", dlq, "--group-id", group,
             "--from", "earliest", "--to", "latest", "--model", "sim:300,0",
             "--max-batch-size", "1", "--commit-interval-ms", "100", "--drain-timeout-s", "120"],
            stdout=subprocess.PIPE, stderr=log,
        )  # fmt: skip
    try:
        poll_until(lambda: asyncio.run(end_offset(kafka_bootstrap, output)) >= 3, 90, "3 scored")
        proc.send_signal(signal.SIGINT)
        poll_until(lambda: "stopping: finishing" in log_path.read_text(), 30, "the drain")
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        code = proc.wait(30)
        stopped_s = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    log = log_path.read_text()
    assert code == EXIT_INTERRUPTED, log[-3000:]
    quiet(log)
    (drain,) = [line for line in log.splitlines() if "stopping: finishing" in line]
    assert "scoring them, sending the results and committing (at most" in drain
    assert drain.endswith(
        "s of --drain-timeout-s 120; the rest is for closing the clients); Ctrl-C again stops now"
    )
    assert "stopping now (second Ctrl-C)" in log
    assert stopped_s < 15  # the rest of the drain (≥ 50 s of batches) was not waited for
    written = asyncio.run(end_offset(kafka_bootstrap, output))
    committed = asyncio.run(committed_offsets(kafka_bootstrap, group, source, 1))[0] or 0
    assert committed <= written < 200  # nothing committed past what was written
