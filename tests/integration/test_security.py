"""kbatch against a secured broker: TLS, SCRAM, mutual TLS and ACLs.

One secured broker per test session (``kbatch broker start --secure``'s code, on free ports,
its certificates and passwords in the session's temporary folder). kbatch's principal gets
exactly the ACLs docs/SECURITY.md lists; the client principal writes requests and reads its
own reply topic only. Nothing is mocked: real processes, real broker, real ACL denials.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition
from pydantic import SecretStr

from consumer.broker.secure import SecureBroker, make_ca
from consumer.kafka.acls import Acl, create_acls
from consumer.kafka.admin import ensure_topics
from consumer.kafka.client_config import client_kwargs, security_kwargs
from consumer.kafka.config import ConsumerGroupSettings, KafkaClientSettings
from consumer.kafka.errors import KafkaSecurityError
from schemas import headers as H
from schemas.codec import Encoding, encode_request
from schemas.models import Request
from tests.integration.harness import KBATCH, ServeProcess, free_port, poll_until

pytestmark = pytest.mark.timeout(600)

GROUP = "sec-serve"
REQUESTS, REPLIES, DLQ = "sec.requests", "sec.replies", "sec.requests.dlq"
MTLS_REQUESTS, MTLS_REPLIES = "sec.mtls.requests", "sec.mtls.replies"
ALLOWED = r"replies\.app-.*"  # --allowed-reply-topics
APP_REPLIES = "replies.app-a"  # allowed, and kbatch may write it (prefixed ACL)
LOCKED = "replies.app-locked"  # allowed by the pattern, but no ACL lets kbatch write it
FOREIGN = "billing.events"  # outside the pattern (kbatch could not write it either)
OTHER_CLIENT = "replies.other-client"  # another client's reply topic
SOURCE, OUTPUT = "sec.history", "sec.scored"  # backfill
EOS_REQUESTS, EOS_GROUP = "sec.eos.requests", "sec-eos"  # --exactly-once
DESCRIBE_ONLY = "replies.app-describe-only"  # allowed by the pattern; kbatch may only describe it


def free_port_triple() -> int:
    """A port ``p`` with ``p + 1`` and ``p + 2`` free too (SASL_SSL, controller, mutual TLS)."""
    import socket

    for _ in range(50):
        port = free_port()
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port + 1))
                b.bind(("127.0.0.1", port + 2))
            return port
        except OSError:
            continue
    raise AssertionError("no three free ports in a row on 127.0.0.1")


def kbatch_acls() -> list[Acl]:
    """docs/SECURITY.md §kbatch's principal, for this test's names."""
    u = "User:kbatch"
    return [
        Acl(u, "READ", "topic", REQUESTS),
        Acl(u, "READ", "topic", MTLS_REQUESTS),
        Acl(u, "READ", "group", GROUP),
        Acl(u, "READ", "group", f"{GROUP}-mtls"),
        Acl(u, "WRITE", "topic", REPLIES),
        Acl(u, "WRITE", "topic", MTLS_REPLIES),
        Acl(u, "WRITE", "topic", DLQ),
        Acl(u, "WRITE", "topic", "replies.app-a", "prefixed"),
        # backfill
        Acl(u, "READ", "topic", SOURCE),
        Acl(u, "READ", "group", "sec-backfill"),
        Acl(u, "WRITE", "topic", OUTPUT),
        Acl(u, "WRITE", "topic", f"{SOURCE}.dlq"),
        # --exactly-once (serve's transactional ids: kbatch-<group>-<topic>-<partition>)
        Acl(u, "READ", "topic", EOS_REQUESTS),
        Acl(u, "READ", "group", EOS_GROUP),
        Acl(u, "WRITE", "transactional_id", f"kbatch-{EOS_GROUP}-", "prefixed"),
        Acl(u, "DESCRIBE", "topic", DESCRIBE_ONLY),  # not WRITE: the denied topic
    ]


def client_acls() -> list[Acl]:
    """docs/SECURITY.md §A client's principal: write requests, read its own reply topic."""
    u = "User:client"
    return [
        Acl(u, "WRITE", "topic", REQUESTS),
        Acl(u, "WRITE", "topic", MTLS_REQUESTS),
        Acl(u, "READ", "topic", REPLIES),
        Acl(u, "READ", "topic", MTLS_REPLIES),
    ]


