"""The one delivery component (serve and backfill): finish on ack, dead letters, the cut-down
fallback, the owner's policy on a dead letter refused even cut, the send bound."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from consumer.finish.delivery import DEAD_LETTER_CUT_BYTES, Delivery
from consumer.kafka.errors import (
    DeliveryDeniedError,
    DeliveryError,
    DeliveryTopicMissingError,
    SinkClosedError,
)
from consumer.kafka.offset_metadata import decode_completed
from consumer.kafka.offsets import OffsetTracker
from consumer.kafka.records import InRecord
from consumer.replies.builder import ReplyBuilder
from schemas.errors import ErrorCode
from schemas.models import ModelInfo
from schemas.records import OutRecord
from tests.fakes import FakeSink

DLQ = "dead"


@dataclass(eq=False)
class Item:
    record: InRecord
    generation: int


@dataclass
class Owner:
    """Records every callback in order."""

    events: list[tuple[str, int, object]] = field(default_factory=list)
    delivered_calls: int = 0

    def on_delivered(self, delivered: Sequence[tuple[Item, OutRecord]]) -> None:
        self.delivered_calls += 1
        for pending, record in delivered:
            self.events.append(("delivered", pending.record.offset, record.topic))

    def on_dead_lettered(
        self, pending: Item, code: ErrorCode, sent: bool, reply_sent: bool
    ) -> None:
        self.events.append(("dead_lettered", pending.record.offset, (code, sent, reply_sent)))

    def on_finished(self, pending: Item, completed: bool) -> None:
        self.events.append(("finished", pending.record.offset, completed))


def make(sink: FakeSink, **kw: object) -> tuple[Delivery[Item], OffsetTracker, Owner, list[Item]]:
    tracker, owner = OffsetTracker(), Owner()
    tp = ("req", 0)
    tracker.assign(tp)
    items = []
    for offset in range(3):
        tracker.track(tp, offset)
        record = InRecord("req", 0, offset, b"k", b"v" * 100_000, (), 0)
        items.append(Item(record, tracker.generation(tp) or 0))
    delivery: Delivery[Item] = Delivery(
        sink,
        tracker,
        owner,
        ReplyBuilder(ModelInfo(name="m"), DLQ),
        **kw,  # type: ignore[arg-type]
    )
    return delivery, tracker, owner, items


def reply(n: int) -> OutRecord:
    return OutRecord(topic="out", partition=None, key=b"k", value=str(n).encode(), headers=())


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_batch_goes_in_one_send_and_each_record_finishes_on_its_own_ack() -> None:
    sink = FakeSink()
    delivery, tracker, owner, items = make(sink)
    delivery.send([(item, reply(i)) for i, item in enumerate(items)])
    await settle()
    assert sink.calls == 1 and len(sink.sent) == 3 and delivery.open == 3
    sink.acks[1].set_result(None)
    await settle()
    assert owner.events == [("delivered", 1, "out"), ("finished", 1, True)]
    # Offset 0 is still open: the commit stays at 0, carrying the finished 1 in its metadata.
    assert tracker.committable() == {("req", 0): 0}
    assert decode_completed(tracker.commit_metadata({("req", 0): 0})[("req", 0)].text) == (
        0,
        frozenset({1}),
    )
    sink.acks[0].set_result(None)
    sink.acks[2].set_exception(SinkClosedError("closed"))
    assert await delivery.wait(1.0) == 0
    assert owner.events[-1] == ("finished", 2, False)  # not finished: answered after a restart
    assert tracker.committable() == {("req", 0): 2}


@pytest.mark.parametrize("finish_unsent", [True, False])
async def test_a_refused_reply_is_dead_lettered_cut_and_the_owner_decides_on_a_refused_one(
    finish_unsent: bool, caplog: pytest.LogCaptureFixture
) -> None:
    sink = FakeSink()
    delivery, tracker, owner, items = make(
        sink, what="output record", finish_unsent_dead_letters=finish_unsent
    )
    delivery.send([(items[0], reply(0))])
    await settle()
    sink.acks[0].set_exception(DeliveryError("no such partition"))
    await settle()
    dlq = sink.sent[1]
    assert dlq.topic == DLQ and b"the output record could not be delivered" in (
        dlq.value or b""
    ) + b"".join(v for _, v in dlq.headers)
    sink.acks[1].set_exception(DeliveryError("too large"))
    await settle()
    cut = sink.sent[2]
    assert cut.topic == DLQ and len(cut.value or b"") <= DEAD_LETTER_CUT_BYTES
    sink.acks[2].set_exception(DeliveryError("refused again"))
    assert await delivery.wait(1.0) == 0
    assert owner.events[0] == ("dead_lettered", 0, (ErrorCode.INVALID_REQUEST, False, False))
    assert owner.events[1] == ("finished", 0, finish_unsent)
    assert (tracker.committable() == {("req", 0): 1}) is finish_unsent
    (error,) = [r for r in caplog.records if r.levelname == "ERROR"]  # no traceback
    assert error.exc_info is None and error.getMessage().endswith("skipped (refused again)")


@pytest.mark.parametrize(
    ("error", "remedy"),
    [
        (DeliveryTopicMissingError("topic dead does not exist"), "create it"),
        (DeliveryDeniedError("the broker denies writing to dead"), "grant WRITE on it"),
    ],
)
async def test_a_dead_letter_topic_that_is_gone_or_denied_keeps_the_record_unfinished(
    error: DeliveryError, remedy: str
) -> None:
    """Regression: the dead-letter topic deleted while serve ran: the next bad
    record's dead letter was refused (and sent again cut, in vain), skipped and its offset
    committed: lost. A missing topic is now treated as a denied one: the owner is told (serve
    pauses intake), the record stays unfinished, nothing is cut."""
    sink = FakeSink()
    reasons: list[str] = []
    delivery, tracker, owner, items = make(sink, on_dead_letters_denied=reasons.append)
    delivery.send([(items[0], reply(0))])
    await settle()
    sink.acks[0].set_exception(DeliveryError("no such partition"))  # the reply: dead-letter it
    await settle()
    sink.acks[1].set_exception(error)  # the dead letter
    assert await delivery.wait(1.0) == 0
    assert len(sink.sent) == 2  # no cut-down copy
    (reason,) = reasons
    assert reason.startswith("the dead-letter topic dead refused") and reason.endswith(remedy)
    assert owner.events == [("finished", 0, False)]
    assert tracker.committable() == {}


async def test_max_in_flight_bounds_the_records_waiting_for_the_broker() -> None:
    sink = FakeSink()
    delivery, _, owner, items = make(sink, max_in_flight=2)
    delivery.send([(item, reply(i)) for i, item in enumerate(items)])
    await settle()
    assert len(sink.sent) == 2  # the third waits for a slot
    sink.acks[0].set_result(None)
    await settle()
    assert len(sink.sent) == 3
    for ack in sink.acks[1:]:
        ack.set_result(None)
    assert await delivery.wait(1.0) == 0
    assert [e for e in owner.events if e[0] == "finished"] == [
        ("finished", 0, True),
        ("finished", 1, True),
        ("finished", 2, True),
    ]


class SharingSink(FakeSink):
    """A sink whose records of one call share one ack future (as ``KafkaSink.send`` gives the
    records of one producer batch)."""

    async def send(self, records: Sequence[OutRecord]) -> list[asyncio.Future[None]]:
        self.calls += 1
        ack: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.sent.extend(records)
        self.acks.append(ack)
        return [ack] * len(records)


async def test_records_that_share_an_ack_are_finished_together_each_once() -> None:
    sink = SharingSink()
    delivery, tracker, owner, items = make(sink)
    delivery.send([(item, reply(i)) for i, item in enumerate(items)])
    await settle()
    assert len(sink.acks) == 1 and not owner.events
    sink.acks[0].set_result(None)
    await settle()
    # One owner call for the three (its per-batch metrics), then each finished once.
    assert owner.delivered_calls == 1
    assert owner.events == [("delivered", i, "out") for i in range(3)] + [
        ("finished", i, True) for i in range(3)
    ]
    assert tracker.committable() == {("req", 0): 3} and delivery.open == 0


async def test_a_shared_ack_that_fails_dead_letters_each_of_its_records() -> None:
    sink = SharingSink()
    delivery, _tracker, owner, items = make(sink)
    delivery.send([(item, reply(i)) for i, item in enumerate(items[:2])])
    await settle()
    sink.acks[0].set_exception(DeliveryError("no such topic"))
    await settle()
    for ack in sink.acks[1:]:  # the two dead letters, one send each
        ack.set_result(None)
    await settle()
    assert [len(r.value or b"") > 0 for r in sink.to(DLQ)] == [True, True]
    code = (ErrorCode.INVALID_REQUEST, True, False)
    assert sorted(e for e in owner.events if e[0] == "dead_lettered") == [
        ("dead_lettered", 0, code),
        ("dead_lettered", 1, code),
    ]
    assert delivery.open == 0
