"""From submit's settings to a job record and back to a member's settings (pure)."""

from __future__ import annotations

import re

import click
import pytest
from click.testing import CliRunner

from consumer.backfill.config import BackfillSettings
from consumer.cli import cli
from consumer.config import ServeSettings
from consumer.jobs.spec import (
    conflict,
    incompatibility,
    job_record,
    jobs_topic_clash,
    member_settings,
    unsupported,
)

RANGES = {0: (3, 10), 1: (0, 4)}


def test_the_record_keeps_the_jobs_fields_and_resolved_ranges_not_client_settings() -> None:
    settings = BackfillSettings(
        source_topic="src", output_topic="out", text_field="a.b", dimensions=8,
        bootstrap="broker:9", range_to="0:10,1:4",
    )  # fmt: skip
    record = job_record(settings, RANGES, job_id="job-x", now_s=5.0)
    assert (record.group_id, record.state, record.ranges) == ("kbatch-job.job-x", "pending", RANGES)
    assert record.settings["text_field"] == "a.b" and record.settings["dimensions"] == 8
    assert record.settings["dlq_topic"] == "src.dlq"
    assert "bootstrap" not in record.settings and "model" not in record.settings
    assert record.total_offsets == 11


def test_a_member_runs_the_job_with_its_own_client_and_the_jobs_group() -> None:
    settings = BackfillSettings(source_topic="src", output_topic="out", text_field="t")
    record = job_record(settings, RANGES, job_id="job-x", now_s=5.0)
    serve = ServeSettings(bootstrap="mine:9092", group_id="serve-group", max_batch_size=7)
    mine = member_settings(serve, record)
    assert (mine.bootstrap, mine.group_id, mine.text_field) == (
        "mine:9092",
        "kbatch-job.job-x",
        "t",
    )
    assert (mine.dead_letter_topic, mine.source_topic, mine.progress) == ("src.dlq", "src", False)


def test_a_member_of_another_task_or_model_does_not_run_it() -> None:
    given = BackfillSettings(source_topic="s", output_topic="o", model="/m/a")
    record = job_record(given, RANGES, now_s=0.0)
    assert incompatibility(ServeSettings(model="/m/a"), record) is None
    assert "model /m/a" in (incompatibility(ServeSettings(model="/m/b"), record) or "")
    assert "task=classify" in (
        incompatibility(ServeSettings(model="/m/a", task="classify"), record) or ""
    )


def test_rerank_is_refused_at_submit_and_exactly_once_travels_with_the_job() -> None:
    plain = BackfillSettings(source_topic="s", output_topic="o")
    assert unsupported(plain) is None
    rerank = BackfillSettings(
        source_topic="s", output_topic="o", task="rerank", text_field="q", documents_field="d"
    )
    assert "task=rerank" in (unsupported(rerank) or "")
    eos = BackfillSettings(source_topic="s", output_topic="o", exactly_once=True)
    record = job_record(eos, RANGES, now_s=0.0)
    assert unsupported(eos) is None and member_settings(ServeSettings(), record).exactly_once


def test_backfill_is_a_group_that_still_runs_without_a_subcommand() -> None:
    command = cli.commands["backfill"]
    assert isinstance(command, click.Group)
    assert sorted(command.commands) == ["cancel", "status", "submit"]
    runner = CliRunner()
    plain = runner.invoke(cli, ["backfill", "--output-topic", "out"])
    assert plain.exit_code == 2 and "--source-topic is required" in plain.output  # standalone
    mixed = runner.invoke(cli, ["backfill", "--source-topic", "s", "status"])
    assert mixed.exit_code == 2 and "after the subcommand" in mixed.output
    refused = runner.invoke(
        cli,
        ["backfill", "submit", "--source-topic", "s", "--output-topic", "o", "--task", "rerank",
         "--text-field", "q", "--documents-field", "d"],
    )  # fmt: skip
    assert refused.exit_code == 2 and "not supported for jobs" in refused.output


@pytest.mark.parametrize("sub", ["submit", "status", "cancel"])
def test_every_subcommand_takes_the_jobs_topic(sub: str) -> None:
    command = cli.commands["backfill"]
    assert isinstance(command, click.Group)
    flags = {o for p in command.commands[sub].params for o in p.opts}
    assert "--jobs-topic" in flags and "--bootstrap" in flags