@dataclass
class Secured:
    broker: SecureBroker
    root: Path

    def env(self, user: str, *, mtls: bool = False, **extra: str) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith("KBATCH_")}
        return {**base, **self.broker.client_env(user, mtls=mtls), **extra}

    def password(self, user: str) -> str:
        return self.broker.password(user)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    root = tmp_path_factory.mktemp("secured")
    broker = SecureBroker(port=free_port_triple(), cache_dir=root)
    try:
        broker.start(timeout_s=150)
    except Exception:
        broker.stop()
        raise
    admin = broker.client_settings("admin")

    async def setup() -> None:
        topics = {t: 1 for t in (REPLIES, DLQ, MTLS_REPLIES, APP_REPLIES, LOCKED, FOREIGN)}
        topics |= {OTHER_CLIENT: 1, SOURCE: 2, OUTPUT: 2, f"{SOURCE}.dlq": 1}
        topics |= {REQUESTS: 2, MTLS_REQUESTS: 1, EOS_REQUESTS: 1, DESCRIBE_ONLY: 1}
        await ensure_topics(broker.bootstrap, topics, 1, security_kwargs(admin))
        await create_acls(admin, kbatch_acls() + client_acls())

    asyncio.run(setup())
    try:
        yield Secured(broker, root)
    finally:
        broker.stop()


@dataclass
class SecureServe(ServeProcess):
    env: dict[str, str] = field(default_factory=dict)

    def launch(self) -> None:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.args, stdout=log, stderr=subprocess.STDOUT, env=self.env
            )


def start_serve(
    secured: Secured, tmp_path: Path, *, mtls: bool, extra: list[str], name: str
) -> SecureServe:
    port = free_port()
    request_topic, reply_topic = (MTLS_REQUESTS, MTLS_REPLIES) if mtls else (REQUESTS, REPLIES)
    args = [
        KBATCH, "serve", "--no-create-topics",
        "--request-topic", request_topic, "--reply-topic", reply_topic, "--dlq-topic", DLQ,
        "--group-id", GROUP + ("-mtls" if mtls else ""),
        "--model", str(secured.root / "tiny"), "--metrics-port", str(port),
        "--torch-threads", "1", "--session-timeout-ms", "10000",
        "--heartbeat-interval-ms", "1000", "--commit-interval-ms", "200", *extra,
    ]  # fmt: skip
    # The supervisor's settings file goes to TMPDIR: the test greps it for the password.
    env = secured.env("kbatch", mtls=mtls, PYTHONUNBUFFERED="1", TMPDIR=str(tmp_path))
    server = SecureServe(args, tmp_path / f"{name}.log", port, env=env)
    server.launch()
    return server


def run_kbatch(
    args: list[str], env: dict[str, str], timeout_s: float = 90
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [KBATCH, *args], env=env, capture_output=True, text=True, timeout=timeout_s, check=False
    )


async def produce(secured: Secured, topic: str, records: list[tuple[bytes, str | None]]) -> None:
    """Requests as the admin, each with its ``kafka_replyTopic`` (None: none)."""
    producer = AIOKafkaProducer(**client_kwargs(secured.broker.client_settings("admin")))
    await producer.start()
    try:
        for key, reply_topic in records:
            headers = [(H.CORRELATION_ID, key)]
            if reply_topic is not None:
                headers.append((H.REPLY_TOPIC, reply_topic.encode()))
            value = encode_request(Request(text=f"text of {key.decode()}"), Encoding.MSGPACK)
            await producer.send_and_wait(topic, value, key=key, headers=headers)
    finally:
        await producer.stop()


async def read_all(
    secured: Secured,
    topic: str,
    want: int,
    timeout_s: float = 60,
    isolation_level: str = "read_uncommitted",
) -> list[Any]:
    """Every record of ``topic`` as the admin, once at least ``want`` are there (or the time
    is up)."""
    consumer = AIOKafkaConsumer(
        **client_kwargs(secured.broker.client_settings("admin")),
        enable_auto_commit=False,
        isolation_level=isolation_level,
    )
    await consumer.start()
    try:
        parts = consumer.partitions_for_topic(topic) or set()
        if not parts:
            await consumer._client._wait_on_metadata(topic)
            parts = consumer.partitions_for_topic(topic) or {0}
        tps = [TopicPartition(topic, p) for p in parts]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        out: list[Any] = []
        deadline = time.monotonic() + timeout_s
        while len(out) < want and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            for records in batches.values():
                out.extend(records)
        return out
    finally:
        await consumer.stop()


