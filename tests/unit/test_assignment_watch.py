"""The line a serve logs when it joined its group and got no partitions (a restart after
kill -9 waits out the dead member's session timeout; nothing said why)."""

from __future__ import annotations

import logging

import pytest

from consumer.serve.assignment_watch import unassigned_hint, watch_first_assignment


async def _no_wait(seconds: float) -> None:
    assert seconds == 10.0


async def test_a_member_without_partitions_after_the_wait_is_told_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "kbatch")
    logged = await watch_first_assignment(lambda: False, "g1", 30_000, "classic", sleep=_no_wait)
    assert logged
    (line,) = [r.getMessage() for r in caplog.records if "no partitions assigned" in r.getMessage()]
    assert "10 s after joining group 'g1'" in line
    assert "--session-timeout-ms 30000" in line and "--group-instance-id" in line


async def test_an_assigned_member_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "kbatch")
    assert not await watch_first_assignment(lambda: True, "g1", 30_000, "classic", sleep=_no_wait)
    assert not [r for r in caplog.records if "no partitions assigned" in r.getMessage()]


def test_under_the_consumer_protocol_the_timeout_is_the_brokers() -> None:
    line = unassigned_hint("g", 10.0, 30_000, "consumer")
    assert "group.consumer.session.timeout.ms" in line and "--session-timeout-ms" not in line
