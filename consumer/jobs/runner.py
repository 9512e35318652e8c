"""Serve's job runner: watch the jobs topic, run each runnable job with a :class:`JobWorker`.

Every serve member reads the whole compacted jobs topic from its beginning (no group: each
sees every record) into a :class:`~consumer.jobs.records.JobTable`, and after each poll
reconciles: a job that is ``pending`` (not terminal) and compatible with this member's model and
task gets a worker, unless this member already ran it to its end; a job that became terminal
(``cancelled`` by ``kbatch backfill cancel``, ``completed`` or ``failed`` by a member) has its
worker stopped (reading stops at once, what was read is finished and committed).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time

from consumer.config import ServeSettings, project
from consumer.jobs.job_engine import BulkFlow, JobEngine, RoutingEngine
from consumer.jobs.records import (
    JobState,
    JobTable,
    MemberProgress,
    RecordError,
    encode_record,
    end_state,
    is_terminal,
    record_key,
    sum_counts,
)
from consumer.jobs.spec import conflict, incompatibility, member_settings
from consumer.jobs.worker import JobWorker
from consumer.kafka.config import KafkaClientSettings
from consumer.kafka.jobs_topic import JobsTopicReader, JobsTopicWriter, ensure_jobs_topic
from consumer.replies.builder import ReplyBuilder

__all__ = ["JobRunner", "member_id"]

log = logging.getLogger("kbatch.jobs")


def member_id() -> str:
    """``host-pid-xxxx``: unique per serve process."""
    host = socket.gethostname().split(".")[0] or "host"
    return f"{host}-{os.getpid()}-{secrets.token_hex(2)}"


class JobRunner:
    """Runs the jobs of the jobs topic on this serve member.

    Args:
        settings: serve's settings (``jobs_topic``, the client, the model and task).
        engine: serve's engine (each job's items go to its bulk lane through a :class:`JobEngine`).
        flow: serve's flow control (jobs count toward its totals and stop reading while bulk
            sources should pause); ``None``: not counted.
        replies: serve's reply builder.
        member: this member's id (default :func:`member_id`).
        session_timeout_ms: every job group's session timeout.
    """

    def __init__(
        self,
        settings: ServeSettings,
        engine: RoutingEngine,
        replies: ReplyBuilder,
        *,
        flow: BulkFlow | None = None,
        member: str | None = None,
        session_timeout_ms: int | None = None,
        tracer: object | None = None,
    ) -> None:
        self.settings = settings
        self._tracer = tracer  # --tracing: each assignment is a job span (consumer.tracing.jobs)
        self.topic = settings.jobs_topic
        self.member = member or member_id()
        self._engine = engine
        self._flow = flow
        self._replies = replies
        self._client = project(KafkaClientSettings, settings)
        self._session_timeout_ms = session_timeout_ms or settings.session_timeout_ms
        self._reader = JobsTopicReader(self._client, self.topic)
        self._writer = JobsTopicWriter(self._client, self.topic)
        self.table = JobTable()
        self._workers: dict[str, tuple[JobWorker, asyncio.Task[None]]] = {}
        self._ended: set[str] = set()  # jobs this member ran to their end: never again
        self._skipped: set[str] = set()  # incompatible jobs (logged once)
        self._pending_writes: set[asyncio.Future[None]] = set()  # conflicting jobs' "failed"
        self._task: asyncio.Task[None] | None = None

    async def start(self, stop: asyncio.Event) -> None:
        """Create the jobs topic when missing, connect, start watching until ``stop``.

        Raises:
            KafkaUnavailableError: no broker answered.
            JobsTopicError: the topic cannot be created or read.
        """
        await ensure_jobs_topic(
            self._client,
            self.topic,
            replication_factor=self.settings.jobs_topic_replication_factor,
            request_topic=self.settings.request_topic,
            create=self.settings.create_topics,
        )  # logs its replicas when it creates the topic, warns when it is less durable
        await self._writer.start()
        await self._reader.start()
        self._task = asyncio.create_task(self._watch(stop), name="kbatch-jobs")
        log.info("job runner %s watching %s", self.member, self.topic)

    async def stop(self) -> None:
        """Stop every worker (each finishes and commits what it read), then close."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._stop_workers()
        if self._pending_writes:
            await asyncio.wait(self._pending_writes, timeout=self.settings.drain_timeout_s)
        await self._reader.stop()
        await self._writer.stop()

    # -- the bus the workers use ---------------------------------------------------------------

    async def publish(self, progress: MemberProgress) -> None:
        """Write a progress record (and apply it at once: status of this member is current)."""
        key = record_key(progress.job_id, progress.member)
        value = encode_record(progress)
        self.table.apply(key, value)
        await self._writer.write(key, value)

    async def end_job(self, job_id: str, state: JobState, reason: str | None) -> None:
        """Declare ``job_id`` ``completed`` or ``failed`` unless its record is already terminal
        (the one-writer rule of :mod:`consumer.jobs.records`); ``completed`` becomes ``failed``
        when every record failed (:func:`consumer.jobs.records.end_state`)."""
        self._ended.add(job_id)
        job = self.table.jobs.get(job_id)
        if job is None or is_terminal(job.state):
            return
        counts = sum_counts(self.table.members_of(job_id))
        if state == "completed":
            state, reason = end_state(counts)
        record = job.with_state(state, time.time(), reason=reason, counts=counts)
        value = encode_record(record)
        self.table.apply(record_key(job_id), value)
        await self._writer.write(record_key(job_id), value)
        log.info("job %s %s: %s", job_id, state, counts)

    # -- the watch loop ------------------------------------------------------------------------

    async def _watch(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                for key, value in await self._reader.poll(500):
                    try:
                        self.table.apply(key, value)
                    except RecordError as err:
                        log.warning("jobs topic %s: record %r skipped: %s", self.topic, key, err)
                self._reconcile()
            except asyncio.CancelledError:
                raise
            except Exception as err:  # the runner never takes serve down
                log.error("job runner: %s", err)
                await asyncio.sleep(1.0)
        await self._stop_workers()

    def _reconcile(self) -> None:
        for job_id, (worker, task) in list(self._workers.items()):
            job = self.table.jobs.get(job_id)
            if task.done():
                del self._workers[job_id]
                self._ended.add(job_id)
            elif job is None or is_terminal(job.state):
                worker.stop()
        for job_id, job in self.table.jobs.items():
            if is_terminal(job.state) or job_id in self._workers or job_id in self._ended:
                continue
            clash = conflict(self.settings, job)
            if clash is not None:
                log.error("job %s failed: %s", job_id, clash)
                self._ended.add(job_id)
                write = asyncio.ensure_future(self.end_job(job_id, "failed", clash))
                self._pending_writes.add(write)
                write.add_done_callback(self._pending_writes.discard)
                continue
            why = incompatibility(self.settings, job)
            if why is not None:
                if job_id not in self._skipped:
                    self._skipped.add(job_id)
                    log.warning("job %s not run by this member: %s", job_id, why)
                continue
            try:
                settings = member_settings(self.settings, job)
            except ValueError as err:
                self._ended.add(job_id)
                log.error("job %s has invalid settings: %s", job_id, err)
                continue
            worker = JobWorker(
                job,
                settings,
                engine=JobEngine(self._engine, job_id, self._flow),
                replies=self._replies,
                bus=self,
                member=self.member,
                session_timeout_ms=self._session_timeout_ms,
                tracer=self._tracer,
            )
            log.info("job %s: joining group %s", job_id, job.group_id)
            self._workers[job_id] = (worker, asyncio.create_task(worker.run(), name=job_id))

    async def _stop_workers(self) -> None:
        for worker, _ in self._workers.values():
            worker.stop()
        tasks = [task for _, task in self._workers.values()]
        if tasks:
            await asyncio.wait(tasks, timeout=self.settings.drain_timeout_s)
        self._workers.clear()
