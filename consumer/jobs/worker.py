"""One serve member's share of one job: join the job's group, score what it is assigned, report.

::

    GroupRangeSource (job's group) ─► assignment ─► BackfillJob (plan of the assigned
    partitions) ─► JobEngine (bulk lane of serve's engine) ─► output topic ─► commit
        └─ revoked: the BackfillJob stops reading, finishes what it read, commits (in the
           revoke callback, before the partitions move)

The member publishes a :class:`~consumer.jobs.records.MemberProgress` every
``progress_interval_s`` and at each change of state; when its partitions are at their end it
keeps its place in the group (to take over a dead member's partitions) and checks the group's
committed offsets: once every partition is at its end it declares the job ``completed``
(docs/JOBS.md §One writer).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from consumer.backfill.config import BackfillSettings
from consumer.backfill.job import BackfillJob, BackfillSummary
from consumer.config import project
from consumer.finish.checkpoint import DeliveryMode
from consumer.jobs.job_engine import JobEngine
from consumer.jobs.records import JobCounts, JobRecord, JobState, MemberProgress, MemberState
from consumer.kafka.config import KafkaClientSettings, SinkSettings
from consumer.kafka.errors import KafkaLayerError
from consumer.kafka.records import TopicPartition
from consumer.kafka.transport import AssignedRangeReader, group_range_reader
from consumer.replies.builder import ReplyBuilder

__all__ = ["JobBus", "JobWorker"]

log = logging.getLogger("kbatch.jobs")


class JobBus(Protocol):
    """What a worker tells the runner (which owns the jobs topic)."""

    async def publish(self, progress: MemberProgress) -> None: ...
    async def end_job(self, job_id: str, state: JobState, reason: str | None) -> None: ...


class JobWorker:
    """Runs ``job`` on this member until it is complete, cancelled, failed, or serve stops.

    Args:
        job: the job's record.
        settings: :func:`consumer.jobs.spec.member_settings` of it.
        engine: this job's view of serve's engine (:class:`consumer.jobs.job_engine.JobEngine`).
        replies: serve's reply builder (the loaded model's info and profile); the job's dead
            letters go to the job's own ``dlq_topic`` (``settings.dead_letter_topic``), not
            serve's.
        bus: where progress and the job's end go.
        member: this member's id.
        progress_interval_s: seconds between progress records while running.
        session_timeout_ms: the job group's session timeout (a killed member's partitions
            move to the others after it).
    """

    def __init__(
        self,
        job: JobRecord,
        settings: BackfillSettings,
        *,
        engine: JobEngine,
        replies: ReplyBuilder,
        bus: JobBus,
        member: str,
        progress_interval_s: float = 1.0,
        session_timeout_ms: int = 10_000,
        wall_clock: Callable[[], float] = time.time,
        tracer: object | None = None,
    ) -> None:
        self.job = job
        self._tracer: Any = tracer  # an OpenTelemetry Tracer (typed here without the extra)
        self.settings = settings
        self._engine = engine
        self._replies = replies.with_dlq_topic(settings.dead_letter_topic)
        self._bus = bus
        self.member = member
        self._interval_s = progress_interval_s
        self._wall = wall_clock
        client = project(KafkaClientSettings, settings)
        self._mode = DeliveryMode.build(  # --exactly-once: a producer per assigned partition
            client,
            project(SinkSettings, settings),
            exactly_once=settings.exactly_once,
            default_topic=settings.output_topic,
            group_id=job.group_id,
            id_prefix="kbatch-job",
        )
        self._source = group_range_reader(
            client,
            topic=job.source_topic,
            group_id=job.group_id,
            ranges=job.ranges,
            session_timeout_ms=session_timeout_ms,
            heartbeat_interval_ms=max(100, session_timeout_ms // 6),
            client_id=f"kbatch-job-{member}",
        )
        self._source.on_revoke = self._on_revoke
        self._source.pause_reading = engine.should_pause_reading
        self._stop = asyncio.Event()
        self._run_stop = asyncio.Event()
        self._running: asyncio.Task[BackfillSummary] | None = None
        self._current: BackfillJob | None = None
        self._assigned: AssignedRangeReader | None = None
        self._positions: dict[int, int] = {}
        self._counts = JobCounts()
        self.state: MemberState = "idle"

    # -- control -------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop (cancel, end of job, serve stopping): reading stops at once, queued items are
        dropped (:meth:`JobEngine.stop_computing`), the running batch and the sends finish,
        what is finished is committed, then the member leaves the job's group."""
        self._stop.set()
        self._run_stop.set()
        self._engine.stop_computing()

    async def run(self) -> None:
        """Run until :meth:`stop` or the job's end; never raises (a failure ends the job
        ``failed`` with the reason)."""
        reason: str | None = None
        try:
            await self._mode.sink.start()
            await self._source.start()
            await self._publish("idle")
            last = 0.0
            while not self._stop.is_set():
                partitions = await self._source.next_assignment(timeout_s=0.5)
                if partitions:
                    await self._run_assignment(await self._plan(partitions))
                if self._stop.is_set():
                    break
                if await self._source.all_at_end():
                    await self._publish("idle")
                    await self._bus.end_job(self.job.job_id, "completed", None)
                    break
                if self._wall() - last >= self._interval_s:
                    await self._publish("idle")
                    last = self._wall()
        except (KafkaLayerError, OSError, ValueError) as err:
            reason = f"member {self.member}: {err}"
            log.error("job %s failed: %s", self.job.job_id, reason)
        except Exception as err:  # a bug: the job fails, serve goes on
            reason = f"member {self.member}: {type(err).__name__}: {err}"
            log.exception("job %s failed", self.job.job_id)
        finally:
            with contextlib.suppress(Exception):
                await self._finish_run()
            self._engine.close()
            for part in (self._source.stop, self._mode.sink.stop):
                with contextlib.suppress(Exception):
                    await part()
            with contextlib.suppress(Exception):
                await self._publish("failed" if reason else "stopped", reason)
                if reason:
                    await self._bus.end_job(self.job.job_id, "failed", reason)

    # -- one assignment ------------------------------------------------------------------------

    async def _run_assignment(self, assigned: AssignedRangeReader) -> None:
        self._run_stop = asyncio.Event()
        if self._stop.is_set():
            self._run_stop.set()
        trace = None
        if self._tracer is not None:  # --tracing: this assignment's batches in one trace
            from consumer.tracing.jobs import start_job_span

            trace = start_job_span(
                self._tracer,
                topic=self.job.source_topic,
                task=self.settings.task,
                job_id=self.job.job_id,
            )
        job = BackfillJob(
            self.settings,
            assigned,
            self._mode.sink,
            self._replies,
            engine=self._engine,
            transactions=self._mode.transactions,
            trace=trace,
            before_commit=self._before_commit,
        )
        self._engine.resume_computing()  # after the last assignment's stop_computing()
        self._current, self._assigned = job, assigned
        self._positions.update(assigned.positions())
        log.info(
            "job %s: assigned partitions %s of %s",
            self.job.job_id,
            sorted(assigned.plan),
            self.job.source_topic,
        )
        running = self._running = asyncio.create_task(job.run(self._run_stop))
        await self._publish("running")
        while not running.done():
            await asyncio.wait({running}, timeout=self._interval_s)
            if not running.done():
                await self._publish("running")
        try:
            await self._finish_run()
        finally:
            if trace is not None:
                trace.end(not job.undelivered, "dead letters undelivered")
        await self._publish("idle")

    async def _finish_run(self) -> None:
        """Stop the running assignment, wait for its drain and commit, and count it."""
        running, job = self._running, self._current
        if running is None or job is None:
            return
        self._run_stop.set()
        self._engine.stop_computing()  # at most the running batch is finished, not all read
        summary = await asyncio.shield(running)
        if self._running is not running:  # the revoke callback and the loop both waited
            return
        self._running = self._current = None
        self._counts = self._live_counts(job)
        self._positions.update(job.committed_positions())
        if job.undelivered:
            raise ValueError(f"{job.undelivered} dead letter(s) could not be delivered")
        log.info(
            "job %s: assignment ended (%d read, %d ok)",
            self.job.job_id,
            summary.records_read,
            summary.ok,
        )

    async def _before_commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Publish progress with the offsets about to be committed: the counts published are
        never behind the committed offsets, so a member that takes a partition over after a
        kill -9 never leaves records uncounted (it may count again what was written after the
        commit: at-least-once, as the output topic)."""
        self._positions.update({tp[1]: offset for tp, offset in offsets.items()})
        try:
            await self._publish("running")
        except KafkaLayerError as err:  # progress only: the commit goes on
            log.warning("job %s: progress not written: %s", self.job.job_id, err)

    async def _on_revoke(self) -> None:
        """The job's group is rebalancing: drop what is queued, finish the running batch and
        the sends, commit before the partitions move (well inside the rebalance timeout)."""
        if self._running is not None:
            log.info("job %s: partitions revoked, finishing what was read", self.job.job_id)
            await self._finish_run()
        await self._mode.close_partitions()  # committed: what is open now is empty

    async def _plan(self, partitions: list[int]) -> AssignedRangeReader:
        """The plan of the assigned ``partitions``, read once ``--exactly-once`` opened their
        producers (fencing the previous owner)."""
        tps = [(self.job.source_topic, p) for p in partitions]
        return await self._mode.read_back(tps, lambda: self._source.plan(partitions))

    # -- reporting -----------------------------------------------------------------------------

    def _live_counts(self, job: BackfillJob | None) -> JobCounts:
        """The counts of the assignments that ended, plus ``job``'s (the running one)."""
        if job is None:
            return self._counts
        return self._counts + JobCounts(
            done=job.ok, failed=job.error_replies + job.dead_lettered, skipped=job.skipped_completed
        )

    async def _publish(self, state: MemberState, reason: str | None = None) -> None:
        self.state = state
        if self._current is not None:
            for p, offset in self._current.committed_positions().items():
                self._positions[p] = max(offset, self._positions.get(p, offset))
        await self._bus.publish(
            MemberProgress(
                job_id=self.job.job_id,
                member=self.member,
                state=state,
                positions=dict(self._positions),
                counts=self._live_counts(self._current),
                updated_at_s=self._wall(),
                reason=reason,
            )
        )
