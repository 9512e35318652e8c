"""The pipeline's decisions with fakes for Kafka and the engine: no broker, no model, fake clock.

The fakes record what the pipeline asks for; the sink's acknowledgements are futures the test
resolves in any order, so out-of-order completion and commit safety can be driven exactly.
"""

from __future__ import annotations

import asyncio
import dataclasses

import msgpack
import pytest

from consumer.batching.types import InferenceItem, ItemOutcome
from consumer.config import ServeSettings
from consumer.deadline import Deadline
from consumer.finish.delivery import DEAD_LETTER_CUT_BYTES
from consumer.kafka.offset_metadata import decode_completed, encode_completed
from consumer.kafka.records import InRecord, TopicPartition
from consumer.kafka.sink import DeliveryError
from consumer.replies.builder import ReplyBuilder
from consumer.serve.metrics import Metrics
from consumer.serve.pipeline import FIRST_POLL_RECORDS, Pipeline
from schemas import headers as H
from schemas.codec import Encoding, decode_reply
from schemas.errors import ErrorCode
from schemas.models import ModelInfo, Reply
from tests.fakes import FakeEngine, FakeSink, FakeSource

TP: TopicPartition = ("req", 0)


def record(offset: int, key: bytes | None = b"k", value: bytes | None = None) -> InRecord:
    """A request at ``offset``; its text names the offset (copies of a key: :func:`copy`)."""
    body = value if value is not None else msgpack.packb({"text": f"text {offset}"})
    return InRecord("req", 0, offset, key, body, (), 0)


def copy(offset: int, key: bytes, text: str = "the same text") -> InRecord:
    """A request of ``key`` with ``text``: copies of one request share key and text."""
    return record(offset, key, msgpack.packb({"text": text}))


def ok(item: InferenceItem) -> ItemOutcome:
    return ItemOutcome(
        item_id=item.item_id,
        status="ok",
        result={"embedding": [1.0, 0.0], "dim": 2},
        error_code=None,
        error_message=None,
        truncated=False,
        n_tokens=4,
        queue_ms=1.0,
        infer_ms=2.0,
        batch_size=1,
        padded_len=4,
    )


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def assigned_pipeline(
    settings: ServeSettings, engine: FakeEngine
) -> tuple[Pipeline, FakeSource, FakeSink]:
    """A pipeline on fakes and a fixed clock, bound to ``engine``, assigned ``TP``."""
    sink = FakeSink()
    source = FakeSource()
    pipeline = Pipeline(
        settings,
        sink,
        ReplyBuilder(ModelInfo(name="fake"), settings.dlq_topic),
        Metrics(),
        source=lambda _: source,
        engine=engine,
        clock=lambda: 100.0,
        wall_clock_ms=lambda: 1_000_000,
    )
    await pipeline.on_assigned(frozenset({TP}))
    return pipeline, source, sink


@pytest.fixture
async def parts() -> tuple[Pipeline, FakeSource, FakeSink, FakeEngine]:
    settings = ServeSettings(max_partition_records=3, max_total_records=100)
    engine = FakeEngine()
    pipeline, source, sink = await assigned_pipeline(settings, engine)
    return pipeline, source, sink, engine


async def test_commit_waits_for_the_lowest_unanswered_offset(
    parts: tuple[Pipeline, FakeSource, FakeSink, FakeEngine],
) -> None:
    pipeline, source, sink, engine = parts
    await pipeline.take([record(10, b"a"), record(11, b"b"), record(12, b"c")])
    for item in reversed(engine.items):  # the engine answers out of order
        pipeline.on_outcomes([ok(item)])
    await settle()
    assert len(sink.sent) == 3
    sink.acks[0].set_result(None)  # offset 12 acknowledged first
    await settle()
    await pipeline.commit()
    # 10 and 11 still unanswered: the offset stays at 10, 12 travels in its metadata
    assert source.commits == [{TP: 10}]
    assert decode_completed(source.metadata[-1][TP]) == (10, frozenset({12}))
    sink.acks[2].set_result(None)  # offset 10
    await settle()
    await pipeline.commit()
    assert source.commits[-1] == {TP: 11}
    assert decode_completed(source.metadata[-1][TP]) == (11, frozenset({12}))
    sink.acks[1].set_result(None)  # offset 11
    await settle()
    await pipeline.commit()
    assert source.commits[-1] == {TP: 13}
    assert source.metadata[-1] == {TP: ""}  # nothing finished above 13


