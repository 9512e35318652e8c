"""The loop of one backfill job: read a fixed range, score it, write it, commit, stop.

::

    poll (RangeSource) → track offset → extract text ─┬─► engine.submit ─► on_outcomes ─► output
                                                      └─► dead letter (no usable text)     │
    commit ◄── OffsetTracker.complete ◄── broker ack ◄── Delivery.send ◄───────────────────┘

Rules:

1. An offset is finished only when its output record (or dead letter) is acknowledged by the
   broker; the committed offset is the lowest unfinished one (:class:`OffsetTracker`), and
   the offsets finished above it travel in the commit's metadata, so a resumed run skips them
   and a crash repeats at most the records in flight (and those finished within the last
   commit interval), never skips one.
2. A partition whose read position reached its end and whose records are all finished commits
   its end offset, so a rerun finds it done (transaction markers and compaction gaps at the
   end included).
3. Reading pauses while ``max_in_flight_records`` are read and unfinished (memory bound); at
   most ``max_concurrent_sends`` sends wait for the broker at once (see the setting).
4. A record without usable text is dead-lettered (``invalid_request``) and the job goes on; an
   output record the broker refuses (too large) is dead-lettered the same way. A dead letter
   the broker refuses (whole and cut, :class:`consumer.finish.delivery.Delivery`) leaves its offset
   unfinished: the partition cannot reach its end and the job exits non-zero, the offset still
   uncommitted for a rerun.
5. On stop (SIGTERM/SIGINT) reading stops, what was read is finished within
   ``drain_timeout_s``, and finished offsets are committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from consumer.backfill.config import BackfillSettings
from consumer.backfill.extract import ExtractError, extract_text, output_record, parse_text_path
from consumer.backfill.progress import NullProgress, ProgressSink
from consumer.backfill.summary import BackfillSummary, PartitionSummary
from consumer.batching.stats import EngineStats
from consumer.batching.types import ChunkPlan, InferenceItem, ItemOutcome
from consumer.deadline import Deadline
from consumer.finish.checkpoint import TransactionalSinkLike, checkpoint_for
from consumer.finish.delivery import Delivery, SinkLike
from consumer.finish.exactly_once import BeforeCommit
from consumer.kafka.offsets import OffsetTracker
from consumer.kafka.ranges import PartitionRange
from consumer.kafka.records import InRecord, TopicPartition
from consumer.lifecycle import STOP_NOW_HINT
from consumer.replies.builder import ReplyBuilder
from consumer.replies.task_options import window_rule
from schemas.codec import Encoding, encode_reply
from schemas.errors import EncodeError, ErrorCode
from schemas.models import ErrorInfo, Reply
from schemas.records import OutRecord

__all__ = ["BackfillJob", "BackfillSummary", "PartitionSummary"]

log = logging.getLogger("kbatch.backfill")


class RangeSourceLike(Protocol):
    """What the job needs of :class:`consumer.kafka.range_source.RangeSource`."""

    @property
    def plan(self) -> Mapping[int, PartitionRange]: ...
    @property
    def finished(self) -> frozenset[int]: ...
    async def poll(self, max_records: int, timeout_ms: int) -> list[InRecord]: ...
    async def commit(
        self, offsets: Mapping[TopicPartition, int], metadata: Mapping[TopicPartition, str]
    ) -> None: ...


class EngineLike(Protocol):
    """What the job needs of :class:`consumer.batching.engine.Engine`."""

    async def submit(
        self, items: Sequence[InferenceItem], on_outcomes: Callable[[Sequence[ItemOutcome]], None]
    ) -> list[int]: ...
    async def flush(self) -> None: ...
    async def drain(self, timeout_s: float | None = None) -> bool: ...


@dataclass(slots=True, eq=False)
class _Pending:
    record: InRecord
    generation: int
    encoding: Encoding = Encoding.JSON
    status: str = ""  # its output record's status once built


class BackfillJob:
    """Runs one job over a resolved :class:`RangeSourceLike`. One per ``kbatch backfill``.

    Args:
        settings: the job's settings.
        source: started, with its range resolved (:meth:`RangeSource.resolve`).
        sink: started.
        replies: builds the contract's reply values and dead letters for the model.
        engine: started (:class:`consumer.batching.engine.Engine`, or its fan-out); each
            submit names :meth:`on_outcomes`. None: an empty range, no model loaded.
        progress: where progress goes.
        stats: the engine's batch counters (give the same object to the engine and runner);
            the summary reports batches, mean batch size and padding efficiency from it.
        clock: monotonic seconds.
        transactions: ``--exactly-once``: the started
            :class:`~consumer.kafka.transactions.TransactionalSink`, every partition of the
            range open (``sink`` is then unused).
        trace: ``--tracing``: the job's :class:`~consumer.tracing.jobs.JobTrace`, carried by
            every item (its batches are child spans of the job's); None: no tracing.
        before_commit: awaited with the offsets just before each commit (a job member's
            progress record, docs/JOBS.md).
    """

    def __init__(
        self,
        settings: BackfillSettings,
        source: RangeSourceLike,
        sink: SinkLike,
        replies: ReplyBuilder,
        progress: ProgressSink | None = None,
        *,
        engine: EngineLike | None = None,
        stats: EngineStats | None = None,
        clock: Callable[[], float] = time.monotonic,
        transactions: TransactionalSinkLike | None = None,
        trace: object | None = None,
        before_commit: BeforeCommit | None = None,
    ) -> None:
        self.settings = settings
        self._trace = trace
        self._source = source
        self._replies = replies
        self._progress: ProgressSink = progress or NullProgress()
        self._clock = clock
        self._stats = stats or EngineStats(keep=1)
        self._topic = settings.source_topic
        self._path = parse_text_path(settings.text_field)
        self._documents_path = parse_text_path(settings.documents_field)  # rerank
        # Contract 1.1 options, the same for every record (checked by run_backfill).
        options = settings.embed_options
        self._options = options if options.any_set else None
        self._task_options = settings.task_options  # contract 1.2 (sparse, token-classify)
        profile = replies.profile
        prompt_name = options.prompt_name or profile.default_prompt_name
        self._prompt = profile.prompts.get(prompt_name, "") if prompt_name else ""
        # contract 1.3: token-classify and rerank records run in windows (no per-record
        # truncate here); embed records in chunks with --chunk-* (the prompt before each)
        chunking = settings.chunking
        self._windows = window_rule(profile.task, None, None, chunking)[0]
        self._chunk_output = chunking.output if chunking is not None else None
        self._chunking = None
        if chunking is not None:
            self._chunking = ChunkPlan(chunking.max_tokens, chunking.overlap, self._prompt)
        self._engine = engine
        self._tracker = OffsetTracker()
        self._ids = itertools.count()
        self._pending: dict[int, _Pending] = {}
        self._outcomes: list[ItemOutcome] = []
        self._delivery: Delivery[_Pending] = Delivery(
            sink,
            self._tracker,
            self,
            replies,
            what="output record",
            finish_unsent_dead_letters=False,
            max_in_flight=settings.max_concurrent_sends,
            sourced=transactions,
        )
        self._checkpoint = checkpoint_for(
            transactions,
            tracker=self._tracker,
            offsets_now=self._offsets_to_commit,
            commit_interval_s=settings.commit_interval_ms / 1000,
            commit_offsets=source.commit,
            gate=self._delivery,
            clock=clock,
            before_commit=before_commit,
        )
        self._write_scheduled = False
        self._open = 0  # records read and neither finished nor given up
        self._changed = asyncio.Event()
        self._read: dict[int, int] = {}
        self._commit_failed = False
        self.ok = 0
        self.error_replies = 0
        self.dead_lettered = 0
        self.undelivered = 0
        self.skipped_completed = 0  # finished by an earlier run (commit metadata): not again
        self._told_extract_error = False  # one WARNING per run for each, not one per record
        self._told_whole_map = False

    def committed_positions(self) -> dict[int, int]:
        """Partition → the offset committed so far (every record below it finished), for the
        partitions of the plan that have one (a job's progress record, docs/JOBS.md)."""
        out: dict[int, int] = {}
        for p in self._source.plan:
            committed = self._tracker.committed((self._topic, p))
            if committed is not None:
                out[p] = committed
        return out

    # -- the loop --------------------------------------------------------------------------------

    async def run(
        self, stop: asyncio.Event, drain_deadline: Callable[[], Deadline] | None = None
    ) -> BackfillSummary:
        """Read until every partition reached its end or ``stop`` is set; finish what was read
        and commit by ``drain_deadline()`` (asked once the reading ends; default:
        ``drain_timeout_s`` from then), and summarise. Never raises for a bad record;
        re-raises unexpected errors after the drain."""
        s = self.settings
        plan = dict(self._source.plan)
        for p, r in plan.items():
            self._read[p] = 0
            if r.remaining:
                self._tracker.assign((self._topic, p))
                self._tracker.add_completed((self._topic, p), r.completed)
        total = sum(r.remaining for r in plan.values())
        self._progress.begin(total, f"{self._topic} → {s.output_topic}")
        t0 = self._clock()
        self._checkpoint.restart_interval()
        relay = asyncio.create_task(self._relay_stop(stop))
        try:
            while not stop.is_set():
                all_read = set(plan) <= self._source.finished
                if all_read and self._open == 0:
                    break
                if all_read or self._open >= s.max_in_flight_records:
                    await self._wait_change(self._checkpoint.seconds_to_due())
                else:
                    room = s.max_in_flight_records - self._open
                    records = await self._source.poll(
                        min(s.poll_max_records, room), s.poll_timeout_ms
                    )
                    await self._take(records)
                if self._checkpoint.due():
                    await self._commit()
                    self._checkpoint.restart_interval()
        finally:
            relay.cancel()
            if drain_deadline is None:
                loop = asyncio.get_running_loop()
                drain_deadline = functools.partial(Deadline.after, s.drain_timeout_s, loop.time)
            await self._finish(stop.is_set(), drain_deadline())
        elapsed_s = self._clock() - t0
        return self._summary(plan, elapsed_s, stop.is_set())

    async def _take(self, records: list[InRecord]) -> None:
        if not records:
            return
        s = self.settings
        now = self._clock()
        items: list[InferenceItem] = []
        for r in records:
            if self._tracker.skip_completed(r.tp, r.offset):  # scored by an earlier run
                self.skipped_completed += 1
                self._read[r.partition] += 1
                self._progress.advance(1)
                continue
            generation = self._tracker.track(r.tp, r.offset)
            self._open += 1
            self._read[r.partition] += 1
            try:
                got = extract_text(
                    r.value,
                    r.headers,
                    self._path,
                    value_format=s.value_format,
                    max_text_bytes=s.max_text_bytes,
                    documents_path=self._documents_path,
                )
            except ExtractError as err:
                if not self._told_extract_error:  # the first one's reason: on the terminal
                    self._told_extract_error = True
                    log.warning(
                        "%s@%d dead-lettered: %s (the first; each dead letter's "
                        "kbatch.error.message header says why)",
                        r.tp,
                        r.offset,
                        err,
                    )
                dlq = self._replies.dead_letter(r, ErrorCode.INVALID_REQUEST, str(err))
                self._delivery.dead_letter(_Pending(r, generation), dlq, ErrorCode.INVALID_REQUEST)
                continue
            if self._path is None and not self._told_whole_map and _looks_like_a_map(r.value):
                self._told_whole_map = True
                log.warning(
                    "%s@%d looks like a JSON object: without --text-field the whole value is "
                    "the text; --text-field names the field to score",
                    r.tp,
                    r.offset,
                )
            item_id = next(self._ids)
            self._pending[item_id] = _Pending(r, generation, got.encoding)
            text = got.text if self._chunking else self._prompt + got.text
            items.append(
                InferenceItem(
                    item_id,
                    text,
                    arrival_s=now,
                    group=r.tp,
                    documents=got.documents,
                    windows=self._windows,
                    chunking=self._chunking,
                    trace=self._trace,
                )
            )
        if items:
            assert self._engine is not None, "records to score, and no engine"
            await self._engine.submit(items, self.on_outcomes)

    def on_outcomes(self, outcomes: Sequence[ItemOutcome]) -> None:
        """The engine's callback (loop thread): queue a batch's outcomes; they are written two
        loop turns later.

        The engine delivers a batch's outcomes before its dispatcher has started the next
        batch, so encoding and sending them right here would keep the model idle for that
        work (about 0.3 ms a record on a 2-core CPU: ~8 % of backfill throughput, measured).
        Turn 1 runs after the dispatcher's step, which queues the next batch's task; turn 2
        runs after that task has handed the batch to the model thread.
        """
        self._outcomes.extend(outcomes)
        if not self._write_scheduled:
            self._write_scheduled = True
            loop = asyncio.get_running_loop()
            loop.call_soon(loop.call_soon, self._write_outcomes)

    def _write_outcomes(self) -> None:
        self._write_scheduled = False
        outcomes, self._outcomes = self._outcomes, []
        batch: list[tuple[_Pending, OutRecord]] = []
        for outcome in outcomes:
            pending = self._pending.pop(outcome.item_id, None)
            if pending is not None:
                batch.append((pending, self._output(pending, outcome)))
        self._delivery.send(batch)

    def _output(self, pending: _Pending, outcome: ItemOutcome) -> OutRecord:
        """The output record of one outcome; its status on ``pending``."""
        r = pending.record
        try:
            reply = self._replies.reply(
                outcome,
                options=self._options,
                task_options=self._task_options,
                chunk_output=self._chunk_output,
            )
            value = encode_reply(reply, pending.encoding)
        except (ValueError, EncodeError) as err:  # e.g. an embedding value overflowing float32
            log.warning("result of %s@%d cannot be encoded: %s", r.tp, r.offset, err)
            reply = Reply(
                status="error",
                error=ErrorInfo(
                    code=ErrorCode.INFERENCE_FAILED,
                    message=f"the result could not be encoded: {type(err).__name__}",
                ),
                model=self._replies.model,
                truncated=outcome.truncated,
            )
            value = encode_reply(reply, pending.encoding)
        pending.status = reply.status
        return output_record(
            topic=self.settings.output_topic,
            key=r.key,
            value=value,
            encoding=pending.encoding,
            status=reply.status,
            source_topic=r.topic,
            source_partition=r.partition,
            source_offset=r.offset,
        )

    # -- delivery (see consumer.finish.delivery) ----------------------------------------------

    def on_delivered(self, delivered: Sequence[tuple[_Pending, OutRecord]]) -> None:
        """Delivery: these output records were acknowledged."""
        for pending, _ in delivered:
            if pending.status == "ok":
                self.ok += 1
            else:
                self.error_replies += 1

    def on_dead_lettered(
        self, pending: _Pending, code: ErrorCode, sent: bool, reply_sent: bool
    ) -> None:
        """Delivery: ``pending``'s dead letter was acknowledged, or refused even cut."""
        if sent:
            self.dead_lettered += 1
        else:
            r = pending.record
            log.error("dead letter of %s@%d not delivered", r.tp, r.offset)
            self.undelivered += 1

    def on_finished(self, pending: _Pending, completed: bool) -> None:
        """Delivery: ``pending`` needs nothing more (finished in the tracker, or given up)."""
        self._open -= 1
        if completed:
            self._progress.advance(1)
        self._wake_if_needed()

    async def _wait_change(self, timeout_s: float) -> None:
        """Wait until the loop has something to do (see :meth:`_wake_if_needed`), a stop, or
        ``timeout_s`` (the next commit)."""
        self._changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout_s)

    def _wake_if_needed(self) -> None:
        # Only the transitions the loop waits for: everything finished, or room to read again.
        if self._open == 0 or self._open == self.settings.max_in_flight_records - 1:
            self._changed.set()

    async def _relay_stop(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self._changed.set()

    # -- commit and shutdown ------------------------------------------------------------------

    def _offsets_to_commit(self) -> dict[TopicPartition, int]:
        """The tracker's committable offsets, and the end offset of each partition read to
        its end with every record finished (rule 2)."""
        offsets = self._tracker.committable()
        plan = self._source.plan
        for p in self._source.finished:
            tp = (self._topic, p)
            if (
                not self._end_committed(p)
                and self._tracker.generation(tp) is not None
                and self._tracker.pending(tp) == 0
            ):
                offsets[tp] = plan[p].end
        return offsets

    def _end_committed(self, p: int) -> bool:
        committed = self._tracker.committed((self._topic, p))
        return committed is not None and committed >= self._source.plan[p].end

    async def _commit(self) -> bool:
        """Commit through the checkpoint; False when a plain commit failed."""
        return (await self._checkpoint.commit()).ok

    async def _finish(self, stopped: bool, deadline: Deadline) -> None:
        if stopped:  # a slow drain must not look like a hang
            log.info(
                "stopping: finishing %d record(s) in flight: scoring them, sending the "
                "results and committing (at most %.0f s of --drain-timeout-s %g; the rest is "
                "for closing the clients); %s",
                self._open,
                deadline.remaining_s(),
                self.settings.drain_timeout_s,
                STOP_NOW_HINT,
            )
        if self._engine is not None:  # None: an empty range, no model loaded
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._engine.flush(), deadline.remaining_s())
            await self._engine.drain(deadline.remaining_s())
        self._write_outcomes()  # outcomes still waiting for their turn (see on_outcomes)
        left = await self._delivery.wait(deadline.remaining_s())
        if left:
            log.error("%d record(s) still unacknowledged at the drain deadline", left)
        self._commit_failed = not await self._commit()
        self._progress.end()

    def _summary(
        self, plan: Mapping[int, PartitionRange], elapsed_s: float, stopped: bool
    ) -> BackfillSummary:
        finished = self._source.finished
        parts: list[PartitionSummary] = []
        for p, r in sorted(plan.items()):
            reached = r.remaining == 0 or (p in finished and self._end_committed(p))
            parts.append(
                PartitionSummary(
                    partition=p,
                    range_start=r.range_start,
                    start=r.start,
                    end=r.end,
                    resumed_from=r.resumed_from,
                    records_read=self._read.get(p, 0),
                    reached_end=reached,
                )
            )
        done = self.ok + self.error_replies + self.dead_lettered
        s = self.settings
        return BackfillSummary(
            source_topic=s.source_topic,
            output_topic=s.output_topic,
            dlq_topic=s.dead_letter_topic,
            group_id=s.effective_group_id,
            complete=all(p.reached_end for p in parts) and not self._commit_failed,
            stopped=stopped,
            records_read=sum(self._read.values()),
            ok=self.ok,
            error_replies=self.error_replies,
            dead_lettered=self.dead_lettered,
            undelivered=self.undelivered,
            elapsed_s=round(elapsed_s, 3),
            records_per_s=round(done / elapsed_s, 1) if elapsed_s > 0 else 0.0,
            batches=self._stats.batches,
            mean_batch_size=round(self._stats.items / max(1, self._stats.batches), 1),
            padding_efficiency=round(self._stats.padding_efficiency, 4),
            partitions=tuple(parts),
            skipped_completed=self.skipped_completed,
        )


def _looks_like_a_map(value: bytes | None) -> bool:
    """Whether ``value`` (read as text) is a JSON object: its first and last non-blank bytes
    are braces."""
    if not value:
        return False
    # Bounded slices: this runs for every record until it first answers True.
    return value[:64].lstrip()[:1] == b"{" and value[-64:].rstrip()[-1:] == b"}"