@pytest.fixture(scope="module")
def tiny(secured: Secured) -> Path:
    from tests.fixtures.tiny_models import build_tiny_embedder

    path = secured.root / "tiny"
    if not path.exists():
        build_tiny_embedder(path)
    return path


def assert_clean_failure(out: subprocess.CompletedProcess[str], cause: str, secret: str) -> None:
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert "Traceback" not in text, text
    assert cause in text, text
    assert secret not in text


def test_wrong_password_untrusted_ca_and_denied_reads_fail_in_one_line(
    secured: Secured, tiny: Path, tmp_path: Path
) -> None:
    password = secured.password("kbatch")
    untrusted = make_ca(tmp_path, "someone-else")[0]
    serve = [
        "serve", "--request-topic", REQUESTS, "--reply-topic", REPLIES, "--dlq-topic", DLQ,
        "--model", str(tiny), "--metrics-port", "0", "--torch-threads", "1",
    ]  # fmt: skip
    cases = [
        (serve, secured.env("kbatch", KBATCH_SASL_PASSWORD="not-" + password), "SASL"),
        (serve, secured.env("kbatch", KBATCH_SSL_CAFILE=str(untrusted)), "TLS check"),
        (
            ["request", "--request-topic", REQUESTS, "--reply-topic", REPLIES, "hi"],
            secured.env("client", KBATCH_SSL_CAFILE=str(untrusted)),
            "TLS check",
        ),
        (
            ["backfill", "--source-topic", SOURCE, "--output-topic", OUTPUT, "--model", str(tiny)],
            secured.env("kbatch", KBATCH_SASL_PASSWORD="not-" + password),
            "SASL",
        ),
        (  # the client principal may write requests, not read them nor join kbatch's group
            [*serve, "--no-create-topics", "--group-id", GROUP],
            secured.env("client"),
            "AUTHORIZATION_FAILED",
        ),
    ]
    procs = [
        subprocess.Popen(
            [KBATCH, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for args, env, _ in cases
    ]
    started = time.monotonic()
    for proc, (args, _, cause) in zip(procs, cases, strict=True):
        stdout, stderr = proc.communicate(timeout=120)
        out = subprocess.CompletedProcess(args, proc.returncode, stdout, stderr)
        assert_clean_failure(out, cause, password)
    # Nothing waits for a retry: the logins fail within the connect timeout, the denied
    # read at the first poll after the model loaded (5 processes on a small machine).
    assert time.monotonic() - started < 150


def test_secured_serve_request_load_backfill_and_what_kbatch_may_not_write(
    secured: Secured, tiny: Path, tmp_path: Path
) -> None:
    kbatch_password = secured.password("kbatch")
    client_password = secured.password("client")
    sasl = start_serve(
        secured,
        tmp_path,
        mtls=False,
        extra=["--allowed-reply-topics", ALLOWED, "--replicas", "2"],
        name="serve-sasl",
    )
    mtls = start_serve(secured, tmp_path, mtls=True, extra=[], name="serve-mtls")
    try:
        # Backfill over SASL_SSL meanwhile (its own model load overlaps the servers').
        asyncio.run(produce(secured, SOURCE, [(f"h{i}".encode(), None) for i in range(6)]))
        backfill = run_kbatch(
            ["backfill", "--source-topic", SOURCE, "--output-topic", OUTPUT,
             "--group-id", "sec-backfill", "--model", str(tiny), "--torch-threads", "1",
             "--text-field", "text", "--json"],
            secured.env("kbatch"), timeout_s=240,
        )  # fmt: skip
        assert backfill.returncode == 0, backfill.stderr[-2000:]
        summary = json.loads(backfill.stdout.splitlines()[-1])
        assert summary["complete"] is True and summary["ok"] == 6, summary

        sasl.wait_ready(180)
        mtls.wait_ready(180)
        # request over SASL_SSL/SCRAM and over mutual TLS, as the client principal
        for env, topics in [
            (secured.env("client"), [REQUESTS, REPLIES]),
            (secured.env("client", mtls=True), [REQUESTS, REPLIES]),
            (secured.env("client", mtls=True), [MTLS_REQUESTS, MTLS_REPLIES]),
        ]:
            out = run_kbatch(
                ["request", "--request-topic", topics[0], "--reply-topic", topics[1],
                 "--timeout-s", "60", "hello"],
                env,
            )  # fmt: skip
            assert out.returncode == 0, out.stderr
            assert json.loads(out.stdout)["status"] == "ok"

        # load over SASL_SSL
        corpus = tmp_path / "texts.txt"
        corpus.write_text("\n".join(f"sentence number {i}" for i in range(20)) + "\n")
        load = run_kbatch(
            ["load", "--request-topic", REQUESTS, "--reply-topic", REPLIES, "--rate", "5",
             "--duration-s", "2", "--warmup-s", "0", "--corpus", str(corpus), "--json",
             "--no-progress"],
            secured.env("client"),
        )  # fmt: skip
        assert load.returncode == 0, load.stderr
        summary = json.loads(load.stdout)["summary"]
        assert summary["answered"] == summary["ok"] == summary["sent"] == 10

        # A client principal cannot read another client's reply topic: one line, exit 1.
        denied = run_kbatch(
            ["request", "--request-topic", REQUESTS, "--reply-topic", OTHER_CLIENT,
             "--timeout-s", "20", "hi"],
            secured.env("client"),
        )  # fmt: skip
        assert denied.returncode == 1 and "Traceback" not in denied.stderr, denied.stderr
        assert OTHER_CLIENT in denied.stderr

        # Replies only where allowed: the pattern, then the broker's ACLs; others flow.
        asyncio.run(
            produce(
                secured,
                REQUESTS,
                [
                    (b"foreign", FOREIGN),
                    (b"locked", LOCKED),
                    (b"app", APP_REPLIES),
                    (b"plain", None),
                    (b"internal", "__consumer_offsets"),
                ],
            )
        )
        app = asyncio.run(read_all(secured, APP_REPLIES, 1))
        assert [r.key for r in app] == [b"app"]
        dead = asyncio.run(read_all(secured, DLQ, 3))
        reasons = {
            r.key: (H.last_value(r.headers, H.ERROR_CODE), H.last_value(r.headers, H.ERROR_MESSAGE))
            for r in dead
        }
        assert set(reasons) == {b"foreign", b"locked", b"internal"}, reasons
        assert {code for code, _ in reasons.values()} == {b"reply_topic_not_allowed"}
        assert b"--allowed-reply-topics" in (reasons[b"foreign"][1] or b"")
        assert b"denies" in (reasons[b"locked"][1] or b"")  # the broker's ACL, not the pattern
        assert asyncio.run(read_all(secured, FOREIGN, 1, timeout_s=2)) == []
        assert asyncio.run(read_all(secured, LOCKED, 1, timeout_s=2)) == []
        plain = asyncio.run(read_all(secured, REPLIES, 100, timeout_s=5))
        assert b"plain" in {r.key for r in plain}

        # No secret in logs, /metrics, or a file left behind by a SIGKILLed supervisor.
        metrics = sasl._get("/metrics")[1].decode()
        assert "reply_topic_not_allowed" in metrics
        assert sasl.proc is not None
        replicas = psutil.Process(sasl.proc.pid).children()
        assert len(replicas) == 2
        os.kill(sasl.proc.pid, signal.SIGKILL)
        sasl.proc.wait(30)
        poll_until(  # they watch the supervisor's pid (consumer/serve/supervisor_watch.py)
            lambda: not any(r.is_running() and r.status() != "zombie" for r in replicas),
            60,
            "the replicas to stop after their supervisor was killed",
        )
        secrets = (kbatch_password, client_password)
        for text in (metrics, backfill.stdout + backfill.stderr, load.stdout + load.stderr):
            assert not any(s in text for s in secrets)
        left = [p for p in tmp_path.rglob("*") if p.is_file()]
        assert any(p.name == "settings.yaml" for p in left), "the supervisor's file is kept"
        for path in left:
            content = path.read_bytes()
            assert not any(s.encode() in content for s in secrets), path
    finally:
        for server in (sasl, mtls):
            if server.proc is not None and server.proc.poll() is None:
                server.stop()


async def committed_offset(secured: Secured, group: str, topic: str) -> int | None:
    """``group``'s committed offset of ``topic``'s partition 0, asked as the admin."""
    consumer = AIOKafkaConsumer(
        **client_kwargs(secured.broker.client_settings("admin")),
        group_id=group,
        enable_auto_commit=False,
    )
    await consumer.start()
    try:
        offset: int | None = await consumer.committed(TopicPartition(topic, 0))
        return offset
    finally:
        await consumer.stop()


def test_exactly_once_dead_letters_a_reply_topic_kbatch_may_describe_but_not_write(
    secured: Secured, tiny: Path, tmp_path: Path
) -> None:
    # Regression: the denied topic entered the transaction (AddPartitionsToTxn refused),
    # which failed whole, at every try: the partition never moved. Now the request is
    # dead-lettered as under at-least-once, its neighbours are answered, the transaction
    # commits, and nothing is aborted.
    port = free_port()
    server = SecureServe(
        [
            KBATCH, "serve", "--no-create-topics", "--exactly-once",
            "--request-topic", EOS_REQUESTS, "--reply-topic", REPLIES, "--dlq-topic", DLQ,
            "--group-id", EOS_GROUP, "--allowed-reply-topics", ALLOWED,
            "--model", str(tiny), "--metrics-port", str(port), "--torch-threads", "1",
            "--commit-interval-ms", "200",
        ],
        tmp_path / "serve-eos.log",
        port,
        env=secured.env("kbatch", PYTHONUNBUFFERED="1"),
    )  # fmt: skip
    server.launch()
    try:
        server.wait_ready(180)
        keys = [b"eos-before", b"eos-denied", b"eos-after"]
        asyncio.run(
            produce(
                secured,
                EOS_REQUESTS,
                [(b"eos-before", None), (b"eos-denied", DESCRIBE_ONLY), (b"eos-after", None)],
            )
        )
        poll_until(
            lambda: asyncio.run(committed_offset(secured, EOS_GROUP, EOS_REQUESTS)) == len(keys),
            90,
            "the transaction holding all three to commit",
        )
        replies = asyncio.run(read_all(secured, REPLIES, 100, 5, "read_committed"))
        answered = [r.key for r in replies if r.key in keys]
        assert answered == [b"eos-before", b"eos-after"], server.log_tail()
        dead = asyncio.run(read_all(secured, DLQ, 100, 5, "read_committed"))
        denied = [r for r in dead if r.key == b"eos-denied"]
        assert len(denied) == 1
        assert H.last_value(denied[0].headers, H.ERROR_CODE) == b"reply_topic_not_allowed"
        assert asyncio.run(read_all(secured, DESCRIBE_ONLY, 1, timeout_s=2)) == []
        metrics = server.metrics()
        assert not any(k.startswith("kbatch_transaction_recoveries_total") and v for k, v in
                       metrics.items())  # fmt: skip
    finally:
        server.stop()


def test_confluent_sinks_refuse_alone_what_kbatch_may_not_write(secured: Secured) -> None:
    # The librdkafka sinks over SASL_SSL: a topic no ACL lets kbatch write (LOCKED, hidden) or
    # only describe (DESCRIBE_ONLY) fails its record alone with DeliveryDeniedError; in a
    # transaction the verdict keeps it out, so its neighbour commits.
    from consumer.kafka.config import SinkSettings
    from consumer.kafka.confluent_adapter.sink import ConfluentSink
    from consumer.kafka.confluent_adapter.transactions import ConfluentTransactionalSink
    from consumer.kafka.errors import DeliveryDeniedError
    from schemas.records import OutRecord

    client = secured.broker.client_settings("kbatch")

    def rec(topic: str | None, key: bytes) -> OutRecord:
        return OutRecord(topic=topic, partition=None, key=key, value=b"v", headers=[])

    async def outcomes(acks: list[asyncio.Future[None]]) -> list[Any]:
        await asyncio.wait_for(asyncio.gather(*acks, return_exceptions=True), 60)
        return [type(a.exception()) if a.exception() else None for a in acks]

    async def run() -> None:
        sink = ConfluentSink(client, SinkSettings(), default_topic=REPLIES)
        await sink.start()
        try:
            acks = await sink.send(
                [rec(LOCKED, b"cf-locked"), rec(DESCRIBE_ONLY, b"cf-describe"), rec(None, b"cf")]
            )
            assert await outcomes(acks) == [DeliveryDeniedError, DeliveryDeniedError, None]
        finally:
            await sink.stop()
        txn = ConfluentTransactionalSink(
            client, SinkSettings(), default_topic=REPLIES, group_id=EOS_GROUP, id_prefix="kbatch"
        )
        tp = (EOS_REQUESTS, 0)
        offset = await committed_offset(secured, EOS_GROUP, EOS_REQUESTS) or 0
        await txn.open(tp, timeout_s=60)
        try:
            acks = await txn.send_from(tp, [rec(DESCRIBE_ONLY, b"cf-txn-d"), rec(None, b"cf-t")])
            assert await outcomes(acks) == [DeliveryDeniedError, None]
            assert await txn.commit({tp: offset}, {tp: ""}) == {tp: offset}
        finally:
            await txn.stop()

    asyncio.run(run())


def test_confluent_sinks_report_a_refused_login_as_security(secured: Secured) -> None:
    from pydantic import SecretStr

    from consumer.kafka.config import SinkSettings
    from consumer.kafka.confluent_adapter.sink import ConfluentSink
    from consumer.kafka.confluent_adapter.transactions import ConfluentTransactionalSink
    from consumer.kafka.errors import KafkaSecurityError

    wrong = secured.broker.client_settings("kbatch").model_copy(
        update={"sasl_password": SecretStr("not-the-password")}
    )
    settings = SinkSettings(send_timeout_ms=5000)

    async def run() -> None:
        sink = ConfluentSink(wrong, settings, default_topic=REPLIES)
        with pytest.raises(KafkaSecurityError) as refused:
            await sink.start()
        assert "not-the-password" not in str(refused.value)
        txn = ConfluentTransactionalSink(
            wrong, settings, default_topic=REPLIES, group_id=EOS_GROUP, id_prefix="kbatch"
        )
        with pytest.raises(KafkaSecurityError):
            await txn.open((EOS_REQUESTS, 0), timeout_s=5)

    asyncio.run(run())


@pytest.mark.parametrize("kind", ["aiokafka", "confluent"])
async def test_a_group_source_refused_by_the_broker_says_why_in_one_error(
    secured: Secured, tmp_path: Path, kind: str
) -> None:
    """Both clients of the seam (consumer.kafka.transport.GroupSource): a wrong password and
    an untrusted CA fail at start, a denied read at the first polls, each one error."""
    from consumer.kafka.confluent_adapter.source import ConfluentSource
    from consumer.kafka.source import KafkaSource

    def source(settings: KafkaClientSettings, group: str = GROUP) -> Any:
        cls = KafkaSource if kind == "aiokafka" else ConfluentSource
        return cls(
            settings, ConsumerGroupSettings(), _NoHandler(), group_id=group,
            topics=[REQUESTS], max_poll_records=10,
        )  # fmt: skip

    kbatch = secured.broker.client_settings("kbatch")
    untrusted = make_ca(tmp_path, "someone-else")[0]
    refused = [
        (kbatch.model_copy(update={"sasl_password": SecretStr("not-it")}), "SASL login refused"),
        (kbatch.model_copy(update={"ssl_cafile": untrusted}), "TLS check of the broker's"),
    ]
    for settings, cause in refused:
        member = source(settings)
        with pytest.raises(KafkaSecurityError, match=cause) as raised:
            await member.start()
        await member.stop()
        assert "the broker at 127.0.0.1:" in str(raised.value)
        assert "not-it" not in str(raised.value)
    member = source(secured.broker.client_settings("client"))  # may not read REQUESTS
    await member.start()
    try:
        deadline = time.monotonic() + 30
        with pytest.raises(KafkaSecurityError, match="AUTHORIZATION_FAILED"):
            while time.monotonic() < deadline:
                await member.poll(10, 100)
    finally:
        await member.stop()


class _NoHandler:
    async def on_assigned(self, tps: frozenset[tuple[str, int]]) -> None:
        pass

    async def on_revoked(self, tps: frozenset[tuple[str, int]]) -> None:
        pass
