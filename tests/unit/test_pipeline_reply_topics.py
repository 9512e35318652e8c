"""The pipeline keeps replies where the operator allows: a request naming another
topic is dead-lettered ``reply_topic_not_allowed`` and nothing is written there; a reply the
broker's ACLs refuse is dead-lettered with the same code; other replies keep flowing."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import msgpack

from consumer.config import ServeSettings
from consumer.kafka.errors import DeliveryDeniedError
from consumer.kafka.records import InRecord
from consumer.replies.builder import ReplyBuilder
from consumer.serve.metrics import Metrics
from consumer.serve.pipeline import Pipeline
from schemas import headers as H
from schemas.errors import ErrorCode
from schemas.models import ModelInfo
from schemas.records import OutRecord
from tests.fakes import AnsweringEngine, FakeSink, FakeSource

DLQ = "kbatch.requests.dlq"


def request(offset: int, key: bytes, reply_topic: str | None) -> InRecord:
    headers = () if reply_topic is None else ((H.REPLY_TOPIC, reply_topic.encode()),)
    body = msgpack.packb({"text": f"text {offset}"})
    return InRecord("kbatch.requests", 0, offset, key, body, headers, 0)


class DenyingSink(FakeSink):
    """Acknowledges every record except those for ``denied``, which fail as the sink fails a
    ``TOPIC_AUTHORIZATION_FAILED`` produce."""

    def __init__(self, denied: str) -> None:
        super().__init__(auto_ack=True)
        self.denied = denied

    async def send(self, records: Sequence[OutRecord]) -> list[asyncio.Future[None]]:
        loop = asyncio.get_running_loop()
        acks: list[asyncio.Future[None]] = []
        allowed = [r for r in records if r.topic != self.denied]
        ok = iter(await super().send(allowed))
        for r in records:
            if r.topic == self.denied:
                ack = loop.create_future()
                ack.set_exception(DeliveryDeniedError("the broker denies writing to it"))
                acks.append(ack)
            else:
                acks.append(next(ok))
        return acks


async def run(settings: ServeSettings, sink: FakeSink, records: list[InRecord]) -> Metrics:
    return (await run_pipeline(settings, sink, records))[1]


async def run_pipeline(
    settings: ServeSettings, sink: FakeSink, records: list[InRecord]
) -> tuple[Pipeline, Metrics, FakeSource]:
    metrics = Metrics()
    source = FakeSource()
    pipeline = Pipeline(
        settings,
        sink,
        ReplyBuilder(ModelInfo(name="fake"), DLQ),
        metrics,
        source=lambda _: source,
        engine=AnsweringEngine(),
        clock=lambda: 100.0,
        wall_clock_ms=lambda: 1_000_000,
    )
    await pipeline.on_assigned(frozenset({("kbatch.requests", 0)}))
    await pipeline.take(records)
    for _ in range(50):
        await asyncio.sleep(0)
    await pipeline.commit()
    return pipeline, metrics, source


def dead_letter_codes(sink: FakeSink) -> dict[bytes | None, str]:
    return {r.key: dict(r.headers)[H.ERROR_CODE].decode() for r in sink.to(DLQ)}


async def test_a_topic_outside_the_allow_list_is_dead_lettered_and_never_written() -> None:
    sink = FakeSink(auto_ack=True)
    settings = ServeSettings(allowed_reply_topics=r"replies\.app-[0-9]+")
    records = [
        request(0, b"foreign", "billing.events"),
        request(1, b"allowed", "replies.app-7"),
        request(2, b"requests", "kbatch.requests"),  # never, whatever the pattern
        request(3, b"default", None),
    ]
    metrics = await run(settings, sink, records)
    assert sink.to("billing.events") == [] and sink.to("kbatch.requests") == []
    assert dead_letter_codes(sink) == {
        b"foreign": "reply_topic_not_allowed",
        b"requests": "reply_topic_not_allowed",
    }
    assert [r.key for r in sink.to("replies.app-7")] == [b"allowed"]
    assert [r.key for r in sink.sent if r.topic is None] == [b"default"]  # the reply topic
    counted = metrics.dead_letters.labels(ErrorCode.REPLY_TOPIC_NOT_ALLOWED.value)
    assert counted._value.get() == 2


async def test_a_reply_the_acls_refuse_is_dead_lettered_while_others_flow() -> None:
    sink = DenyingSink("replies.locked")
    settings = ServeSettings(allowed_reply_topics=r"replies\..*")
    records = [request(0, b"locked", "replies.locked"), request(1, b"open", "replies.open")]
    await run(settings, sink, records)
    assert sink.to("replies.locked") == []
    assert dead_letter_codes(sink) == {b"locked": "reply_topic_not_allowed"}
    message = dict(sink.to(DLQ)[0].headers)[H.ERROR_MESSAGE].decode()
    assert "replies.locked" in message and "denies" in message
    assert [r.key for r in sink.to("replies.open")] == [b"open"]


async def test_a_denied_dead_letter_topic_pauses_intake_and_loses_nothing() -> None:
    sink = DenyingSink(DLQ)
    records = [request(0, b"ok-0", None), request(1, b"foreign", "billing.events")]
    records.append(request(2, b"ok-2", None))
    pipeline, _, source = await run_pipeline(ServeSettings(), sink, records)
    assert pipeline.intake_blocked is not None and DLQ in pipeline.intake_blocked
    assert source.paused == {("kbatch.requests", 0)}  # intake stops
    pipeline._apply_flow()  # flow control never resumes it
    assert source.paused == {("kbatch.requests", 0)}
    assert [r.key for r in sink.sent if r.topic is None] == [b"ok-0", b"ok-2"]
    # Offset 1 is unfinished: the commit stops below it and it is read again after a restart.
    assert source.commits[-1] == {("kbatch.requests", 0): 1}


def bad_request(offset: int, key: bytes, value: bytes, reply_topic: str) -> InRecord:
    return InRecord(
        "kbatch.requests", 0, offset, key, value, ((H.REPLY_TOPIC, reply_topic.encode()),), 0
    )


BAD_VALUES = {
    b"v99": msgpack.packb({"v": 99, "text": "hi"}),  # unsupported_version
    b"no-text": msgpack.packb({"v": 1}),  # invalid_request
    b"not-msgpack": b"\xc1\xff\x00 not msgpack",  # invalid_request
}


async def test_a_record_that_fails_to_decode_gets_no_error_reply_in_a_topic_not_allowed() -> None:
    """The allow-list covers error replies too: a bad record naming another application's
    topic, or the request topic itself (its error reply would be read back as a request), is
    dead-lettered ``reply_topic_not_allowed`` naming its decode error, and its offset is
    finished; nothing is written to the topic it named."""
    sink = FakeSink(auto_ack=True)
    records = [
        bad_request(offset, key + b"@" + topic.encode(), value, topic)
        for offset, (topic, (key, value)) in enumerate(
            (topic, item)
            for topic in ("billing.events", "kbatch.requests")
            for item in BAD_VALUES.items()
        )
    ]
    _, metrics, source = await run_pipeline(ServeSettings(), sink, records)
    assert sink.to("billing.events") == [] and sink.to("kbatch.requests") == []
    assert [r.topic for r in sink.sent] == [DLQ] * 6  # only the dead letters
    assert set(dead_letter_codes(sink).values()) == {"reply_topic_not_allowed"}
    messages = {r.key: dict(r.headers)[H.ERROR_MESSAGE].decode() for r in sink.to(DLQ)}
    assert "unsupported_version" in messages[b"v99@billing.events"]
    assert "billing.events" in messages[b"no-text@billing.events"]
    assert "invalid_request" in messages[b"not-msgpack@kbatch.requests"]
    counted = metrics.dead_letters.labels(ErrorCode.REPLY_TOPIC_NOT_ALLOWED.value)
    assert counted._value.get() == 6
    assert source.commits[-1] == {("kbatch.requests", 0): 6}  # every offset finished


async def test_a_record_that_fails_to_decode_is_answered_on_an_allowed_topic() -> None:
    sink = FakeSink(auto_ack=True)
    settings = ServeSettings(allowed_reply_topics=r"replies\..*")
    records = [bad_request(0, b"v99", BAD_VALUES[b"v99"], "replies.app")]
    await run(settings, sink, records)
    assert dead_letter_codes(sink) == {b"v99": "unsupported_version"}
    (reply,) = sink.to("replies.app")
    assert dict(reply.headers)[H.STATUS] == b"error"
