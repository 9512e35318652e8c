"""``kbatch backfill``'s exit code from its summary (consumer/backfill/app.py ``exit_code``)."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from consumer.backfill.app import EXIT_COMPLETE, EXIT_INCOMPLETE, EXIT_STOPPED, exit_code
from consumer.backfill.summary import BackfillSummary

DONE = BackfillSummary(
    source_topic="events", output_topic="scores", dlq_topic="dead", group_id="g",
    complete=True, stopped=False, records_read=10, ok=8, error_replies=0, dead_lettered=2,
    undelivered=0, elapsed_s=1.0, records_per_s=10.0, batches=2, mean_batch_size=4.0,
    padding_efficiency=0.9, partitions=(),
)  # fmt: skip


def _with(**changes: object) -> BackfillSummary:
    return dataclasses.replace(DONE, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("summary", "code"),
    [
        (DONE, EXIT_COMPLETE),  # some dead letters among scored records: a per-record outcome
        (_with(records_read=0, ok=0, dead_lettered=0), EXIT_COMPLETE),  # nothing left to read
        (_with(ok=0, error_replies=3, dead_lettered=7), EXIT_COMPLETE),  # answered, with errors
        (_with(complete=False), EXIT_INCOMPLETE),
        (_with(complete=False, stopped=True), EXIT_STOPPED),
        (_with(complete=False, stopped=True, ok=0, dead_lettered=10), EXIT_STOPPED),
    ],
)
def test_exit_code(summary: BackfillSummary, code: int) -> None:
    assert exit_code(summary, "dead") == code


def test_a_run_that_dead_lettered_every_record_fails_with_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """e.g. a topic of msgpack requests read without --text-field: every partition reached its
    end, nothing was scored."""
    with caplog.at_level(logging.ERROR, "kbatch.backfill"):
        assert exit_code(_with(ok=0, dead_lettered=10), "dead") == EXIT_INCOMPLETE
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("every record read was dead-lettered (10 to dead), none scored")
    assert "--text-field" in line
