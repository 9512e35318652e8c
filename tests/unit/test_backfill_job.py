"""The backfill loop against in-memory fakes of the source, the sink and the engine: what is
written, dead-lettered and committed, and when a job counts as complete."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import pytest

from consumer.backfill.config import BackfillSettings
from consumer.backfill.job import BackfillJob
from consumer.batching.types import InferenceItem
from consumer.kafka.offset_metadata import decode_completed
from consumer.kafka.ranges import plan_partition
from consumer.kafka.records import InRecord
from consumer.replies.builder import ReplyBuilder
from schemas.codec import Encoding, decode_reply
from schemas.models import ModelInfo
from tests.fakes import AnsweringEngine as FakeEngine
from tests.fakes import FakeRangeSource as FakeSource
from tests.fakes import FakeSink

TOPIC = "events"


def _record(partition: int, offset: int, value: bytes | None, key: bytes | None = None) -> InRecord:
    return InRecord(
        topic=TOPIC, partition=partition, offset=offset, key=key or f"k{offset}".encode(),
        value=value, headers=(("app", b"1"),), timestamp_ms=0,
    )  # fmt: skip


def _sink(refuse: frozenset[str] = frozenset()) -> FakeSink:
    """Acknowledges every send, except topics in ``refuse`` (DeliveryError)."""
    return FakeSink(auto_ack=True, refuse=refuse)


def _settings(**kw: Any) -> BackfillSettings:
    return BackfillSettings(
        source_topic=TOPIC, output_topic="scores", dlq_topic="dead", commit_interval_ms=10, **kw
    )


def _job(source: FakeSource, sink: FakeSink, **kw: Any) -> tuple[BackfillJob, FakeEngine]:
    engine = FakeEngine()
    job = BackfillJob(
        _settings(**kw), source, sink, ReplyBuilder(ModelInfo(name="m"), "dead"), engine=engine
    )
    return job, engine


def _json_event(text: str) -> bytes:
    return json.dumps({"body": {"text": text}}).encode()


async def test_scores_every_record_and_commits_each_end() -> None:
    records = {
        0: [_record(0, o, _json_event(f"t{o}")) for o in range(7)],
        1: [_record(1, o, _json_event(f"u{o}")) for o in range(4)],
    }
    source = FakeSource(records, ends={0: 7, 1: 4})
    sink = _sink()
    job, engine = _job(source, sink, text_field="body.text")
    summary = await job.run(asyncio.Event())

    assert summary.complete and not summary.stopped
    assert (summary.records_read, summary.ok, summary.dead_lettered) == (11, 11, 0)
    assert [it.text for it in engine.submitted if it.group == (TOPIC, 1)] == [
        f"u{o}" for o in range(4)
    ]
    out = sink.to("scores")
    assert len(out) == 11
    by_source = {(dict(r.headers)["kbatch.source.partition"], r.key): r for r in out}
    first = by_source[(b"0", b"k0")]
    assert dict(first.headers)["kbatch.source.offset"] == b"0"
    assert dict(first.headers)["content-type"] == b"application/json"  # JSON in, JSON out
    assert dict(first.headers)["kbatch-status"] == b"ok"
    assert first.value is not None
    reply = decode_reply(first.value, Encoding.JSON)
    assert reply.status == "ok" and reply.model.name == "m"
    assert source.last_committed() == {0: 7, 1: 4}
    assert [p.reached_end for p in summary.partitions] == [True, True]


async def test_settings_that_do_not_fit_the_topic_are_told_once_on_the_terminal(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Without --text-field: the first dead letter's reason (a msgpack request map) and the
    first JSON object scored as text are each one WARNING, not one per record."""
    import msgpack

    values = [msgpack.packb({"v": 1, "text": "cats"})] * 3 + [_json_event("x")] * 3
    source = FakeSource({0: [_record(0, o, v) for o, v in enumerate(values)]}, ends={0: 6})
    job, _ = _job(source, _sink())
    with caplog.at_level("WARNING", "kbatch.backfill"):
        summary = await job.run(asyncio.Event())
    assert (summary.ok, summary.dead_lettered) == (3, 3)
    lines = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    dead = [line for line in lines if "dead-lettered" in line]
    whole = [line for line in lines if "looks like a JSON object" in line]
    assert len(dead) == 1 and "@0 dead-lettered" in dead[0]
    assert "--text-field names the text, e.g. --text-field text" in dead[0]
    assert len(whole) == 1 and "@3 looks like a JSON object" in whole[0]


