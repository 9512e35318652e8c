"""``kbatch backfill submit | status | cancel``: write and read the jobs topic (docs/JOBS.md)."""

from __future__ import annotations

import time

from consumer.backfill.app import ensure_output_topics
from consumer.backfill.config import BackfillSettings
from consumer.config import project
from consumer.jobs.records import (
    JobRecord,
    JobStatus,
    JobTable,
    RecordError,
    encode_record,
    is_terminal,
    new_job_id,
    record_key,
)
from consumer.jobs.spec import job_record
from consumer.kafka.config import KafkaClientSettings
from consumer.kafka.jobs_topic import ensure_jobs_topic, read_jobs_topic, write_jobs_record
from consumer.kafka.transport import range_reader

__all__ = ["JobNotFoundError", "cancel_job", "job_statuses", "submit_job"]


class JobNotFoundError(LookupError):
    """No job of that id in the jobs topic."""


async def submit_job(
    settings: BackfillSettings, jobs_topic: str, *, jobs_replication_factor: int | None = None
) -> JobRecord:
    """Resolve the range now (every member then agrees on each partition's end), create the
    output, dead-letter and jobs topics when missing, and write the ``pending`` job record.
    ``jobs_replication_factor``: replicas of a created jobs topic (default: the cluster's;
    :func:`consumer.kafka.jobs_topic.ensure_jobs_topic`).

    Raises:
        RangeSourceError: the source topic does not exist or the broker cannot be reached.
        RangeSpecError: a ``P:OFFSET`` bound names a partition the topic does not have.
        JobsTopicError / KafkaUnavailableError: the jobs topic cannot be created or written.
    """
    client = project(KafkaClientSettings, settings)
    job_id = new_job_id()
    group = settings.group_id or f"kbatch-job.{job_id}"
    source = range_reader(client, topic=settings.source_topic, group_id=group)
    await source.start()
    try:
        plan = await source.resolve(settings.from_bound, settings.to_bound)
    finally:
        await source.stop()
    await ensure_output_topics(settings, len(plan))
    await ensure_jobs_topic(client, jobs_topic, replication_factor=jobs_replication_factor)
    record = job_record(
        settings, {p: (r.range_start, r.end) for p, r in plan.items()}, job_id=job_id
    )
    await write_jobs_record(client, jobs_topic, record_key(record.job_id), encode_record(record))
    return record


async def read_table(client: KafkaClientSettings, jobs_topic: str) -> JobTable:
    """The jobs topic's latest records (bad records skipped).

    Raises:
        JobsTopicError / KafkaUnavailableError: it cannot be read.
    """
    table = JobTable()
    for key, value in await read_jobs_topic(client, jobs_topic):
        try:
            table.apply(key, value)
        except RecordError:
            continue
    return table


async def job_statuses(
    client: KafkaClientSettings, jobs_topic: str, job_id: str | None = None
) -> list[JobStatus]:
    """Every job's status (oldest first), or ``job_id``'s alone.

    Raises:
        JobNotFoundError: no job ``job_id``.
        JobsTopicError / KafkaUnavailableError: the jobs topic cannot be read.
    """
    table = await read_table(client, jobs_topic)
    now = time.time()
    if job_id is None:
        return table.statuses(now)
    if job_id not in table.jobs:
        raise JobNotFoundError(f"no job {job_id!r} in {jobs_topic}")
    return [table.status(job_id, now)]


async def cancel_job(client: KafkaClientSettings, jobs_topic: str, job_id: str) -> JobRecord:
    """Write ``cancelled`` to the job's record (a job already ended is left as it is); the
    members stop reading when they see it, finish and commit what is in flight.

    Raises:
        JobNotFoundError: no job ``job_id``.
        JobsTopicError / KafkaUnavailableError: the jobs topic cannot be read or written.
    """
    table = await read_table(client, jobs_topic)
    job = table.jobs.get(job_id)
    if job is None:
        raise JobNotFoundError(f"no job {job_id!r} in {jobs_topic}")
    if is_terminal(job.state):
        return job
    record = job.with_state("cancelled", time.time(), reason="cancelled by kbatch backfill cancel")
    await write_jobs_record(client, jobs_topic, record_key(job_id), encode_record(record))
    return record