async def test_offsets_answered_before_a_crash_are_skipped_on_assignment(
    parts: tuple[Pipeline, FakeSource, FakeSink, FakeEngine],
) -> None:
    pipeline, source, sink, engine = parts
    await pipeline.on_revoked(frozenset({TP}))
    # The previous owner committed 10 and had answered 11 and 13 above it.
    source.stored[TP] = (10, encode_completed(10, [11, 13]).text)
    await pipeline.on_assigned(frozenset({TP}))
    keys = [b"a", b"b", b"c", b"d"]
    await pipeline.take([record(10 + i, k) for i, k in enumerate(keys)])
    assert [i.text for i in engine.items] == ["text 10", "text 12"]  # not 11 and 13
    assert pipeline._metrics.skipped_completed._value.get() == 2
    for item in engine.items:
        pipeline.on_outcomes([ok(item)])
    await settle()
    assert len(sink.sent) == 2  # no reply again for 11 and 13
    for ack in sink.acks:
        ack.set_result(None)
    await settle()
    await pipeline.commit()
    assert source.commits[-1] == {TP: 14}


@pytest.mark.parametrize("metadata", ["not ours", "kb1:@@@", "kb9:AAA"])
async def test_foreign_commit_metadata_is_ignored_and_everything_computed(
    parts: tuple[Pipeline, FakeSource, FakeSink, FakeEngine], metadata: str
) -> None:
    pipeline, source, _, engine = parts
    await pipeline.on_revoked(frozenset({TP}))
    source.stored[TP] = (10, metadata)
    await pipeline.on_assigned(frozenset({TP}))
    await pipeline.take([record(10, b"a"), record(11, b"b")])
    assert len(engine.items) == 2
    assert pipeline._metrics.skipped_completed._value.get() == 0


async def test_a_copy_in_flight_waits_and_is_answered_as_dedup(
    parts: tuple[Pipeline, FakeSource, FakeSink, FakeEngine],
) -> None:
    pipeline, _, sink, engine = parts
    await pipeline.take([copy(0, b"same"), copy(1, b"same")])
    assert len(engine.items) == 1  # computed once
    pipeline.on_outcomes([ok(engine.items[0])])
    await settle()
    replies = [decode_reply(r.value or b"", Encoding.MSGPACK) for r in sink.sent]
    assert sorted(r.dedup for r in replies) == [False, True]
    assert all(r.result == replies[0].result for r in replies)


def answers(sink: FakeSink) -> dict[int, Reply]:
    """The replies sent so far by their request's offset (the fakes' correlation: meta)."""
    got = [decode_reply(r.value or b"", Encoding.MSGPACK) for r in sink.sent]
    return {int(r.meta["offset"]): r for r in got if r.meta is not None}


def numbered(offset: int, key: bytes, text: str) -> InRecord:
    return record(offset, key, msgpack.packb({"text": text, "meta": {"offset": offset}}))


def assert_key_reused(reply: Reply) -> None:
    assert reply.status == "error" and reply.result is None and not reply.dedup
    assert reply.error is not None and reply.error.code is ErrorCode.IDEMPOTENCY_KEY_REUSED
    assert "another input" in reply.error.message and "cats" not in reply.error.message