@pytest.mark.parametrize(
    ("given", "why"),
    [
        ({"output_topic": "live.req"}, "is this server's request topic"),
        ({"output_topic": "live.req.dlq"}, "is this server's dead-letter topic"),
        ({"output_topic": "kbatch.jobs"}, "is this server's jobs topic"),
        ({"output_topic": "o", "group_id": "live"}, "is this server's live consumer group"),
        ({"output_topic": "o", "dlq_topic": "live.req"}, "dead-letter topic 'live.req' is this"),
        ({"output_topic": "o", "dlq_topic": "kbatch.jobs"}, "is this server's jobs topic"),
        ({"output_topic": "o", "dlq_topic": "live.req.dlq"}, None),  # serve's own: allowed
        ({"output_topic": "o"}, None),
    ],
)
def test_a_job_that_would_collide_with_serves_own_topics_or_group_is_refused(
    given: dict[str, str], why: str | None
) -> None:
    serve = ServeSettings(
        request_topic="live.req",
        dlq_topic="live.req.dlq",
        group_id="live",
        jobs_topic="kbatch.jobs",
    )
    record = job_record(BackfillSettings(source_topic="s", **given), RANGES, now_s=0.0)
    found = conflict(serve, record)
    assert (found is None) if why is None else (why in (found or ""))


def test_bad_submit_flags_are_one_line_each_not_a_pydantic_dump() -> None:
    runner = CliRunner()
    bad_from = runner.invoke(
        cli, ["backfill", "submit", "--source-topic", "s", "--output-topic", "o", "--from", "x"]
    )
    assert bad_from.exit_code == 2
    assert "Error: --from 'x' is neither" in bad_from.output
    same = runner.invoke(cli, ["backfill", "--source-topic", "s", "--output-topic", "s"])
    assert same.exit_code == 2 and "Error: output_topic='s' is the source topic" in same.output
    for out in (bad_from.output, same.output):
        assert "validation error" not in out and "pydantic.dev" not in out


@pytest.mark.parametrize(
    ("jobs_topic", "why"),
    [
        ("src", "is the job's source topic"),
        ("out", "is the job's output topic"),
        ("src.dlq", "is the job's dead-letter topic"),
        ("kbatch.jobs", None),
    ],
)
def test_the_jobs_topic_is_none_of_the_jobs_own_topics(jobs_topic: str, why: str | None) -> None:
    settings = BackfillSettings(source_topic="src", output_topic="out")
    found = jobs_topic_clash(settings, jobs_topic)
    assert (found is None) if why is None else (why in (found or ""))


def test_submit_refuses_the_jobs_source_as_jobs_topic_before_any_broker_call() -> None:
    got = CliRunner().invoke(
        cli,
        ["backfill", "submit", "--source-topic", "s", "--output-topic", "o",
         "--jobs-topic", "s", "--bootstrap", "127.0.0.1:1"],
    )  # fmt: skip
    assert got.exit_code == 2
    assert "--jobs-topic 's' is the job's source topic" in got.output


@pytest.mark.parametrize(
    ("range_from", "range_to", "why"),
    [
        ("0:500", "0:100", "--from 0:500 is after --to 0:100 (partition 0)"),
        ("0:5,1:9", "0:6,1:2", "--from 1:9 is after --to 1:2 (partition 1)"),
        ("2026-12-01T21:00:00Z", "2026-12-01T20:00:00Z", "is after --to"),
        ("0:5", "0:5", None),  # empty, not inverted
        ("0:500", "1:100", None),  # different partitions
        ("2026-12-01T20:00:00Z", "0:100", None),  # a time and offsets: resolved by the broker
    ],
)
def test_an_inverted_range_is_refused_not_run_as_an_empty_job(
    range_from: str, range_to: str, why: str | None
) -> None:
    """Regression: `--from 0:500 --to 0:100` ran (and completed) empty."""
    args = {"source_topic": "s", "output_topic": "o", "range_from": range_from}
    if why is None:
        BackfillSettings(**args, range_to=range_to)
        return
    with pytest.raises(ValueError, match=re.escape(why)):
        BackfillSettings(**args, range_to=range_to)
