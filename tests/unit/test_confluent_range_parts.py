"""The pure parts of the confluent-kafka range readers: bounds to offsets, commit metadata as
confluent-kafka sends it, error translation, and the owner thread's loop-side buffer."""

from __future__ import annotations

import asyncio

import pytest
from confluent_kafka import KafkaError, KafkaException, Message

from consumer.kafka.confluent_adapter.commit_points import fit_metadata as _fit
from consumer.kafka.confluent_adapter.errors import connect_failure, map_confluent_errors
from consumer.kafka.confluent_adapter.owner_thread import Chunk, ConsumerThread
from consumer.kafka.confluent_adapter.range_source import record_of
from consumer.kafka.errors import (
    KafkaSecurityError,
    KafkaUnavailableError,
    RangeSourceError,
    RangeSpecError,
)
from consumer.kafka.offset_metadata import MAX_METADATA_BYTES, decode_completed, encode_completed
from consumer.kafka.ranges import AtOffsets, AtTime, Earliest, Latest, bound_offsets

START = {0: 5, 1: 0}
END = {0: 50, 1: 20}


@pytest.mark.parametrize(
    ("bound", "side", "expected"),
    [
        (Earliest(), "from", {0: 5, 1: 0}),
        (Latest(), "to", {0: 50, 1: 20}),
        (AtOffsets({1: 7}), "from", {0: 5, 1: 7}),  # not named: the log start
        (AtOffsets({0: 9}), "to", {0: 9, 1: 20}),  # not named: the end
        (AtTime(1_000), "from", {0: 12, 1: 20}),  # no hit: the log end
    ],
)
def test_bound_offsets(bound: object, side: str, expected: dict[int, int]) -> None:
    by_time = {0: 12, 1: None}
    assert bound_offsets(bound, side, "t", START, END, by_time) == expected  # type: ignore[arg-type]


def test_bound_offsets_refuses_a_partition_the_topic_lacks() -> None:
    with pytest.raises(RangeSpecError, match=r"topic 't' has no partition\(s\) \[4\]"):
        bound_offsets(AtOffsets({4: 1}), "from", "t", START, END, {})


def test_commit_metadata_leaves_a_byte_for_confluents_nul() -> None:
    assert _fit("") is None  # no metadata, not a lone NUL
    short = encode_completed(10, [12, 15]).text
    assert _fit(short) == short
    full = encode_completed(0, range(1, 200_000, 3))  # truncated to the broker's limit
    assert full.truncated and len(full.text) <= MAX_METADATA_BYTES
    fitted = _fit(full.text)
    assert fitted is not None and len(fitted) + 1 <= MAX_METADATA_BYTES
    base, done = decode_completed(fitted)
    _, all_done = decode_completed(full.text)
    assert base == 0 and done and done < all_done  # the lowest done offsets are kept
    assert max(done) < min(all_done - done)


def test_record_of_copies_a_message() -> None:
    msg = Message(
        topic="t", partition=1, offset=7, key=b"k", value=b"v",
        headers=[("a", b"1"), ("b", None)], timestamp=(1, 1_714_521_600_000),
    )  # fmt: skip
    r = record_of(msg)
    assert (r.topic, r.partition, r.offset, r.key, r.value) == ("t", 1, 7, b"k", b"v")
    assert r.headers == (("a", b"1"), ("b", b"")) and r.timestamp_ms == 1_714_521_600_000


def test_errors_map_to_the_layers_classes() -> None:
    denied = KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "Broker: denied"))
    security = pytest.raises(KafkaSecurityError, match=r"^fetching t: the broker denies it: TOPIC")
    with security, map_confluent_errors(RangeSourceError, "fetching t"):
        raise denied
    missing = KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART, "Broker: unknown"))
    source = pytest.raises(RangeSourceError, match=r"^resolving: UNKNOWN_TOPIC_OR_PART: Broker: un")
    with source, map_confluent_errors(RangeSourceError, "resolving"):
        raise missing
    with pytest.raises(KeyError), map_confluent_errors(RangeSourceError, "resolving"):
        raise KeyError("not Kafka's")