async def test_a_reused_key_with_another_text_is_refused_in_flight_and_after_the_answer(
    parts: tuple[Pipeline, FakeSource, FakeSink, FakeEngine],
) -> None:
    # Contract 1.4: the other text gets idempotency_key_reused, not the first text's vector;
    # true copies still share the computation; the partition moves on (no dead letter).
    pipeline, source, sink, engine = parts
    cats, market = "cats are great", "the stock market crashed"
    await pipeline.take([numbered(0, b"same-1", cats), numbered(1, b"same-1", market)])
    await pipeline.take([numbered(2, b"same-1", cats)])  # a true copy, in flight
    await settle()
    assert [i.text for i in engine.items] == [cats]
    assert_key_reused(answers(sink)[1])  # answered at once, while the first computes
    pipeline.on_outcomes([ok(engine.items[0])])
    await settle()
    await pipeline.take([numbered(3, b"same-1", market), numbered(4, b"same-1", cats)])
    await settle()
    assert len(engine.items) == 1
    got = answers(sink)
    assert_key_reused(got[3])  # after the answer, within the window
    assert [(got[i].status, got[i].dedup) for i in (0, 2, 4)] == [
        ("ok", False), ("ok", True), ("ok", True)
    ]  # fmt: skip
    assert all(r.topic != "kbatch.requests.dlq" for r in sink.sent)  # no dead letter
    assert pipeline._metrics.key_reused._value.get() == 2
    assert pipeline._metrics.dedup_hits._value.get() == 2
    for ack in sink.acks:
        ack.set_result(None)
    await settle()
    await pipeline.commit()
    assert source.commits[-1] == {TP: 5}


async def test_a_reused_key_after_the_dedup_window_is_computed_afresh() -> None:
    settings = ServeSettings(dedup_ttl_s=10.0)
    engine = FakeEngine()
    pipeline, _, sink = await assigned_pipeline(settings, engine)
    now = [100.0]
    pipeline._clock = lambda: now[0]
    await pipeline.take([numbered(0, b"k", "first text")])
    pipeline.on_outcomes([ok(engine.items[0])])
    now[0] = 110.0  # the answer is 10 s old: out of the window
    await pipeline.take([numbered(1, b"k", "second text")])
    await settle()
    assert [i.text for i in engine.items] == ["first text", "second text"]
    pipeline.on_outcomes([ok(engine.items[1])])
    await settle()
    assert [(r.status, r.dedup) for r in answers(sink).values()] == [("ok", False)] * 2


async def test_a_bad_record_is_dead_lettered_and_answered_without_blocking(
    parts: tuple[Pipeline, FakeSource, FakeSink, FakeEngine],
) -> None:
    pipeline, source, sink, engine = parts
    await pipeline.take([record(0, b"bad", b"\xc1"), record(1, b"good")])
    await settle()
    assert [i.text for i in engine.items] == ["text 1"]
    dlq = [r for r in sink.sent if r.topic == "kbatch.requests.dlq"]
    assert len(dlq) == 1 and dlq[0].value == b"\xc1"
    sink.acks[0].set_result(None)  # the dead letter
    await settle()
    sink.acks[1].set_result(None)  # its error reply
    pipeline.on_outcomes([ok(engine.items[0])])
    await settle()
    sink.acks[2].set_result(None)  # the good reply
    await settle()
    await pipeline.commit()
    assert source.commits[-1] == {TP: 2}


@pytest.mark.parametrize("cut_also_refused", [False, True])
async def test_a_dead_letter_too_large_to_produce_is_cut_and_never_blocks(
    parts: tuple[Pipeline, FakeSource, FakeSink, FakeEngine], cut_also_refused: bool
) -> None:
    # Found by a black-box run: a 2 MiB request the broker took gzip-compressed; its dead
    # letter was over the producer's request size, was never completed, and held up the
    # partition's commits (and was refused again after every restart).
    pipeline, source, sink, _ = parts
    big = msgpack.packb({"text": "a" * (2 << 20)})
    await pipeline.take([record(0, b"big", big)])
    await settle()
    sink.acks[0].set_exception(DeliveryError("MessageSizeTooLargeError"))
    await settle()
    cut = sink.sent[1]
    assert cut.topic == "kbatch.requests.dlq" and cut.key == b"big"
    assert cut.value == big[:DEAD_LETTER_CUT_BYTES]
    assert dict(cut.headers)[H.ORIGINAL_VALUE_BYTES] == str(len(big)).encode()
    assert dict(cut.headers)[H.ERROR_CODE] == b"invalid_request"
    if cut_also_refused:
        sink.acks[1].set_exception(DeliveryError("refused again"))
    else:
        sink.acks[1].set_result(None)
    await settle()
    reply = sink.sent[2]  # the client still gets its error reply
    assert reply.key == b"big" and decode_reply(reply.value or b"", Encoding.MSGPACK).status == (
        "error"
    )
    sink.acks[2].set_result(None)
    await settle()
    await pipeline.commit()
    assert source.commits[-1] == {TP: 1}  # completed: the partition moves on


