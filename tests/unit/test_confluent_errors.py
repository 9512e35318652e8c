"""librdkafka's errors and log lines in kbatch's terms (consumer.kafka.confluent_adapter.errors,
.logs)."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import KafkaError

from consumer.kafka.confluent_adapter.errors import layer_error
from consumer.kafka.confluent_adapter.logs import LIBRDKAFKA_FORMAT, LibrdkafkaLogFilter
from consumer.kafka.errors import FencedInstanceError, KafkaSecurityError, KafkaUnavailableError

LINE = "[thrd:127.0.0.1:9092/bootstrap]: 127.0.0.1:9092/bootstrap: Connect to ipv4#127.0.0.1:9092 failed: Connection refused (after {}ms in state CONNECT)"  # noqa: E501


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _error(code: int, text: str, *, fatal: bool = False) -> KafkaError:
    return KafkaError(code, text, fatal=fatal)


def _mapped(err: KafkaError) -> object:
    return layer_error(err, group_id="g", instance_id="pod-a", topics=("req",))


def test_a_retried_connection_failure_is_one_warning_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    logger = logging.getLogger("test.confluent.log")
    logger.addFilter(LibrdkafkaLogFilter(clock))
    with caplog.at_level(logging.DEBUG, logger="test.confluent.log"):
        for i in range(50):  # librdkafka's level for FAIL lines is ERROR
            clock.now = i * 0.1
            logger.log(logging.ERROR, LIBRDKAFKA_FORMAT, "FAIL", "rdkafka#c-1", LINE.format(i))
        clock.now = 61.0
        logger.log(logging.ERROR, LIBRDKAFKA_FORMAT, "FAIL", "rdkafka#c-1", LINE.format(3))
    levels = [r.levelno for r in caplog.records]
    assert levels.count(logging.WARNING) == 2 and logging.ERROR not in levels
    assert levels.count(logging.DEBUG) == 49
    assert (
        caplog.records[0]
        .getMessage()
        .startswith(
            "FAIL [rdkafka#c-1] 127.0.0.1:9092/bootstrap:"  # the [thrd:…] prefix stripped
        )
    )


def test_another_error_line_stays_an_error_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logger = logging.getLogger("test.confluent.log2")
    logger.addFilter(LibrdkafkaLogFilter(Clock()))
    with caplog.at_level(logging.INFO, logger="test.confluent.log2"):
        for _ in range(3):
            logger.log(logging.ERROR, LIBRDKAFKA_FORMAT, "ASSIGN", "c", "something odd")
        logger.log(logging.CRITICAL, LIBRDKAFKA_FORMAT, "FATAL", "c", "fenced")  # error_cb has it
        logger.log(logging.INFO, LIBRDKAFKA_FORMAT, "INFO", "c", "hello")
    assert [r.levelno for r in caplog.records] == [logging.ERROR, logging.INFO, logging.INFO]


@pytest.mark.parametrize(
    ("err", "kind", "text"),
    [
        (
            _error(
                KafkaError._FATAL,
                "Fatal error: Broker: Static consumer fenced by other consumer with same "
                "group.instance.id",
            ),
            FencedInstanceError,
            "uses --group-instance-id 'pod-a' and took this one's place",
        ),
        (
            _error(
                KafkaError._FATAL,
                "Fatal error: Broker: The instance ID is still used by another member",
            ),
            FencedInstanceError,
            "already uses --group-instance-id 'pod-a', so this one may not join",
        ),
        (
            _error(
                KafkaError._SSL,
                "ssl://b1:9093/bootstrap: SSL handshake failed: error:0A000086:SSL routines::"
                "certificate verify failed (after 3ms in state SSL_HANDSHAKE)",
            ),
            KafkaSecurityError,
            "the broker at b1:9093 refused the client: TLS check of the broker's certificate",
        ),
        (
            _error(
                KafkaError._AUTHENTICATION,
                "sasl_ssl://b1:9093/bootstrap: SASL authentication error: Authentication "
                "failed during authentication due to invalid credentials with SASL mechanism "
                "SCRAM-SHA-512",
            ),
            KafkaSecurityError,
            "the broker at b1:9093 refused the client: SASL login refused: SASL authentication",
        ),
        (
            _error(KafkaError.TOPIC_AUTHORIZATION_FAILED, "Broker: Topic authorization failed"),
            KafkaSecurityError,
            "reading req as group g: the broker denies it: TOPIC_AUTHORIZATION_FAILED",
        ),
        (
            _error(KafkaError._FATAL, "Fatal error: something else"),
            KafkaUnavailableError,
            "the Kafka client failed for good: Fatal error: something else",
        ),
    ],
)
def test_what_librdkafka_cannot_retry_is_one_of_the_layers_errors(
    err: KafkaError, kind: type[Exception], text: str
) -> None:
    mapped = _mapped(err)
    assert type(mapped) is kind
    assert text in str(mapped)
    assert "(after" not in str(mapped)


@pytest.mark.parametrize(
    "code", [KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT]
)
def test_what_librdkafka_retries_is_not_raised(code: int) -> None:
    assert _mapped(_error(code, "1/1 brokers are down")) is None
