"""From ``kbatch backfill submit``'s settings to a job record, and back to the settings a serve
member runs the job with (pure).

A job record keeps only the settings that define the job's output (:data:`JOB_FIELDS`: what to
read and write, the text field, the embed and task options, the dead-letter topic…), never the
client, security or batching settings: each serve member runs the job with its own brokers,
credentials, model and engine. ``model`` is kept only when ``--model`` was given; a member
serving another model (or another task) does not run the job (:func:`incompatibility`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from consumer.backfill.config import BackfillSettings
from consumer.config import ServeSettings
from consumer.jobs.records import JobRecord, new_job_id

__all__ = [
    "JOB_FIELDS",
    "conflict",
    "incompatibility",
    "job_record",
    "jobs_topic_clash",
    "member_settings",
    "unsupported",
]

JOB_FIELDS: frozenset[str] = frozenset(
    {
        "source_topic",
        "output_topic",
        "range_from",
        "range_to",
        "text_field",
        "documents_field",
        "value_format",
        "dimensions",
        "normalize",
        "prompt_name",
        "encoding_format",
        "top_n",
        "top_k",
        "aggregation",
        "redact",
        "chunk_max_tokens",
        "chunk_overlap",
        "chunk_output",
        "max_in_flight_records",
        "max_concurrent_sends",
        "model",
        "model_revision",
        "task",
        "default_prompt_name",
        "dlq_topic",
        "commit_interval_ms",
        "exactly_once",
    }
)
"""BackfillSettings fields a job record keeps (``model`` only when given)."""

_FROM_JOB = JOB_FIELDS | {"group_id", "progress"}


def unsupported(settings: BackfillSettings) -> str | None:
    """Why these settings cannot run as a job (a usage error at submit), or None.

    ``task=rerank`` is not run by serve's job runner yet (docs/JOBS.md §Limits): run
    ``kbatch backfill`` standalone for it.
    """
    if settings.task == "rerank":
        return "task=rerank is not supported for jobs yet: run `kbatch backfill` standalone"
    return None


def jobs_topic_clash(settings: BackfillSettings, jobs_topic: str) -> str | None:
    """Why ``jobs_topic`` cannot hold this job's record (a usage error at submit), or None: it
    is the job's own source, output or dead-letter topic (job records would mix with the data;
    an existing topic that is not compacted is refused too, by
    :func:`consumer.kafka.jobs_topic.ensure_jobs_topic`)."""
    roles = {
        settings.source_topic: "source",
        settings.output_topic: "output",
        settings.dead_letter_topic: "dead-letter",
    }
    role = roles.get(jobs_topic)
    if role is None:
        return None
    return f"--jobs-topic {jobs_topic!r} is the job's {role} topic: choose another jobs topic"


def job_record(
    settings: BackfillSettings,
    ranges: Mapping[int, tuple[int, int]],
    *,
    job_id: str | None = None,
    now_s: float | None = None,
) -> JobRecord:
    """The ``pending`` record of a job over the resolved ``ranges`` (partition → [start, end)).

    Group: ``--group-id`` when given, else ``kbatch-job.<job_id>`` (every job its own).
    """
    now = time.time() if now_s is None else now_s
    jid = job_id or new_job_id(now)
    fields = settings.model_dump(mode="json", include=set(JOB_FIELDS))
    if "model" not in settings.model_fields_set:
        fields.pop("model", None)
    fields["dlq_topic"] = settings.dead_letter_topic
    return JobRecord(
        job_id=jid,
        source_topic=settings.source_topic,
        output_topic=settings.output_topic,
        group_id=settings.group_id or f"kbatch-job.{jid}",
        ranges={p: (int(s), int(e)) for p, (s, e) in ranges.items()},
        settings=fields,
        created_at_s=now,
        updated_at_s=now,
    )


def conflict(serve: ServeSettings, job: JobRecord) -> str | None:
    """Why ``job`` may not run beside this server's live traffic at all (the job then ends
    ``failed`` with this reason instead of waiting ``pending``), or None: its consumer group is
    serve's own (joining it would rebalance live partitions into the job), or its output topic
    is serve's request, dead-letter or jobs topic (serve would read the outputs as requests,
    or they would mix with dead letters or job records), or its dead-letter topic is serve's
    request or jobs topic."""
    if job.group_id == serve.effective_group_id:
        return f"the job's group {job.group_id!r} is this server's live consumer group"
    roles = {
        serve.request_topic: "request",
        serve.dead_letter_topic: "dead-letter",
        serve.jobs_topic: "jobs",
    }
    role = roles.get(job.output_topic)
    if role is not None:
        return f"the job's output topic {job.output_topic!r} is this server's {role} topic"
    dlq = job.settings.get("dlq_topic")
    role = roles.get(dlq) if isinstance(dlq, str) and dlq != serve.dead_letter_topic else None
    if role is not None:
        return f"the job's dead-letter topic {dlq!r} is this server's {role} topic"
    return None


def incompatibility(serve: ServeSettings, job: JobRecord) -> str | None:
    """Why this serve member does not run ``job`` (another task or model), or None."""
    task = job.settings.get("task", "embed")
    if task != serve.task:
        return f"the job is for task={task}, this member serves task={serve.task}"
    model = job.settings.get("model")
    if model is not None and str(model) != str(serve.model):
        return f"the job is for model {model}, this member serves {serve.model}"
    return None


def member_settings(serve: ServeSettings, job: JobRecord) -> BackfillSettings:
    """The settings a serve member runs ``job`` with: its own client, model and run settings,
    the job's :data:`JOB_FIELDS`, the job's group.

    Raises:
        pydantic.ValidationError: the record's settings are out of bounds.
    """
    mine: dict[str, Any] = {
        name: getattr(serve, name)
        for name in BackfillSettings.model_fields
        if name in type(serve).model_fields and name not in _FROM_JOB
    }
    values: dict[str, Any] = {**mine, **job.settings}
    values.update(group_id=job.group_id, progress=False)
    return BackfillSettings(**values)