async def test_backpressure_pauses_at_the_limit_and_resumes_below_it(
    parts: tuple[Pipeline, FakeSource, FakeSink, FakeEngine],
) -> None:
    pipeline, source, sink, engine = parts
    await pipeline.take([record(i, f"k{i}".encode()) for i in range(3)])
    pipeline._apply_flow()
    assert source.paused == {TP}
    for item in engine.items:
        pipeline.on_outcomes([ok(item)])
    await settle()
    for ack in sink.acks:
        ack.set_result(None)
    await settle()
    pipeline._apply_flow()
    assert source.paused == set()


async def test_a_revoke_commits_what_is_finished_at_once_and_waits_for_no_model_work(
    parts: tuple[Pipeline, FakeSource, FakeSink, FakeEngine],
) -> None:
    # Regression: the revoke finished every running batch first (up to 80 % of the rebalance
    # timeout), and the whole group waited for it.
    pipeline, source, sink, engine = parts
    await pipeline.take([record(0, b"a"), record(1, b"b"), record(2, b"c")])
    pipeline.on_outcomes([ok(engine.items[1])])  # offset 1 answered; 0 and 2 still computing
    await settle()
    sink.acks[0].set_result(None)
    await settle()
    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.wait_for(pipeline.on_revoked(frozenset({TP})), 5)
    assert loop.time() - started < 0.5  # nothing waited for the engine
    assert source.commits == [{TP: 0}]  # 1 travels in the metadata: the next owner skips it
    assert decode_completed(source.metadata[-1][TP]) == (0, frozenset({1}))
    assert engine.cancelled == []  # the new assignment decides (below)
    assert pipeline.tracker.assigned == frozenset()


async def test_a_partition_given_back_keeps_its_work_and_recomputes_nothing(
    parts: tuple[Pipeline, FakeSource, FakeSink, FakeEngine],
) -> None:
    pipeline, source, sink, engine = parts
    await pipeline.take([record(0, b"a"), record(1, b"b")])
    await pipeline.on_revoked(frozenset({TP}))
    pipeline.on_outcomes([ok(engine.items[0])])  # answered between the revoke and the join
    await settle()
    assert sink.sent == []  # held: the partition may have moved
    source.generation += 1  # the same member, the next generation: no break
    await pipeline.on_assigned(frozenset({TP}))
    await settle()
    assert engine.cancelled == []
    assert len(engine.items) == 2  # nothing submitted again
    assert source.positions[TP] == 2  # reads on after what it took, not from the commit
    assert len(sink.sent) == 1  # the held reply went out
    pipeline.on_outcomes([ok(engine.items[1])])
    await settle()
    for ack in sink.acks:
        ack.set_result(None)
    await settle()
    await pipeline.commit()
    assert source.commits[-1] == {TP: 2}
    await pipeline.take([record(0, b"a"), record(1, b"b")])  # a re-delivery is not taken
    assert len(engine.items) == 2


async def test_a_partition_that_moved_has_its_work_cancelled_and_its_replies_dropped(
    parts: tuple[Pipeline, FakeSource, FakeSink, FakeEngine],
) -> None:
    pipeline, source, sink, engine = parts
    other: TopicPartition = ("req", 1)
    await pipeline.take([record(0, b"x"), record(1, b"y")])
    await pipeline.on_revoked(frozenset({TP}))
    pipeline.on_outcomes([ok(engine.items[0])])  # answered while the assignment is unknown
    await settle()
    source.generation += 1
    await pipeline.on_assigned(frozenset({other}))  # TP went to another member
    assert engine.cancelled == [TP]  # its queued work is dropped
    pipeline.on_outcomes([ok(engine.items[1])])  # a late result of the moved partition
    await settle()
    assert sink.sent == []  # neither the held reply nor the late one: the next owner answers
    assert source.commits == []
    assert pipeline.tracker.assigned == frozenset({other})
    assert pipeline.flow.total_records == 0


