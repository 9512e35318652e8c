"""``kbatch backfill submit | status | cancel``: backfills as jobs run by ``kbatch serve``
(docs/JOBS.md). ``submit`` takes exactly ``kbatch backfill``'s flags and ``--jobs-topic``."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click
from rich_click import RichCommand

from consumer.cli.options import settings_from_flags, settings_options
from consumer.config import project
from consumer.jobs.settings import JobsClientSettings, SubmitSettings
from consumer.kafka.config import KafkaClientSettings

__all__ = ["add_job_commands"]

T = TypeVar("T")
_NOT_FLAGS = frozenset({"run_jobs", "progress"})
_CREATE_ONLY = frozenset({"jobs_topic_replication_factor"})  # status/cancel create no topic


def _json_param(what: str) -> click.Option:
    return click.Option(["--json", "as_json"], is_flag=True, default=False, help=what)


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro``; Kafka-layer and lookup failures are one error line, exit 1."""
    from consumer.jobs.client import JobNotFoundError
    from consumer.kafka.errors import KafkaLayerError, RangeSpecError

    try:
        return asyncio.run(coro)
    except RangeSpecError as err:
        raise click.UsageError(str(err)) from None
    except (JobNotFoundError, KafkaLayerError) as err:
        raise click.ClickException(str(err)) from None


def add_job_commands(
    group: click.Group,
    range_params: Sequence[click.Parameter],
    config_param: click.Parameter,
    explicit: frozenset[str],
) -> None:
    """Add ``submit``, ``status`` and ``cancel`` to ``kbatch backfill``'s group."""
    client_params = [
        config_param,
        *settings_options(JobsClientSettings, exclude=_NOT_FLAGS | _CREATE_ONLY),
    ]
    group.add_command(
        RichCommand(
            name="submit",
            callback=_submit,
            params=[
                *range_params,
                config_param,
                _json_param("Print the job record as JSON on stdout."),
                *settings_options(SubmitSettings, exclude=explicit | _NOT_FLAGS),
            ],
            help="Submit the backfill these flags describe (kbatch backfill's flags) as a job "
            "for the kbatch serve members watching --jobs-topic: the range is resolved now; "
            "prints the job id. The job keeps --source-topic, --output-topic, the range, "
            "--group-id, --text-field, --documents-field, --value-format, --dimensions, "
            "--normalize, --prompt-name, --encoding-format, --top-n, --top-k, --aggregation, "
            "--redact, --chunk-max-tokens, --chunk-overlap, --chunk-output, "
            "--max-in-flight-records, --max-concurrent-sends, --model (when given), "
            "--model-revision, --task, --default-prompt-name, --dlq-topic, "
            "--commit-interval-ms and --exactly-once; each serve member runs it with its own "
            "brokers, credentials, model and batching: the other flags serve only the submit "
            "itself (connecting, resolving the range). --task rerank is refused: run kbatch "
            "backfill standalone for it.",
        )
    )
    group.add_command(
        RichCommand(
            name="status",
            callback=_status,
            params=[
                click.Argument(["job"], required=False),
                _json_param("Print JSON on stdout (an object for JOB, else a list)."),
                *client_params,
            ],
            help="Show the state, progress and counts (done, failed, skipped) of JOB, or of "
            "every job of --jobs-topic.",
        )
    )
    group.add_command(
        RichCommand(
            name="cancel",
            callback=_cancel,
            params=[
                click.Argument(["job"]),
                _json_param("Print the job record as JSON on stdout."),
                *client_params,
            ],
            help="Cancel JOB: the serve members stop reading within seconds, finish and commit "
            "what is in flight. A job already ended is left as it is.",
        )
    )


def _submit(config: Path | None, as_json: bool, **flags: Any) -> None:
    from consumer.jobs.client import submit_job
    from consumer.jobs.spec import jobs_topic_clash, unsupported

    settings = settings_from_flags(SubmitSettings, config, flags)
    why = unsupported(settings) or jobs_topic_clash(settings, settings.jobs_topic)
    if why is not None:
        raise click.UsageError(why)
    record = _run(
        submit_job(
            settings,
            settings.jobs_topic,
            jobs_replication_factor=settings.jobs_topic_replication_factor,
        )
    )
    if as_json:
        sys.stdout.write(record.model_dump_json() + "\n")
    else:
        click.echo(
            f"submitted {record.job_id}: {record.total_offsets} offset(s) of "
            f"{record.source_topic} → {record.output_topic} (group {record.group_id}); "
            f"see kbatch backfill status {record.job_id}"
        )


def _client(config: Path | None, flags: dict[str, Any]) -> JobsClientSettings:
    return settings_from_flags(JobsClientSettings, config, flags)


def _status(job: str | None, as_json: bool, config: Path | None, **flags: Any) -> None:
    from rich.console import Console

    from consumer.jobs.client import job_statuses
    from consumer.jobs.render import render_statuses, status_json

    settings = _client(config, flags)
    client = project(KafkaClientSettings, settings)
    statuses = _run(job_statuses(client, settings.jobs_topic, job))
    if as_json:
        out = [status_json(s) for s in statuses]
        sys.stdout.write(json.dumps(out[0] if job else out) + "\n")
    else:
        render_statuses(statuses, Console())


def _cancel(job: str, as_json: bool, config: Path | None, **flags: Any) -> None:
    from consumer.jobs.client import cancel_job

    settings = _client(config, flags)
    client = project(KafkaClientSettings, settings)
    record = _run(cancel_job(client, settings.jobs_topic, job))
    if as_json:
        sys.stdout.write(record.model_dump_json() + "\n")
    else:
        click.echo(f"{record.job_id}: {record.state}")
