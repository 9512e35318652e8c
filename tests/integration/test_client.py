"""The request/reply client and ``kbatch request`` against the real broker and a real
``kbatch serve`` on the tiny embedder."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from consumer.kafka.admin import create_topics, delete_topics
from producer_tools.client import (
    RequestReplyClient,
    RequestReplyClientSync,
    RequestTimeoutError,
    request_sync,
)
from schemas.codec import Encoding
from tests.conftest import TopicFactory, unique_group
from tests.integration.harness import KBATCH, ServeProcess, read_topic


@dataclass(frozen=True)
class Served:
    bootstrap: str
    requests: str
    replies: str
    server: ServeProcess


def _start_server(
    tmp_path: Path,
    bootstrap: str,
    requests: str,
    replies: str,
    model: Path,
    dlq: str | None = None,
) -> ServeProcess:
    return ServeProcess.start(
        tmp_path,
        bootstrap=bootstrap,
        request_topic=requests,
        reply_topic=replies,
        dlq_topic=dlq or f"{requests}.dlq",
        group_id=unique_group("client"),
        model=str(model),
        extra=["--max-wait-ms", "5"],
    )


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, kafka_bootstrap: str, tiny_embed_dir: Path
) -> Iterator[Served]:
    """One server for the module (starting one costs seconds); topics of its own."""
    suffix = unique_group("c").rsplit(".", 1)[-1]
    requests, replies = f"test.client-req.{suffix}", f"test.client-rep.{suffix}"
    asyncio.run(create_topics(kafka_bootstrap, [requests], partitions=2))
    asyncio.run(create_topics(kafka_bootstrap, [replies, f"{requests}.dlq"], partitions=3))
    server = _start_server(
        tmp_path_factory.mktemp("serve"), kafka_bootstrap, requests, replies, tiny_embed_dir
    )
    try:
        server.wait_ready()
        yield Served(kafka_bootstrap, requests, replies, server)
    finally:
        server.stop()
        asyncio.run(delete_topics(kafka_bootstrap, [requests, replies, f"{requests}.dlq"]))


async def _poll(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll ``predicate`` on the event loop until true; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.02)


def _client(s: Served, encoding: Encoding = Encoding.MSGPACK) -> RequestReplyClient:
    return RequestReplyClient(
        bootstrap=s.bootstrap, request_topic=s.requests, reply_topic=s.replies, encoding=encoding
    )


async def test_fifty_concurrent_requests_each_get_their_own_reply(served: Served) -> None:
    async with _client(served) as client:
        envelopes = await asyncio.gather(
            *(
                client.request(f"text number {i} " * (1 + i % 7), f"conc-{i}", meta={"i": i})
                for i in range(50)
            )
        )
        assert client.in_flight == 0
    assert [e.reply.meta for e in envelopes] == [{"i": i} for i in range(50)]
    assert [e.key for e in envelopes] == [f"conc-{i}".encode() for i in range(50)]
    assert all(e.record.key == e.key for e in envelopes)
    assert all(e.reply.status == "ok" and e.record.status == "ok" for e in envelopes)
    assert len({e.record.correlation_id for e in envelopes}) == 50
    assert all(len(e.record.correlation_id) == 16 for e in envelopes)
    assert all(e.record.topic == served.replies for e in envelopes)
    assert all(e.attempts == 1 and 0 < e.latency_s < 30 for e in envelopes)


async def test_json_request_gets_a_json_reply(served: Served) -> None:
    async with _client(served, encoding=Encoding.JSON) as client:
        env = await client.request("json please", task="embed", timeout_s=30)
    assert env.encoding is Encoding.JSON and env.reply.status == "ok"
    assert env.reply.result is not None


async def test_asking_again_with_the_same_key_is_answered_as_a_dedup(served: Served) -> None:
    async with _client(served) as client:
        first = await client.request("compute me once", "dedup-key", meta={"copy": 1})
        again = await client.request("compute me once", "dedup-key", meta={"copy": 2})
    assert (first.reply.dedup, again.reply.dedup) == (False, True)
    assert again.reply.result == first.reply.result
    assert again.reply.meta == {"copy": 2}  # its own meta, the first one's computation
    assert again.record.correlation_id != first.record.correlation_id


def test_sync_wrapper_and_one_shot_call(served: Served) -> None:
    with RequestReplyClientSync(
        bootstrap=served.bootstrap, request_topic=served.requests, reply_topic=served.replies
    ) as client:
        a = client.request("from a script", "sync-1")
        b = client.request("from a script, again", "sync-2", deadline_ms=1)  # long past
    assert a.reply.status == "ok"
    assert b.reply.status == "expired" and b.reply.error is not None
    assert b.reply.error.code == "deadline_exceeded"
    c = request_sync(
        "one shot",
        bootstrap=served.bootstrap,
        request_topic=served.requests,
        reply_topic=served.replies,
        timeout_s=30,
    )
    assert c.reply.status == "ok"


def test_kbatch_request_prints_the_reply_as_json(served: Served) -> None:
    common = [
        "--bootstrap", served.bootstrap,
        "--request-topic", served.requests,
        "--reply-topic", served.replies,
    ]  # fmt: skip
    out = subprocess.run(
        [KBATCH, "request", "hello from the cli", "--key", "cli-1", "--meta", '{"a": 1}', *common],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    reply = json.loads(out.stdout)
    assert reply["status"] == "ok" and reply["meta"] == {"a": 1}
    assert reply["result"]["dim"] == len(reply["result"]["embedding"]) == 32
    piped = subprocess.run(  # the same text from stdin, as echo writes it: the same embedding
        [KBATCH, "request", "-", "--key", "cli-2", *common],
        input="hello from the cli\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert piped.returncode == 0, piped.stderr
    assert json.loads(piped.stdout)["result"]["embedding"] == reply["result"]["embedding"]
    expired = subprocess.run(
        [KBATCH, "request", "too late", "--deadline-after-ms", "0", "--full", *common],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert expired.returncode == 1
    assert json.loads(expired.stdout)["reply"]["status"] == "expired"


async def test_a_dead_letter_on_the_reply_topic_is_not_taken_for_a_reply(served: Served) -> None:
    # Regression: a client named the dead-letter topic as its reply topic: the server refuses it
    # (reply_topic_not_allowed) and writes the request's copy there, with its correlation id,
    # which the client read as its reply. (kbatch request refuses that topic up front.)
    dlq = f"{served.requests}.dlq"
    async with RequestReplyClient(
        bootstrap=served.bootstrap, request_topic=served.requests, reply_topic=dlq
    ) as client:
        call = asyncio.create_task(client.request("mistaken", "dlq-1", timeout_s=60))
        await _poll(lambda: client.dead_letters_skipped == 1, 30, "the dead letter read")
        assert not call.done() and client.in_flight == 1  # still waiting for a reply
        call.cancel()


async def test_no_server_raises_the_timeout_error(
    new_topic: TopicFactory, kafka_bootstrap: str
) -> None:
    requests, replies = await new_topic("nobody-req"), await new_topic("nobody-rep")
    async with RequestReplyClient(
        bootstrap=kafka_bootstrap, request_topic=requests, reply_topic=replies
    ) as client:
        start = time.monotonic()
        with pytest.raises(RequestTimeoutError, match="no reply to key b'lonely'") as info:
            await client.request("anyone?", "lonely", timeout_s=1.0, retries=1)
        elapsed = time.monotonic() - start
        assert client.in_flight == 0 and client.sent == 2
    assert info.value.attempts == 2 and info.value.timeout_s == 1.0
    assert isinstance(info.value, TimeoutError)
    # A server that refuses the reply topic answers only with a dead letter: the hint says so.
    assert f"allow replies to {replies!r} (--allowed-reply-topics" in str(info.value)
    assert 0.9 < elapsed < 5
    cli = subprocess.run(
        [KBATCH, "request", "anyone?", "--timeout-s", "1", "--bootstrap", kafka_bootstrap,
         "--request-topic", requests, "--reply-topic", replies],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert cli.returncode == 1 and "no reply to key" in cli.stderr
    empty = subprocess.run(
        [KBATCH, "request", "", "--bootstrap", kafka_bootstrap,
         "--request-topic", requests, "--reply-topic", replies],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert empty.returncode == 2  # a usage error, one line, not pydantic's report
    assert "not a valid request: text: String should have at least 1 character" in empty.stderr
    assert "errors.pydantic.dev" not in empty.stderr


async def test_a_retry_reuses_the_key_and_the_server_answers_it_as_a_dedup(
    tmp_path: Path, new_topic: TopicFactory, kafka_bootstrap: str, tiny_embed_dir: Path
) -> None:
    requests, replies = await new_topic("retry-req"), await new_topic("retry-rep")
    dlq = await new_topic("retry-dlq")  # created (and deleted) here, not by the server
    async with RequestReplyClient(
        bootstrap=kafka_bootstrap, request_topic=requests, reply_topic=replies
    ) as client:
        call = asyncio.create_task(
            client.request("say it twice", "retry-key", timeout_s=90, retries=1, retry_after_s=0.5)
        )
        # No server yet: the first send goes unanswered and the retry follows.
        await _poll(lambda: client.sent >= 2, 10, "the retry to be sent")
        server = _start_server(tmp_path, kafka_bootstrap, requests, replies, tiny_embed_dir, dlq)
        try:
            env = await call
            records = await read_topic(kafka_bootstrap, replies, lambda rs: len(rs) >= 2, 60)
            sent = await read_topic(
                kafka_bootstrap, requests, lambda rs: len(rs) >= 2, 30, decode=False
            )
            await _poll(lambda: client.stray_replies == 1, 30, "the late reply to be ignored")
            metrics = server.metrics()
        finally:
            server.stop()
    assert env.attempts == 2 and env.reply.status == "ok"
    assert sorted(r.reply.dedup for r in records) == [False, True]
    assert {r.key for r in records} == {b"retry-key"}
    assert metrics["kbatch_dedup_hits_total"] == 1
    # the retry is the same request (contract 1.4: another input would be refused): the same
    # key and value bytes, under a correlation id of its own
    assert [r.key for r in sent] == [b"retry-key"] * 2 and sent[0].raw == sent[1].raw
    assert sent[0].headers["kafka_correlationId"] != sent[1].headers["kafka_correlationId"]


async def test_start_waits_for_topics_created_after_it_began(
    kafka_bootstrap: str, new_topic: TopicFactory
) -> None:
    """``kbatch serve &`` then ``kbatch request`` at once: the client waits for the topics the
    server is about to create instead of failing (the broker does not auto-create them)."""
    name = unique_group("late")
    requests, replies = f"{name}.req", f"{name}.rep"
    client = RequestReplyClient(
        bootstrap=kafka_bootstrap, request_topic=requests, reply_topic=replies
    )
    starting = asyncio.create_task(client.start())
    try:
        await asyncio.sleep(0)  # let start() send its first metadata request
        assert not starting.done()
        await create_topics(kafka_bootstrap, [requests, replies])
        await asyncio.wait_for(starting, 30)
    finally:
        await client.close()
        await delete_topics(kafka_bootstrap, [requests, replies])


async def test_missing_topics_are_named_in_the_start_error(kafka_bootstrap: str) -> None:
    from producer_tools.client import ClientError

    name = unique_group("absent")
    client = RequestReplyClient(
        bootstrap=kafka_bootstrap,
        request_topic=f"{name}.req",
        reply_topic=f"{name}.rep",
        start_timeout_s=1.5,
    )
    with pytest.raises(ClientError, match=r"do not exist .*kbatch topics create NAME") as err:
        await client.start()
    assert f"{name}.req" in str(err.value) and f"{name}.rep" in str(err.value)


def test_kbatch_topics_create_reports_created_existing_and_refused(kafka_bootstrap: str) -> None:
    name = unique_group("cli")
    base = [KBATCH, "topics", "create", "--bootstrap", kafka_bootstrap]
    try:
        first = subprocess.run(
            [*base, f"{name}.a", "--partitions", "3"], capture_output=True, text=True, check=False
        )
        again = subprocess.run([*base, f"{name}.a"], capture_output=True, text=True, check=False)
        refused = subprocess.run(
            [*base, f"{name}.b", "--replication-factor", "3"],
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        asyncio.run(delete_topics(kafka_bootstrap, [f"{name}.a"]))
    assert (first.returncode, first.stdout) == (0, f"{name}.a: created\n"), first.stderr
    assert (again.returncode, again.stdout) == (0, f"{name}.a: exists\n"), again.stderr
    assert refused.returncode == 1
    assert f"{name}.b" in refused.stderr and "could not be created" in refused.stderr


async def test_a_taken_metrics_port_is_one_error_line_and_exit_1(
    new_topic: TopicFactory, kafka_bootstrap: str
) -> None:
    """Regression: a second serve on a taken --metrics-port printed a traceback
    and aiokafka's 'Unclosed AIOKafkaProducer/Consumer' errors."""
    requests, replies = await new_topic("port-req"), await new_topic("port-rep")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [KBATCH, "serve", "--model", "sim:1,1", "--metrics-port", str(port),
             "--bootstrap", kafka_bootstrap, "--request-topic", requests,
             "--reply-topic", replies],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert f"cannot serve metrics on 127.0.0.1:{port} (Address already in use)" in proc.stderr
    assert "Traceback" not in proc.stderr and "Unclosed" not in proc.stderr, proc.stderr[-2000:]