async def test_an_incremental_revoke_commits_then_leaves_the_partition_at_once(
    parts: tuple[Pipeline, FakeSource, FakeSink, FakeEngine],
) -> None:
    # The consumer protocol (KIP-848) revokes only partitions that move: nothing comes back,
    # so the work is dropped at the revoke, not kept for an assignment that never names it.
    pipeline, source, sink, engine = parts
    source.incremental = True
    await pipeline.take([record(0, b"a"), record(1, b"b")])
    pipeline.on_outcomes([ok(engine.items[0])])
    await settle()
    sink.acks[0].set_result(None)
    await settle()
    await pipeline.on_revoked(frozenset({TP}))
    assert source.commits[-1] == {TP: 1}  # what was finished is committed first
    assert engine.cancelled == [TP]  # offset 1's queued work is dropped now
    assert pipeline.tracker.assigned == frozenset()
    assert pipeline.tracker.suspended == frozenset()
    assert pipeline.flow.total_records == 0
    pipeline.on_outcomes([ok(engine.items[1])])  # a late result: the next owner answers it
    await settle()
    assert len(sink.sent) == 1


async def test_an_incremental_assignment_sets_up_only_the_partitions_added(
    parts: tuple[Pipeline, FakeSource, FakeSink, FakeEngine],
) -> None:
    pipeline, source, sink, engine = parts
    source.incremental = True
    other: TopicPartition = ("req", 1)
    await pipeline.take([record(0, b"a")])
    source.stored[other] = (7, "")
    await pipeline.on_assigned(frozenset({other}))  # TP is not named: it stays as it was
    assert pipeline.tracker.assigned == frozenset({TP, other})
    assert engine.cancelled == []
    assert TP not in source.positions  # never rewound
    assert source.paused == set()  # paused while set up, then resumed
    pipeline.on_outcomes([ok(engine.items[0])])
    await settle()
    assert len(sink.sent) == 1  # TP's work went on


async def test_a_member_dropped_from_the_group_meanwhile_starts_over_from_the_commit(
    parts: tuple[Pipeline, FakeSource, FakeSink, FakeEngine],
) -> None:
    # Another member may have owned TP in between (a join round completed without this one):
    # its work is dropped and TP read again from the group's committed offset.
    pipeline, source, sink, engine = parts
    await pipeline.take([record(0, b"x")])
    await pipeline.on_revoked(frozenset({TP}))
    source.generation += 2
    source.stored[TP] = (1, "")  # the other member answered offset 0 and committed
    await pipeline.on_assigned(frozenset({TP}))
    assert engine.cancelled == [TP]
    pipeline.on_outcomes([ok(engine.items[0])])
    await settle()
    assert sink.sent == []
    await pipeline.take([record(1, b"z")])  # the client reads from the commit, 1, anew
    assert [i.text for i in engine.items] == ["text 0", "text 1"]
    assert pipeline.tracker.generation(TP) is not None


async def test_a_batchs_outcomes_go_out_in_one_send(
    parts: tuple[Pipeline, FakeSource, FakeSink, FakeEngine],
) -> None:
    pipeline, source, sink, engine = parts
    await pipeline.take([record(i, f"k{i}".encode()) for i in range(3)])
    for item in engine.items:  # one batch: its outcomes arrive in one loop iteration
        pipeline.on_outcomes([ok(item)])
    assert sink.sent == []  # built and sent after the engine's turn, not inside the callback
    await settle()
    assert sink.calls == 1 and len(sink.sent) == 3
    for ack in sink.acks:
        ack.set_result(None)
    await settle()
    await pipeline.commit()
    assert source.commits[-1] == {TP: 3}


async def test_a_result_the_contract_cannot_carry_is_answered_inference_failed(
    parts: tuple[Pipeline, FakeSource, FakeSink, FakeEngine],
) -> None:
    pipeline, source, sink, engine = parts
    await pipeline.take([record(0, b"nan")])
    nan = {"embedding": [float("nan"), 0.0], "dim": 2}
    pipeline.on_outcomes([dataclasses.replace(ok(engine.items[0]), result=nan)])
    await settle()
    (reply,) = [decode_reply(r.value or b"", Encoding.MSGPACK) for r in sink.sent]
    assert reply.status == "error" and reply.error is not None
    assert reply.error.code is ErrorCode.INFERENCE_FAILED
    sink.acks[0].set_result(None)
    await settle()
    await pipeline.commit()
    assert source.commits[-1] == {TP: 1}  # answered, so the offset moves on