def test_connect_failure_names_a_refusal_or_the_transport_error() -> None:
    tls = KafkaError(
        KafkaError._SSL,
        "ssl://127.0.0.1:9093/bootstrap: SSL handshake failed: certificate verify failed",
    )
    down = KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down")
    refused = KafkaError(KafkaError._TRANSPORT, "127.0.0.1:1/bootstrap: Connection refused")
    err = connect_failure([tls, down], "cannot connect to Kafka")
    assert isinstance(err, KafkaSecurityError)
    assert str(err) == (
        "the broker at 127.0.0.1:9093 refused the client: TLS check of the broker's "
        "certificate failed: SSL handshake failed: certificate verify failed"
    )
    err = connect_failure([refused, down], "cannot connect to Kafka")
    assert type(err) is KafkaUnavailableError
    assert str(err) == "cannot connect to Kafka: 127.0.0.1:1/bootstrap: Connection refused"
    assert str(connect_failure([], "cannot connect to Kafka")) == "cannot connect to Kafka"


def _msg(partition: int, offset: int) -> Message:
    return Message(topic="t", partition=partition, offset=offset)


async def test_take_splits_a_chunk_and_keeps_its_positions_for_the_rest() -> None:
    """Positions belong to the end of a chunk: a partly taken chunk gives none (a partition
    must not finish while its records still wait in the buffer)."""
    thread = ConsumerThread({"group.id": "unit", "bootstrap.servers": "127.0.0.1:1"}, name="u")
    thread.start()
    try:
        thread._arrive(Chunk([_msg(0, o) for o in range(5)], {("t", 0): 5}))
        first = await thread.take(3, 0)
        assert [m.offset() for m in first.messages] == [0, 1, 2] and first.positions == {}
        rest = await thread.take(10, 0)
        assert [m.offset() for m in rest.messages] == [3, 4] and rest.positions == {("t", 0): 5}
        thread._arrive(Chunk([_msg(0, 9), _msg(1, 0)], {("t", 0): 10, ("t", 1): 1}))
        thread.discard({("t", 0)})  # partition 0 seeked: what was consumed before is stale
        kept = await thread.take(10, 0)
        assert [(m.partition(), m.offset()) for m in kept.messages] == [(1, 0)]
        assert kept.positions == {("t", 1): 1}
        assert (await thread.take(10, 0.05)).messages == []  # waits, then nothing
    finally:
        await thread.close()
    with pytest.raises(KafkaUnavailableError, match="closed"):
        await thread.call(lambda c: c.assignment())


async def test_commands_run_on_the_owner_thread_and_errors_come_back() -> None:
    import threading

    thread = ConsumerThread({"group.id": "unit", "bootstrap.servers": "127.0.0.1:1"}, name="u")
    thread.start()
    try:
        names = await asyncio.gather(*(thread.call(lambda c: threading.current_thread().name)
                                       for _ in range(3)))  # fmt: skip
        assert names == ["u", "u", "u"]

        def fail(_: object) -> None:
            raise ValueError("inside")

        with pytest.raises(ValueError, match="inside"):
            await thread.call(fail)
    finally:
        await thread.close()


async def test_a_failed_thread_is_an_error_of_take_not_an_endless_empty_poll() -> None:
    thread = ConsumerThread({"group.id": "unit", "bootstrap.servers": "127.0.0.1:1"}, name="u")

    def boom() -> None:  # as an exception out of consume(), e.g. from a rebalance callback
        raise RuntimeError("boom")

    thread._consume_once = boom  # type: ignore[method-assign]
    thread.start()
    thread.consuming = True
    with pytest.raises(KafkaUnavailableError, match="the consumer failed: RuntimeError"):
        await thread.take(10, 5.0)
    assert not thread.alive
