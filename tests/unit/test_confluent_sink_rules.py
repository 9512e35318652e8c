"""The librdkafka reply sinks' pure rules: which librdkafka error becomes which sink error
(:func:`consumer.kafka.confluent_adapter.sink.delivery_error`), which commit failure which
reason (:func:`~consumer.kafka.confluent_adapter.transactions.failure_reason`), the producer's
configuration, and librdkafka's retried log lines as one WARNING a minute
(:mod:`consumer.kafka.confluent_adapter.logs`)."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import KafkaError, KafkaException

from consumer.kafka.config import KafkaClientSettings, SinkSettings
from consumer.kafka.confluent_adapter.logs import (
    LibrdkafkaLogFilter,
    error_callback,
    librdkafka_logger,
)
from consumer.kafka.confluent_adapter.sink import delivery_error, producer_config
from consumer.kafka.confluent_adapter.transactions import failure_reason
from consumer.kafka.errors import (
    FENCED,
    DeliveryDeniedError,
    DeliveryError,
    DeliveryTopicMissingError,
    SinkClosedError,
)
from tests.fakes import FakeClock


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (KafkaError._UNKNOWN_TOPIC, DeliveryTopicMissingError),
        (KafkaError.UNKNOWN_TOPIC_OR_PART, DeliveryTopicMissingError),
        (KafkaError.TOPIC_AUTHORIZATION_FAILED, DeliveryDeniedError),
        (KafkaError.MSG_SIZE_TOO_LARGE, DeliveryError),
        (KafkaError.INVALID_RECORD, DeliveryError),
        (KafkaError._UNKNOWN_PARTITION, DeliveryError),
        (KafkaError._PURGE_QUEUE, SinkClosedError),
        (KafkaError._PURGE_INFLIGHT, SinkClosedError),
        (KafkaError._MSG_TIMED_OUT, SinkClosedError),
        (KafkaError._FENCED, SinkClosedError),
    ],
)
def test_delivery_errors(code: int, expected: type[Exception]) -> None:
    err = delivery_error(KafkaError(code), "replies")
    assert type(err) is expected
    if expected is DeliveryDeniedError:
        assert str(err) == "the broker's ACLs deny writing to replies"


def test_retriable_delivery_error_is_sent_again() -> None:
    assert delivery_error(KafkaError(KafkaError.NOT_ENOUGH_REPLICAS, retriable=True), "t") is None


def test_fatal_delivery_error_closes() -> None:
    fatal = KafkaError(KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, fatal=True)
    assert isinstance(delivery_error(fatal, "t"), SinkClosedError)


@pytest.mark.parametrize(
    ("err", "fatal", "reason"),
    [
        (KafkaException(KafkaError(KafkaError._FENCED, fatal=True)), None, FENCED),
        (KafkaException(KafkaError(KafkaError.PRODUCER_FENCED)), None, FENCED),
        (SinkClosedError("x"), KafkaError(KafkaError._FENCED, fatal=True), FENCED),
        (SinkClosedError("x"), None, "unacknowledged_send"),
        (
            KafkaException(KafkaError(KafkaError.INVALID_TXN_STATE, txn_requires_abort=True)),
            None,
            "aborted",
        ),
        (
            KafkaException(KafkaError(KafkaError._TIMED_OUT, retriable=True)),
            None,
            "unknown_outcome",
        ),
        (TimeoutError(), None, "unknown_outcome"),
    ],
)
def test_failure_reasons(err: BaseException, fatal: object, reason: str) -> None:
    assert failure_reason(err, fatal) == reason


def test_producer_config() -> None:
    client = KafkaClientSettings(bootstrap="b:9092")
    plain = producer_config(client, SinkSettings(send_timeout_ms=7000), None)
    assert plain["partitioner"] == "murmur2_random"  # Java's key → partition
    assert (plain["enable.idempotence"], plain["acks"]) == (True, "all")
    assert plain["message.timeout.ms"] == 0  # librdkafka retries until acknowledged
    assert plain["allow.auto.create.topics"] is False
    assert "transactional.id" not in plain
    txn = producer_config(client, SinkSettings(send_timeout_ms=90_000), "kb-g-t-0")
    assert txn["transactional.id"] == "kb-g-t-0"
    assert txn["message.timeout.ms"] == 90_000
    assert txn["transaction.timeout.ms"] == 90_000  # never below message.timeout.ms


def _line(logger: logging.Logger, level: int, facility: str, text: str) -> None:
    logger.log(level, "%s [%s] %s", facility, "rdkafka#producer-1", text)


def test_retried_lines_are_a_warning_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    logger = logging.getLogger("tests.librdkafka.quiet")
    logger.addFilter(LibrdkafkaLogFilter(clock))
    down = "127.0.0.1:9092/1: Connect to ipv4#127.0.0.1:9092 failed: refused (after {}ms)"
    with caplog.at_level(logging.INFO, logger=logger.name):
        for after_ms in (0, 12, 250):  # the same line, its numbers changing
            _line(logger, logging.ERROR, "FAIL", down.format(after_ms))
        clock.now_s += 61
        _line(logger, logging.ERROR, "FAIL", down.format(9))
        _line(logger, logging.ERROR, "SSL", "certificate verify failed")  # not retried
    assert [(r.levelname, r.args[0]) for r in caplog.records] == [  # type: ignore[index]
        ("WARNING", "FAIL"),
        ("WARNING", "FAIL"),
        ("ERROR", "SSL"),
    ]


def test_error_callback_levels(caplog: pytest.LogCaptureFixture) -> None:
    logger = librdkafka_logger("test-errors")
    fatal: list[object] = []
    report = error_callback(logger, fatal.append)
    with caplog.at_level(logging.INFO, logger=logger.name):
        report(KafkaError(KafkaError._ALL_BROKERS_DOWN))
        report(KafkaError(KafkaError._ALL_BROKERS_DOWN))  # again within the minute: DEBUG
        fenced = KafkaError(KafkaError._FENCED, fatal=True)
        report(fenced)
    assert [r.levelname for r in caplog.records] == ["WARNING", "ERROR"]
    assert "ERROR" not in caplog.records[0].getMessage()  # a WARNING line says no ERROR
    assert "_ALL_BROKERS_DOWN, retried" in caplog.records[0].getMessage()
    assert fatal == [fenced]