def expired(item: InferenceItem) -> ItemOutcome:
    return dataclasses.replace(
        ok(item),
        status="expired",
        result=None,
        error_code=ErrorCode.DEADLINE_EXCEEDED,
        error_message="the request's deadline passed before compute",
    )


def with_deadline(offset: int, key: bytes, deadline_ms: int) -> InRecord:
    """A copy of ``key`` (its text is the key's) with a deadline of its own."""
    body = msgpack.packb({"text": f"text of {key!r}", "deadline_ms": deadline_ms})
    return record(offset, key, body)


async def test_a_retry_with_a_later_deadline_is_computed_not_answered_expired(
    parts: tuple[Pipeline, FakeSource, FakeSink, FakeEngine],
) -> None:
    # Regression: the retry (same key, 60 s deadline) waited for the first copy (1 s
    # deadline) and inherited its ``expired`` with dedup: true.
    pipeline, source, sink, engine = parts
    now_ms = 1_000_000  # the fixture's wall clock
    await pipeline.take(
        [
            with_deadline(0, b"same", now_ms + 1_000),
            with_deadline(1, b"same", now_ms + 60_000),
            with_deadline(2, b"same", now_ms + 50_000),
        ]
    )
    assert len(engine.items) == 1  # the copies wait for the first
    pipeline.on_outcomes([expired(engine.items[0])])
    await settle()
    assert len(engine.items) == 2  # the first copy still in time is computed
    assert engine.items[1].deadline_s is not None
    replies = [decode_reply(r.value or b"", Encoding.MSGPACK) for r in sink.sent]
    assert [(r.status, r.dedup) for r in replies] == [("expired", False)]  # the first only
    pipeline.on_outcomes([ok(engine.items[1])])
    await settle()
    replies = [decode_reply(r.value or b"", Encoding.MSGPACK) for r in sink.sent]
    assert sorted((r.status, r.dedup) for r in replies[1:]) == [("ok", False), ("ok", True)]
    for ack in sink.acks:
        ack.set_result(None)
    await settle()
    await pipeline.commit()
    assert source.commits[-1] == {TP: 3}


async def test_a_waiting_copy_past_its_own_deadline_is_answered_expired(
    parts: tuple[Pipeline, FakeSource, FakeSink, FakeEngine],
) -> None:
    pipeline, _, sink, engine = parts
    now_ms = 1_000_000
    await pipeline.take(
        [with_deadline(0, b"k", now_ms + 1_000), with_deadline(1, b"k", now_ms + 5)]
    )
    pipeline._wall_ms = lambda: now_ms + 2_000  # both deadlines have passed
    pipeline.on_outcomes([expired(engine.items[0])])
    await settle()
    assert len(engine.items) == 1  # nothing recomputed
    replies = [decode_reply(r.value or b"", Encoding.MSGPACK) for r in sink.sent]
    assert [r.status for r in replies] == ["expired", "expired"]


class HungFlushEngine(FakeEngine):
    """A flush that forms batches only as fast as a model that never finishes: it never
    returns (the old ``finish`` waited for it without limit)."""

    async def flush(self) -> None:
        await asyncio.Event().wait()


