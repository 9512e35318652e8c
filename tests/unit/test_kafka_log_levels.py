"""aiokafka's retried errors are a WARNING once a minute, not an ERROR each time
(consumer/kafka/log_levels.py): the lines aiokafka writes, through its own loggers — the group
coordinator's, and the client's connection and the fetcher's retries while one
broker of a cluster is down."""

from __future__ import annotations

import logging
import re
import socket
import ssl
from collections.abc import Iterator

import pytest
from aiokafka import AIOKafkaClient
from aiokafka.errors import (
    GroupAuthorizationFailedError,
    GroupCoordinatorNotAvailableError,
    KafkaConnectionError,
    NotLeaderForPartitionError,
    RequestTimedOutError,
    TopicAuthorizationFailedError,
)
from aiokafka.protocol.metadata import MetadataResponse_v0

from consumer.kafka.client_config import start_client
from consumer.kafka.errors import KafkaUnavailableError
from consumer.kafka.log_levels import (
    COORDINATOR_LOGGER,
    NOISY_LOGGERS,
    OUTAGE_ERROR_AFTER_S,
    REPEAT_AFTER_S,
    RetriableErrorLogFilter,
    quiet_retriable_errors,
)
from tests.fakes import FakeClock

LINE = "Group Coordinator Request failed: %s"  # aiokafka's ensure_coordinator_known
TOPIC_LINE = "Error fetching metadata for topic %s: %s"  # aiokafka.cluster


@pytest.fixture
def clock() -> Iterator[FakeClock]:
    """This filter alone on aiokafka's loggers, on a fake clock (the installed one set aside)."""
    clock = FakeClock()
    quiet = RetriableErrorLogFilter(clock)
    installed = {name: logging.getLogger(name).filters[:] for name in NOISY_LOGGERS}
    for name in NOISY_LOGGERS:
        logging.getLogger(name).filters[:] = [quiet]
    try:
        yield clock
    finally:
        for name, filters in installed.items():
            logging.getLogger(name).filters[:] = filters


