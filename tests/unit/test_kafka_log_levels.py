"""aiokafka's retriable group-coordinator errors are a WARNING once a minute, not an ERROR
(consumer/kafka/log_levels.py): the lines aiokafka writes, through its own logger."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from aiokafka.errors import GroupAuthorizationFailedError, GroupCoordinatorNotAvailableError

from consumer.kafka.client_config import start_client
from consumer.kafka.log_levels import (
    COORDINATOR_LOGGER,
    REPEAT_AFTER_S,
    RetriableErrorLogFilter,
    quiet_retriable_errors,
)
from tests.fakes import FakeClock

LINE = "Group Coordinator Request failed: %s"  # aiokafka's ensure_coordinator_known


@pytest.fixture
def clock() -> Iterator[FakeClock]:
    """This filter alone on aiokafka's logger, on a fake clock (the installed one set aside)."""
    clock = FakeClock()
    logger = logging.getLogger(COORDINATOR_LOGGER)
    installed = logger.filters[:]
    logger.filters[:] = [RetriableErrorLogFilter(clock)]
    try:
        yield clock
    finally:
        logger.filters[:] = installed


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
    filters = logging.getLogger(COORDINATOR_LOGGER).filters
    assert [f for f in filters if isinstance(f, RetriableErrorLogFilter)] == [
        quiet_retriable_errors()
    ]