async def test_raw_text_values_are_scored_whole_and_written_as_msgpack() -> None:
    source = FakeSource({0: [_record(0, 0, b"plain text")]}, ends={0: 1})
    sink = _sink()
    job, engine = _job(source, sink)
    summary = await job.run(asyncio.Event())
    assert summary.complete
    assert engine.submitted[0].text == "plain text"
    (out,) = sink.to("scores")
    assert dict(out.headers)["content-type"] == b"application/msgpack"
    assert out.value is not None
    assert decode_reply(out.value, Encoding.MSGPACK).status == "ok"


async def test_bad_records_are_dead_lettered_and_the_job_goes_on() -> None:
    values = [_json_event("a"), b"{not json", _json_event("c"), None, b'{"body": 1}']
    source = FakeSource({0: [_record(0, o, v) for o, v in enumerate(values)]}, ends={0: 5})
    sink = _sink()
    job, _ = _job(source, sink, text_field="body.text")
    summary = await job.run(asyncio.Event())

    assert summary.complete
    assert (summary.ok, summary.dead_lettered) == (2, 3)
    dead = sink.to("dead")
    assert [d.key for d in dead] == [b"k1", b"k3", b"k4"]
    first = dead[0]
    assert first.value == b"{not json"  # the original value, unchanged
    headers = first.headers
    assert headers[0] == ("app", b"1")  # the original headers first
    names = dict(headers)
    assert names["kbatch.error.code"] == b"invalid_request"
    assert b"not valid JSON" in (names["kbatch.error.message"] or b"")
    assert (names["kbatch.source.topic"], names["kbatch.source.offset"]) == (b"events", b"1")
    assert dead[1].value is None  # a null value stays null
    assert source.last_committed() == {0: 5}


async def test_an_output_the_broker_refuses_is_dead_lettered() -> None:
    source = FakeSource({0: [_record(0, 0, b"x")]}, ends={0: 1})
    sink = _sink(refuse=frozenset({"scores"}))
    job, _ = _job(source, sink)
    summary = await job.run(asyncio.Event())
    assert summary.complete and summary.dead_lettered == 1 and summary.ok == 0
    (dead,) = sink.to("dead")
    assert b"could not be delivered" in (dict(dead.headers)["kbatch.error.message"] or b"")


async def test_an_undeliverable_dead_letter_keeps_the_partition_unfinished() -> None:
    values = [b"ok", b"", b"ok too"]  # offset 1: empty text -> dead letter -> refused
    source = FakeSource({0: [_record(0, o, v) for o, v in enumerate(values)]}, ends={0: 3})
    sink = _sink(refuse=frozenset({"dead"}))
    job, _ = _job(source, sink)
    summary = await job.run(asyncio.Event())
    assert not summary.complete and not summary.stopped
    assert (summary.ok, summary.undelivered) == (2, 1)
    assert not summary.partitions[0].reached_end
    assert source.last_committed() == {0: 1}  # never past the unfinished offset 1


async def test_a_stop_finishes_what_was_read_and_is_not_complete() -> None:
    records = {0: [_record(0, o, b"t") for o in range(30)]}
    source = FakeSource(records, ends={0: 30}, chunk=5)
    stop = asyncio.Event()
    source.stop, source.stop_after_polls = stop, 2
    sink = _sink()
    job, _ = _job(source, sink)
    summary = await job.run(stop)
    assert summary.stopped and not summary.complete
    assert summary.records_read == 10 and summary.ok == 10  # both polls' records finished
    assert source.last_committed() == {0: 10}


async def test_in_flight_records_are_bounded() -> None:
    records = {0: [_record(0, o, b"t") for o in range(50)]}
    source = FakeSource(records, ends={0: 50}, chunk=50)
    sink = _sink()
    job, engine = _job(source, sink, max_in_flight_records=8)
    seen: list[int] = []
    original = engine.submit

    async def submit(items: Sequence[InferenceItem], on_outcomes: Any) -> list[int]:
        seen.append(len(items))
        return await original(items, on_outcomes)

    engine.submit = submit  # type: ignore[method-assign]
    summary = await job.run(asyncio.Event())
    assert summary.complete and summary.ok == 50
    assert max(seen) <= 8