def test_a_retriable_coordinator_error_is_one_warning_a_minute(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    logger = logging.getLogger(COORDINATOR_LOGGER)
    for step_s in (0.0, 0.1, 0.1, REPEAT_AFTER_S):  # aiokafka retries every retry_backoff_ms
        clock.now_s += step_s
        logger.error(LINE, GroupCoordinatorNotAvailableError())
    assert [r.levelname for r in caplog.records] == ["WARNING", "WARNING"]  # at 0 s and 60.2 s
    assert "GroupCoordinatorNotAvailableError" in caplog.records[0].getMessage()


def test_the_repeats_stay_visible_at_debug(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=COORDINATOR_LOGGER)
    logger = logging.getLogger(COORDINATOR_LOGGER)
    for _ in range(3):
        logger.error(LINE, GroupCoordinatorNotAvailableError())
    assert [r.levelname for r in caplog.records] == ["WARNING", "DEBUG", "DEBUG"]


def test_a_fatal_error_stays_an_error(clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    logger = logging.getLogger(COORDINATOR_LOGGER)
    logger.error(LINE, GroupAuthorizationFailedError())  # not retriable
    logger.error("Unexpected error in coordinator routine")  # no error argument
    assert [r.levelname for r in caplog.records] == ["ERROR", "ERROR"]


async def test_starting_a_kafka_client_installs_the_filter_once() -> None:
    async def nothing() -> None:
        return None

    await start_client(nothing, nothing, "a client")
    await start_client(nothing, nothing, "another client")
    for name in NOISY_LOGGERS:
        filters = logging.getLogger(name).filters
        assert [f for f in filters if isinstance(f, RetriableErrorLogFilter)] == [
            quiet_retriable_errors()
        ]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_a_broker_that_is_down_is_one_warning_a_minute_per_node(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression: with one broker of three down, aiokafka's client logged ``Unable connect to
    node with id N`` at ERROR for every request routed to it (hundreds per fault). Its own
    code here: a client whose metadata names two brokers that refuse connections."""
    caplog.set_level(logging.INFO)
    client = AIOKafkaClient(bootstrap_servers="127.0.0.1:1", request_timeout_ms=1000)
    down = [(2, "127.0.0.1", _closed_port()), (3, "127.0.0.1", _closed_port())]
    client.cluster.update_metadata(MetadataResponse_v0(down, []))
    try:
        for _ in range(20):  # aiokafka retries every retry_backoff_ms (100 ms)
            clock.now_s += 0.1
            assert await client._get_conn(2) is None
        assert await client._get_conn(3) is None  # another node down: its own line at once
        clock.now_s += REPEAT_AFTER_S
        assert await client._get_conn(2) is None
    finally:
        await client.close()
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "aiokafka"]
    assert [(level, text.split(":")[0]) for level, text in lines] == [
        ("WARNING", "Unable connect to node with id 2"),
        ("WARNING", "Unable connect to node with id 3"),
        ("WARNING", "Unable connect to node with id 2"),  # a minute later
    ]


@pytest.mark.parametrize(
    ("logger", "line", "error"),
    [
        ("aiokafka.consumer.fetcher", "Failed fetch messages from %s: %s", KafkaConnectionError()),
        ("aiokafka.consumer.fetcher", "Failed fetch messages from %s: %s", RequestTimedOutError()),
        ("aiokafka.consumer.fetcher", "Failed fetch offsets from %s: %s", KafkaConnectionError()),
        ("aiokafka", "Unable connect to node with id %s: %s", TimeoutError()),
        ("aiokafka.cluster", TOPIC_LINE, NotLeaderForPartitionError),
        ("aiokafka.producer.sender", "Got error produce response: %s", KafkaConnectionError()),
        ("aiokafka.cluster", "Topic %s not found in cluster metadata", None),
    ],
    ids=[
        "fetch",
        "fetch-timeout",
        "offsets",
        "connect-timeout",
        "metadata-class",
        "produce",
        "unknown-topic",
    ],
)
def test_a_retried_fetch_metadata_or_produce_error_is_one_warning_a_minute(
    clock: FakeClock, caplog: pytest.LogCaptureFixture, logger: str, line: str, error: object
) -> None:
    """The fetcher's, the cluster metadata's and the producer's lines, as aiokafka 0.14 writes
    them (the metadata line passes the error class, not an instance; the producer's is a
    WARNING at each retry). The unknown topic's line passes no error, only the topic: a broker
    not yet told of a topic created a moment ago answered it to a client of a three-broker
    cluster, an ERROR that failed the CI run of stop 39."""
    caplog.set_level(logging.INFO)
    level = logging.WARNING if logger.endswith("sender") else logging.ERROR
    args = ("t",) if error is None else (error,) if line.count("%s") == 1 else (2, error)
    for _ in range(50):
        clock.now_s += 0.1
        logging.getLogger(logger).log(level, line, *args)
    assert [r.levelname for r in caplog.records] == ["WARNING"]


def test_a_tls_or_acl_failure_on_a_noisy_logger_stays_an_error(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    client_log = logging.getLogger("aiokafka")
    tls = ssl.SSLCertVerificationError("certificate verify failed")
    client_log.error("Unable connect to node with id %s: %s", 2, tls)
    client_log.error("Unable connect to node with id %s: %s", 2, tls)
    cluster_log = logging.getLogger("aiokafka.cluster")
    cluster_log.error(
        "Error fetching metadata for topic %s: %s", "t", TopicAuthorizationFailedError
    )
    cluster_log.error("Topic %s is not authorized for this client", "t")
    assert [r.levelname for r in caplog.records] == ["ERROR"] * 4


async def test_a_start_names_the_connect_failure_every_time(clock: FakeClock) -> None:
    """start_client reads the cause from aiokafka's connect line; the quieting filter, which
    drops that line's repeats within the minute, must not take it away from the second start."""

    async def refused() -> None:
        logging.getLogger("aiokafka").error(
            'Unable connect to "%s:%s": %s', "127.0.0.1", 1, ConnectionRefusedError(111, "no")
        )
        raise KafkaConnectionError("Unable to bootstrap from [('127.0.0.1', 1)]")

    async def nothing() -> None:
        return None

    for _ in range(2):
        with pytest.raises(KafkaUnavailableError, match=r"a client: \[Errno 111\] no"):
            await start_client(refused, nothing, "a client")


async def test_no_broker_answering_is_a_warning_a_minute_and_one_error_past_a_minute(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """With the only broker SIGKILLed for 17 s, aiokafka's ``Unable to update metadata from
    [1]`` was 192 ERROR lines, 11 a second. Its own code here: a client whose metadata names
    brokers that refuse connections, asked for metadata every retry_backoff_ms (100 ms)."""
    caplog.set_level(logging.INFO)
    client = AIOKafkaClient(bootstrap_servers="127.0.0.1:1", request_timeout_ms=1000)
    down = [(1, "127.0.0.1", _closed_port()), (2, "127.0.0.1", _closed_port())]
    client.cluster.update_metadata(MetadataResponse_v0(down, []))

    async def outage(seconds: float, step_s: float) -> list[tuple[str, str]]:
        caplog.clear()
        for _ in range(round(seconds / step_s)):
            clock.now_s += step_s
            assert not await client._metadata_update(client.cluster, [])
        return [
            (r.levelname, r.getMessage())
            for r in caplog.records
            if r.name == "aiokafka" and r.getMessage().startswith("Unable to update metadata")
        ]

    try:
        assert [level for level, _ in await outage(17.0, 0.1)] == ["WARNING"]  # 170 tries
        later = await outage(OUTAGE_ERROR_AFTER_S + REPEAT_AFTER_S + 10, 1.0)
        assert [level for level, _ in later] == ["ERROR", "WARNING"]  # at 60 s, at 120 s
        assert re.fullmatch(
            r"Unable to update metadata from \[[12], [12]\] \(for 6[01] s\)", later[0][1]
        )
        clock.now_s += REPEAT_AFTER_S  # the outage ended; the next one is told again
        again = await outage(OUTAGE_ERROR_AFTER_S + 1, 1.0)
        assert [level for level, _ in again] == ["WARNING", "ERROR"]
    finally:
        await client.close()