async def test_drain_stops_at_its_deadline_drops_the_rest_and_commits_what_was_answered() -> None:
    # Regression: ``finish`` first waited, without limit, for every queued item to be formed
    # into a batch; a 5 s drain with ~1,450 buffered ran 29.9 s and exited 0.
    engine = HungFlushEngine()
    pipeline, source, sink = await assigned_pipeline(ServeSettings(), engine)
    await pipeline.take([record(i, f"k{i}".encode()) for i in range(4)])
    pipeline.on_outcomes([ok(engine.items[0])])  # offset 0 answered
    await settle()
    sink.acks[0].set_result(None)
    await settle()
    loop = asyncio.get_running_loop()
    started = loop.time()
    drained = await asyncio.wait_for(pipeline.finish(None, Deadline.after(0.5, loop.time)), 5)
    assert not drained
    assert loop.time() - started < 1.0  # the one deadline bounds flush, wait and commit
    assert engine.cancelled == [TP]  # what is queued is dropped, never formed into a batch
    assert source.commits == [{TP: 1}]  # the answered offset, not the dropped ones
    pipeline.on_outcomes([ok(engine.items[1])])  # a batch running at the deadline ends
    await settle()
    assert len(sink.sent) == 1  # forgotten: its record is answered by the next owner


async def test_lag_counts_every_assigned_partition_from_the_log_end(
    parts: tuple[Pipeline, FakeSource, FakeSink, FakeEngine],
) -> None:
    # Regression: a partition without a commit had no series; a paused one was frozen.
    pipeline, source, _, _ = parts
    other: TopicPartition = ("req", 1)
    await pipeline.on_assigned(frozenset({other}))
    await pipeline.take([record(i, f"k{i}".encode()) for i in range(5, 8)])  # never committed
    source.ends = {TP: 50, other: 30}
    source.positions = {other: 12}  # nothing taken from it yet: it starts reading at 12
    await pipeline.refresh_lag()
    lag = pipeline._metrics.lag
    assert lag.labels("req", "0")._value.get() == 50 - 5
    assert lag.labels("req", "1")._value.get() == 30 - 12
    value = pipeline._metrics.registry.get_sample_value
    seconds = {"topic": "req", "partition": "0"}
    assert value("kbatch_partition_lag_seconds", seconds) == 86_400  # nothing answered yet
    assert value("kbatch_lag_seconds") == 86_400
    source.ends = {TP: 90, other: 30}  # the log grows while the partition is paused
    await pipeline.refresh_lag()
    assert lag.labels("req", "0")._value.get() == 90 - 5
    await pipeline.on_revoked(frozenset({TP, other}))
    source.generation += 1
    await pipeline.on_assigned(frozenset({TP}))  # TP given back, ``other`` moved
    samples = {s.labels["partition"] for m in lag.collect() for s in m.samples}
    assert samples == {"0"}  # the revoked partition's series is gone
    assert value("kbatch_partition_lag_seconds", {"topic": "req", "partition": "1"}) is None


class BacklogSource(FakeSource):
    """Serves ``backlog`` records in the chunks asked for, then idles; stops the run after
    ``polls`` polls; keeps every ``max_records`` asked for."""

    def __init__(self, backlog: int, polls: int, stop: asyncio.Event) -> None:
        super().__init__()
        self.backlog, self.polls, self.stop = backlog, polls, stop
        self.asked: list[int] = []
        self.offset = 0

    async def poll(self, max_records: int, timeout_ms: int) -> list[InRecord]:
        self.asked.append(max_records)
        if len(self.asked) == self.polls:
            self.stop.set()
        n = min(max_records, self.backlog)
        self.backlog -= n
        out = [record(self.offset + i, key=b"k%d" % (self.offset + i)) for i in range(n)]
        self.offset += n
        return out


async def test_polls_start_small_and_double_while_a_backlog_keeps_them_full() -> None:
    settings = ServeSettings(
        poll_max_records=500, max_total_records=100_000, max_partition_records=100_000
    )
    stop = asyncio.Event()
    source = BacklogSource(backlog=FIRST_POLL_RECORDS * 15, polls=8, stop=stop)
    pipeline = Pipeline(
        settings,
        FakeSink(),
        ReplyBuilder(ModelInfo(name="fake"), settings.dlq_topic),
        Metrics(),
        source=lambda _: source,
        engine=FakeEngine(),
        clock=lambda: 100.0,
        wall_clock_ms=lambda: 1_000_000,
    )
    await pipeline.on_assigned(frozenset({TP}))
    await pipeline.run(stop)
    first = FIRST_POLL_RECORDS
    # 64 + 128 + 256 + 500 of 960; the last 12; an empty poll starts over at 64
    assert source.asked == [first, 2 * first, 4 * first, 500, 500, 500, first, first]