async def test_an_empty_range_is_complete_at_once() -> None:
    source = FakeSource({0: [], 1: []}, ends={0: 0, 1: 0})
    sink = _sink()
    job = BackfillJob(_settings(), source, sink, ReplyBuilder(ModelInfo(name="m"), "dead"))
    summary = await job.run(asyncio.Event())  # no engine bound: none is needed
    assert summary.complete and summary.records_read == 0
    assert sink.sent == [] and source.commits == []


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"range_from": "yesterday"}, "range_from"),
        ({"range_to": "2024-05-01T00:00:00"}, "no time zone"),
        ({"output_topic": TOPIC}, "is the source topic"),
        ({"text_field": "a..b"}, "non-empty names"),
    ],
)
def test_settings_reject(kw: dict[str, Any], message: str) -> None:
    base: dict[str, Any] = {"source_topic": TOPIC, "output_topic": "scores", **kw}
    with pytest.raises(ValueError, match=message):
        BackfillSettings(**base)


def test_default_group_id_is_stable_and_follows_the_job() -> None:
    a = BackfillSettings(source_topic=TOPIC, output_topic="scores")
    assert (
        a.effective_group_id
        == BackfillSettings(source_topic=TOPIC, output_topic="scores").effective_group_id
    )
    assert a.effective_group_id.startswith("kbatch-backfill.events.scores.")
    other = BackfillSettings(source_topic=TOPIC, output_topic="scores", range_from="0:5")
    assert other.effective_group_id != a.effective_group_id
    assert (
        BackfillSettings(
            source_topic=TOPIC, output_topic="scores", group_id="mine"
        ).effective_group_id
        == "mine"
    )
    assert a.dead_letter_topic == "events.dlq"


def test_batch_policy_has_waits_off_and_the_bench_budgets() -> None:
    s = BackfillSettings(source_topic=TOPIC, output_topic="scores")
    cpu, cuda = s.batch_policy(cuda=False), s.batch_policy(cuda=True)
    assert cpu.max_wait_ms == 0.0 and not cpu.adaptive_wait
    assert (cpu.max_batch_tokens, cuda.max_batch_tokens) == (2048, 16384)


async def test_a_resumed_run_skips_what_the_earlier_run_finished_above_its_commit() -> None:
    # The earlier run committed 2 and had written 3 and 5 (its commit's metadata).
    source = FakeSource({0: [_record(0, o, f"t{o}".encode()) for o in range(2, 8)]}, ends={0: 8})
    source._plan[0] = plan_partition(
        0, start_offset=0, end_offset=8, log_start=0, log_end=8, committed=2,
        completed=frozenset({3, 5}),
    )  # fmt: skip
    sink = _sink()
    job, engine = _job(source, sink)
    summary = await job.run(asyncio.Event())
    assert summary.complete
    assert [it.text for it in engine.submitted] == ["t2", "t4", "t6", "t7"]
    assert len(sink.to("scores")) == 4
    assert job.skipped_completed == summary.skipped_completed == 2
    assert summary.records_read == 6 and summary.ok == 4
    assert source.last_committed() == {0: 8}


async def test_commits_carry_the_offsets_written_above_the_committed_one() -> None:
    source = FakeSource({0: [_record(0, o, f"t{o}".encode()) for o in range(4)]}, ends={0: 4})
    job, _ = _job(source, _sink())
    job._tracker.assign((TOPIC, 0))
    generation = job._tracker.track((TOPIC, 0), 0)
    for o in (1, 2):
        job._tracker.complete((TOPIC, 0), o, job._tracker.track((TOPIC, 0), o))
    assert await job._commit()
    assert source.commits[-1] == {0: 0}
    assert decode_completed(source.metadata[-1][0]) == (0, frozenset({1, 2}))
    job._tracker.complete((TOPIC, 0), 0, generation)
    assert await job._commit()
    assert source.commits[-1] == {0: 3} and source.metadata[-1] == {0: ""}
