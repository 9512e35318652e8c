"""The one readable flow of ``kbatch serve``.

    poll → decode → (task, deadline) → dedup → engine.submit ─┐
                                                              ▼ (engine: buckets → batches → model)
    commit ◄─ offsets.complete ◄─ broker ack ◄─ delivery.send ◄─ on_outcomes → replies (+ copies)

Rules this module keeps (CONTRACT.md §Delivery):

* An offset is finished only when its reply or dead letter is acknowledged by the broker; the
  committed offset never passes an unfinished record (:class:`OffsetTracker`).
* Offsets answered above the committed one travel in the commit's metadata; a new owner
  skips them on intake, so a crash repeats only the records in flight (:mod:`offset_metadata`).
* A key in flight or answered within the dedup window is never computed twice (:class:`DedupCache`).
* A burst pauses partitions instead of growing memory (:class:`FlowControl`); polling goes on
  while paused so the member stays in its group.
* Commits, their kb1 metadata, the lag base and the read-back at assignment are the
  checkpoint's (:mod:`consumer.checkpoint`), plain or ``--exactly-once`` (each partition's
  replies and offsets in its own Kafka transaction), chosen once when the pipeline is built.
* A revoke waits for nothing slow: it holds the revoked partitions' new replies, waits for
  the replies already sent (one broker round trip) and commits what is finished, with its kb1
  metadata, at once. Their work (queued, running, answered and held) is kept until the new
  assignment: a partition given back to this member without a break goes on where it was
  (nothing recomputed, the held replies sent); one that moved has its queued work cancelled,
  its running work forgotten and its held replies dropped — the next owner computes those
  records (:mod:`consumer.handover`).
* ``--exactly-once``: a partition whose transaction failed without a fence is rewound in place
  (new producer, committed offset, computed again: :meth:`Pipeline.commit`); the member
  stops only when a producer was fenced (issue 36 item 1).

Policy objects decide; this class does the I/O. Kafka I/O lives in :mod:`consumer.kafka`, the
model behind :class:`EngineLike`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from consumer.batching.engine import EngineClosedError
from consumer.batching.types import ChunkPlan, InferenceItem, ItemOutcome, Lane
from consumer.config import ServeSettings, project
from consumer.deadline import Deadline
from consumer.finish.checkpoint import Committed, TransactionalSinkLike, checkpoint_for
from consumer.finish.delivery import Delivery, SinkLike
from consumer.kafka.errors import KafkaUnavailableError, TransactionError
from consumer.kafka.flow import FlowConfig, FlowControl
from consumer.kafka.offsets import OffsetTracker
from consumer.kafka.records import InRecord, TopicPartition
from consumer.options import EmbedOptions, OptionError, admit_options, dedup_key, prompted_text
from consumer.replies.builder import ReplyBuilder
from consumer.replies.task_options import NEW_TASKS, check_task_options, window_rule
from consumer.replies.topic_policy import ReplyTopicPolicy
from consumer.serve.dedup import DedupCache, DedupKind
from consumer.serve.handover import NO_MEMBERSHIP, Handover, Membership, handover
from consumer.serve.metrics import Metrics
from schemas.errors import ErrorCode
from schemas.headers import STATUS, last_value
from schemas.records import (
    OutRecord,
    ParsedRequest,
    RecordDecodeError,
    parse_request_record,
)

if TYPE_CHECKING:
    from consumer.tracing.requests import RequestTracing

log = logging.getLogger(__name__)

REVOKE_SHARE = 0.8
"""The part of ``rebalance_timeout_ms`` a revoke may spend on its commit (the rest is the
margin for the member to rejoin in time)."""

REVOKE_SENDS_WAIT_S = 1.0
"""At most this long a revoke waits for the revoked partitions' replies already sent (one
broker round trip normally); a reply acknowledged later is committed only if the partition
comes back (else the next owner answers its record again: at-least-once)."""

LAG_REFRESH_S = 1.0
"""How often ``kbatch_consumer_lag`` asks the broker for the log end offsets (seconds)."""

COMMIT_RESERVE_S = 1.0
"""Seconds of a drain or revoke deadline kept for its final commit (at most a quarter of it)."""


class SourceLike(Protocol):
    """What the pipeline needs of :class:`consumer.kafka.source.KafkaSource`."""

    async def poll(self, max_records: int, timeout_ms: int) -> list[InRecord]: ...
    async def commit(
        self, offsets: dict[TopicPartition, int], metadata: dict[TopicPartition, str]
    ) -> None: ...
    async def committed_metadata(self, tp: TopicPartition) -> tuple[int | None, str]: ...
    def pause(self, tps: frozenset[TopicPartition]) -> None: ...
    def resume(self, tps: frozenset[TopicPartition]) -> None: ...
    async def end_offsets(self, tps: frozenset[TopicPartition]) -> dict[TopicPartition, int]: ...
    async def position(self, tp: TopicPartition) -> int | None: ...
    def seek(self, tp: TopicPartition, offset: int) -> None: ...
    def membership(self) -> Membership: ...


class EngineLike(Protocol):
    """What the pipeline needs of :class:`consumer.batching.engine.Engine`."""

    async def submit(self, items: Sequence[InferenceItem]) -> list[int]: ...
    def cancel_group(self, group: object) -> list[int]: ...
    async def flush(self) -> None: ...


FIRST_POLL_RECORDS = 64
"""``max_records`` of the first poll after start-up or an empty poll; each non-empty poll doubles
it up to ``poll_max_records`` (a 500-record first chunk delayed the first reply by its whole
decode)."""


@dataclass(slots=True, eq=False)
class Pending:
    """One request record between poll and broker acknowledgement."""

    record: InRecord
    generation: int
    parsed: ParsedRequest | None = None
    n_tokens: int = 0
    item_id: int | None = None
    dedup_of: int | None = None
    dedup_key: bytes = b""
    """The key its computation is shared under (:func:`consumer.options.dedup_key`)."""
    status: str = ""
    """Its reply's ``kbatch-status`` once built (the ``kbatch_replies_total`` label)."""
    lane: Lane = "live"
    """Its request's ``priority`` (contract 1.2), once admitted: the engine lane it rides."""
    trace: object | None = None
    """Its request span under ``--tracing`` (:mod:`consumer.tracing.requests`), else None."""


class Pipeline:
    """Owns the policy objects and does the I/O they decide on. One per ``kbatch serve``.

    ``transactions`` (``--exactly-once``): the
    :class:`~consumer.kafka.transactions.TransactionalSink` that sends and commits per input
    partition (``sink`` is then unused); it picks the checkpoint, once
    (:func:`consumer.checkpoint.checkpoint_for`).

    ``tracing`` (``--tracing``): makes each request's span and puts its ``traceparent`` on the
    reply (:mod:`consumer.tracing.requests`); None (the default) adds nothing per record.
    """

    def __init__(
        self,
        settings: ServeSettings,
        sink: SinkLike,
        replies: ReplyBuilder,
        metrics: Metrics,
        clock: Callable[[], float] = time.monotonic,
        wall_clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
        transactions: TransactionalSinkLike | None = None,
        tracing: RequestTracing | None = None,
    ) -> None:
        self.settings = settings
        self._tracing = tracing
        self._replies = replies
        self._reply_topics = ReplyTopicPolicy(
            reply_topic=settings.reply_topic,
            request_topic=settings.request_topic,
            dlq_topic=settings.dead_letter_topic,
            allowed_pattern=settings.allowed_reply_topics,
            clock=clock,
        )
        self._metrics = metrics
        self._clock = clock
        self._wall_ms = wall_clock_ms
        self.tracker = OffsetTracker()
        self.flow = FlowControl(project(FlowConfig, settings))
        self.dedup: DedupCache[Pending, ItemOutcome] = DedupCache(
            ttl_s=settings.dedup_ttl_s, max_entries=settings.dedup_max_entries
        )
        self._ids = itertools.count()
        self._computing: dict[int, Pending] = {}  # item id → the record that asked for it
        self._progress = asyncio.Event()
        self._source: SourceLike | None = None
        self._engine: EngineLike | None = None
        self._delivery: Delivery[Pending] = Delivery(
            sink,
            self.tracker,
            self,
            replies,
            sourced=transactions,
            on_dead_letters_denied=self._dead_letters_denied,
        )
        self.checkpoint = checkpoint_for(
            transactions,
            tracker=self.tracker,
            offsets_now=self.tracker.committable,
            commit_interval_s=settings.commit_interval_ms / 1000,
            commit_offsets=lambda offsets, metadata: self.source.commit(
                dict(offsets), dict(metadata)
            ),
            gate=self._delivery,
            clock=clock,
        )
        self.intake_blocked: str | None = None
        """Why intake is paused for good (the dead-letter topic denied), else None."""
        self._resubmits: set[asyncio.Task[None]] = set()
        # Replies due, built and sent together once per loop iteration (see on_outcomes).
        self._due: list[tuple[Pending, ItemOutcome | OutRecord, bool]] = []
        self._submitting: asyncio.Future[None] | None = None  # the chunk being tokenized
        self.assigned_once = False
        self._revoked_in = NO_MEMBERSHIP  # the membership the last revoke was made in
        # --exactly-once: partitions whose transaction failed (producer closed) and that wait
        # to be set up anew (commit, _rewind, on_assigned).
        self._corrupted: set[TopicPartition] = set()
        self._lag_refresh: asyncio.Future[None] | None = None
        self._next_lag_s = -math.inf

    def bind(self, source: SourceLike, engine: EngineLike) -> None:
        """Attach the Kafka source and the engine (built after the pipeline: they call back)."""
        self._source, self._engine = source, engine

    @property
    def source(self) -> SourceLike:
        assert self._source is not None, "bind() first"
        return self._source

    @property
    def engine(self) -> EngineLike:
        assert self._engine is not None, "bind() first"
        return self._engine

    # ---- the loop -----------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event, beat: Callable[[], None] = lambda: None) -> None:
        """Poll, feed and commit until ``stop`` is set; then drain (see :meth:`drain`)."""
        s = self.settings
        self.checkpoint.restart_interval()
        chunk = min(FIRST_POLL_RECORDS, s.poll_max_records)
        while not stop.is_set():
            beat()
            records = await self.source.poll(chunk, s.poll_timeout_ms)
            # Start small after start-up or an idle spell: the first records are answered
            # sooner; double up to poll_max_records while a backlog keeps polls full.
            chunk = min(chunk * 2 if records else FIRST_POLL_RECORDS, s.poll_max_records)
            if records:
                to_compute = self._accept(records)
                if to_compute:
                    # This chunk tokenizes while the next one is polled and decoded; one
                    # chunk at a time in the tokenizer, in order.
                    await self._submitted()
                    self._submitting = asyncio.ensure_future(self._submit(to_compute))
            self._apply_flow()
            if self.checkpoint.due():
                await self.commit()
                self._update_gauges()
                self.checkpoint.restart_interval()
        if self._lag_refresh is not None:
            self._lag_refresh.cancel()

    async def take(self, records: Sequence[InRecord]) -> None:
        """Decode a poll chunk; answer what needs no model; submit the rest in one call."""
        to_compute = self._accept(records)
        if to_compute:
            await self._submit(to_compute)

    async def _submitted(self) -> None:
        """Wait for the chunk :meth:`run` handed to the engine, if any (re-raises its error).

        Other waiters (a revoke, the shutdown) see it until it is done.
        """
        submitting = self._submitting
        if submitting is not None:
            await asyncio.wait({submitting})
            if self._submitting is submitting:
                self._submitting = None
            submitting.result()

    def _accept(self, records: Sequence[InRecord]) -> list[tuple[Pending, InferenceItem]]:
        """Track and decode a poll chunk, answer what needs no model; the items to compute."""
        now, now_ms = self._clock(), self._wall_ms()
        to_compute: list[tuple[Pending, InferenceItem]] = []
        consumed: dict[str, int] = {}
        taken: dict[TopicPartition, int] = {}  # counted into flow control once per chunk
        skipped = 0
        tracing = self._tracing
        for record in records:
            generation = self.tracker.generation(record.tp)
            if generation is None:  # fetched just before its partition was revoked
                continue
            try:
                if self.tracker.skip_completed(record.tp, record.offset):
                    skipped += 1  # answered before a crash (commit metadata): not again
                    consumed[record.topic] = consumed.get(record.topic, 0) + 1
                    continue
                self.tracker.track(record.tp, record.offset)
            except ValueError:  # an offset at or below one already taken: a re-delivery
                log.warning("skipping re-delivered %s@%d", record.tp, record.offset)
                continue
            self.checkpoint.took(record.tp, record.offset)
            taken[record.tp] = taken.get(record.tp, 0) + 1
            consumed[record.topic] = consumed.get(record.topic, 0) + 1
            pending = Pending(record, generation)
            if tracing is not None:  # from the headers: a record that fails to decode too
                pending.trace = tracing.received(record)
            try:
                pending.parsed = parse_request_record(
                    record.key,
                    record.value,
                    record.headers,
                    max_text_bytes=self.settings.max_text_bytes,
                )
            except RecordDecodeError as err:
                self._dead_letter(pending, err.code, err.message, err)
                continue
            refusal = self._reply_topics.check(pending.parsed.address.topic)
            if refusal is not None:  # nothing is written to the named topic
                if refusal.log:
                    log.warning("dead-lettering requests: %s", refusal.message)
                self._dead_letter(pending, ErrorCode.REPLY_TOPIC_NOT_ALLOWED, refusal.message, None)
                continue
            item = self._admit(pending, now, now_ms)
            if item is not None:
                to_compute.append((pending, item))
        # Per chunk, not per record (nothing taken is finished before this returns).
        for tp, n in taken.items():
            self.flow.add(tp, n, 0)
        for topic, n in consumed.items():
            self._metrics.records_consumed.labels(topic).inc(n)
        if skipped:
            self._metrics.skipped_completed.inc(skipped)
        return to_compute

    async def _submit(self, to_compute: list[tuple[Pending, InferenceItem]]) -> None:
        n_tokens = await self.engine.submit([item for _, item in to_compute])
        tokens: dict[TopicPartition, int] = {}  # counted into flow control once per partition
        for (pending, item), n in zip(to_compute, n_tokens, strict=True):
            if self._computing.get(item.item_id) is pending:
                pending.n_tokens = n
                tokens[pending.record.tp] = tokens.get(pending.record.tp, 0) + n
        for tp, n in tokens.items():
            self.flow.add(tp, 0, n)

    def _admit(self, pending: Pending, now: float, now_ms: int) -> InferenceItem | None:
        """Answer at once what needs no computation; else return the item to compute."""
        assert pending.parsed is not None
        request = pending.parsed.request
        pending.lane = request.priority or "live"  # not in the dedup key: a retry is the same
        if request.task is not None and request.task != self.settings.task:
            message = f"this consumer serves task {self.settings.task!r}, not {request.task!r}"
            self._reply(
                pending, self._replies.error(pending.parsed, ErrorCode.UNSUPPORTED_TASK, message)
            )
            return None
        prompt_name: str | None = None
        profile = self._replies.profile
        try:
            check_task_options(request, profile.task)  # contract 1.2 options, on any task
            if profile.task not in NEW_TASKS and (
                request.has_embed_options or profile.default_prompt_name is not None
            ):
                prompt_name = admit_options(EmbedOptions.of(request), profile)
        except OptionError as err:
            self._reply(
                pending, self._replies.error(pending.parsed, ErrorCode.INVALID_OPTION, str(err))
            )
            return None
        if request.deadline_ms is not None and request.deadline_ms <= now_ms:
            self._metrics.expired.inc()
            self._reply(
                pending, self._replies.expired(pending.parsed, late_ms=now_ms - request.deadline_ms)
            )
            return None
        # Copies share a computation when the model sees the same input: same key, same prompt;
        # their other options are shaped from it per copy (ReplyBuilder).
        chunking = request.chunking
        windows, variant = window_rule(profile.task, request.truncate, request.redact, chunking)
        name = prompt_name if variant is None else (prompt_name or "") + variant
        key = pending.dedup_key = dedup_key(pending.record.key or b"", name)
        item_id = next(self._ids)
        decision = self.dedup.begin(key, pending.record.tp, now, item_id)
        if pending.trace is not None:
            self._trace_dedup(pending, decision.kind, decision.item_id)
        if decision.kind is DedupKind.DONE:
            assert decision.result is not None
            self._metrics.dedup_hits.inc()
            self._reply(pending, decision.result, dedup=True)
            return None
        if decision.kind is DedupKind.IN_FLIGHT:
            self._metrics.dedup_hits.inc()
            pending.dedup_of = decision.item_id
            self.dedup.attach_waiter(key, pending)
            return None
        pending.item_id = item_id
        self._computing[item_id] = pending
        deadline_s = None
        if request.deadline_ms is not None:
            deadline_s = now + (request.deadline_ms - now_ms) / 1000
        plan = None
        if chunking is not None:  # contract 1.3: the prompt goes in front of every chunk
            prompt = prompted_text("", prompt_name, profile)
            plan = ChunkPlan(chunking.max_tokens, chunking.overlap, prompt)
        return InferenceItem(
            item_id=item_id,
            text=request.text if plan else prompted_text(request.text, prompt_name, profile),
            truncate=request.truncate,
            arrival_s=now,
            deadline_s=deadline_s,
            group=pending.record.tp,
            documents=None if request.documents is None else tuple(request.documents),
            lane=pending.lane,
            windows=windows,
            chunking=plan,
            trace=pending.trace,
        )

    # ---- outcomes → replies -------------------------------------------------------------------

    def on_outcomes(self, outcomes: Sequence[ItemOutcome]) -> None:
        """Engine callback (event loop thread), a batch's outcomes together: reply to each
        record and to its waiting copies.

        The bookkeeping is done now; the replies are built and handed to delivery in
        :meth:`_send_due`, together with every other reply due in this loop iteration, once the
        engine has had its turn to launch the next batch. Delivery finishes each record on the
        broker's ack (:meth:`on_delivered`, :meth:`on_finished`).
        """
        now = self._clock()
        for outcome in outcomes:
            pending = self._computing.pop(outcome.item_id, None)
            if pending is None or pending.parsed is None:
                continue  # its partition was revoked meanwhile
            self._reply(pending, outcome)
            key = pending.dedup_key
            if outcome.status == "ok":
                waiters = self.dedup.finish(key, outcome, now, item_id=outcome.item_id)
            else:
                waiters = self.dedup.fail(key, item_id=outcome.item_id)
            if outcome.status == "expired":
                self._readmit(waiters)  # each copy is judged by its own deadline
                continue
            for waiter in waiters:
                self._reply(waiter, outcome, dedup=True)

    def _reply(self, pending: Pending, what: ItemOutcome | OutRecord, dedup: bool = False) -> None:
        """Make ``what`` (an outcome, or a reply built already) ``pending``'s reply, soon."""
        self._due.append((pending, what, dedup))
        if len(self._due) == 1:
            asyncio.get_running_loop().call_soon(self._send_due)

    def _send_due(self) -> None:
        """Build the replies due and hand them to delivery as one batch."""
        due, self._due = self._due, []
        built = [(pending, self._build(pending, what, dedup)) for pending, what, dedup in due]
        if self._tracing is not None:  # each reply carries its request span's traceparent
            self._tracing.replying(
                [
                    (p, what if isinstance(what, ItemOutcome) else None, dedup, record)
                    for (p, what, dedup), (_, record) in zip(due, built, strict=True)
                ]
            )
        self._delivery.send(built)

    def _build(self, pending: Pending, what: ItemOutcome | OutRecord, dedup: bool) -> OutRecord:
        """``pending``'s reply record; its status (for ``kbatch_replies_total``) on ``pending``."""
        if isinstance(what, OutRecord):
            pending.status = _status_of(what)
            return what
        assert pending.parsed is not None
        try:
            record = self._replies.from_outcome(pending.parsed, what, dedup=dedup)
        except Exception as err:  # a result the contract cannot carry (NaN, > float32)
            log.error("result of item %s cannot be sent: %r", what.item_id, err)
            message = f"the model's result cannot be sent ({type(err).__name__})"
            pending.status = "error"
            return self._replies.error(pending.parsed, ErrorCode.INFERENCE_FAILED, message)
        pending.status = what.status
        return record

    def on_delivered(self, delivered: Sequence[tuple[Pending, OutRecord]]) -> None:
        """Delivery: these replies were acknowledged together (one producer batch's ack).

        ``kbatch_replies_total`` is counted once per status and call (a labelled
        ``Counter.inc`` takes a lock: ≈ 1 µs); the end-to-end latency is a distribution, one
        observation per record.
        """
        m = self._metrics
        now_ms = self._wall_ms()
        by_status: dict[tuple[str, Lane], int] = {}
        for pending, _ in delivered:
            k = (pending.status, pending.lane)
            by_status[k] = by_status.get(k, 0) + 1
            m.end_to_end.observe(max(0.0, (now_ms - pending.record.timestamp_ms) / 1000))
        for (status, lane), n in by_status.items():
            m.reply_status(status, lane).inc(n)
        if self._tracing is not None:
            self._tracing.delivered([pending for pending, _ in delivered])

    def on_dead_lettered(
        self, pending: Pending, code: ErrorCode, sent: bool, reply_sent: bool
    ) -> None:
        """Delivery: ``pending``'s dead letter was acknowledged (``sent``) or skipped."""
        if sent:
            self._metrics.dead_letters.labels(code.value).inc()
        else:
            self._metrics.dead_letters_failed.labels(code.value).inc()
        if reply_sent:
            self._metrics.reply_status("error", pending.lane).inc()
        if self._tracing is not None:
            self._tracing.dead_lettered(pending, code.value)

    def on_finished(self, pending: Pending, completed: bool) -> None:
        """Delivery: ``pending`` is done; its flow credit is released when its offset was
        finished now (not after a revoke)."""
        if completed:
            self.flow.remove(pending.record.tp, 1, pending.n_tokens)
        self._progress.set()

    def _trace_dedup(self, pending: Pending, kind: DedupKind, item_id: int | None) -> None:
        """``--tracing``: mark a dedup copy's span (``in_flight``: linked to the computing
        request's span)."""
        assert self._tracing is not None
        if kind is DedupKind.DONE:
            self._tracing.dedup(pending.trace, "answered", None)
        elif kind is DedupKind.IN_FLIGHT:
            computing = self._computing.get(item_id) if item_id is not None else None
            self._tracing.dedup(pending.trace, "in_flight", computing and computing.trace)

    def _readmit(self, waiters: list[Pending]) -> None:
        """Copies that waited for a computation that expired: admit each again on its own.

        An expired answer is not a result (it is never stored), so a copy whose own deadline
        has passed is answered ``expired``, and the first copy still in time becomes the new
        computation, the later ones its waiters (a retry with a later deadline is computed).
        """
        now, now_ms = self._clock(), self._wall_ms()
        to_compute: list[tuple[Pending, InferenceItem]] = []
        for waiter in waiters:
            waiter.dedup_of = None
            item = self._admit(waiter, now, now_ms)
            if item is not None:
                to_compute.append((waiter, item))
        if to_compute:
            task = asyncio.ensure_future(self._resubmit(to_compute))
            self._resubmits.add(task)
            task.add_done_callback(self._resubmits.discard)

    async def _resubmit(self, to_compute: list[tuple[Pending, InferenceItem]]) -> None:
        try:
            await self._submit(to_compute)
        except EngineClosedError:  # stopping: the records stay uncommitted
            for _, item in to_compute:
                self._computing.pop(item.item_id, None)

    def _dead_letter(
        self, pending: Pending, code: ErrorCode, message: str, err: RecordDecodeError | None
    ) -> None:
        dlq = self._replies.dead_letter(pending.record, code, message)
        reply = (
            self._replies.decode_error_reply(err) if err is not None and err.addressable else None
        )
        if reply is not None and self._tracing is not None:
            self._tracing.dead_letter_reply(pending, reply)
        self._delivery.dead_letter(pending, dlq, code, reply)

    # ---- flow control and commits ---------------------------------------------------------------

    def _dead_letters_denied(self, reason: str) -> None:
        """Delivery: the broker's ACLs refuse the dead-letter topic. Intake pauses for good
        (readiness says why); what is unfinished stays uncommitted and is read again after a
        restart with the permission granted: nothing is lost."""
        if self.intake_blocked is None:
            log.error("%s: intake paused; grant WRITE on it and restart", reason)
        self.intake_blocked = reason
        self.source.pause(self.tracker.assigned)

    def _apply_flow(self) -> None:
        if self.intake_blocked is not None:
            self.source.pause(self.tracker.assigned)  # a rebalance resumed them
            return
        decision = self.flow.decide()
        if decision.pause:
            self.source.pause(decision.pause)
            self._metrics.pauses.inc(len(decision.pause))
        if decision.resume:
            self.source.resume(decision.resume)
        self._metrics.paused_partitions.set(len(self.flow.paused))

    async def commit(
        self, only: frozenset[TopicPartition] | None = None, *, rewind: bool = True
    ) -> None:
        """Commit every partition's safe offset (those in ``only`` when given): the
        checkpoint's :meth:`~consumer.checkpoint.Checkpoint.commit`, plus its metrics.

        ``--exactly-once``: a partition whose transaction failed without a fence (no verdict
        on the commit, a send without a verdict, an abort) is *corrupted*, as Kafka Streams
        calls it: its producer is closed, and with ``rewind`` (the commit interval's commit)
        it is set up again at once (:meth:`_rewind`); else (a revoke, the drain) the next
        assignment sets it up anew, never keeping its work. ``kbatch_transaction_recoveries_
        total{reason}`` counts each such partition (issue 36 item 1).

        Raises:
            TransactionError: ``--exactly-once``, a partition's producer was fenced (another
                member owns it now; the command stops: see
                :class:`consumer.kafka.errors.TransactionError`).
        """
        try:
            done = await self.checkpoint.commit(only)
        except TransactionError as err:
            if not err.recoverable:
                raise
            for tp, reason in err.failed.items():
                log.warning(
                    "transaction of %s not committed (%s): its producer is replaced and its "
                    "records computed again from the committed offset; %s",
                    tp,
                    reason,
                    err,
                )
                self._metrics.transaction_recoveries.labels(reason).inc()
            self._corrupted |= err.failed.keys()
            done = Committed(err.committed)
        if done.offsets:
            self._metrics.commit_time.observe(done.elapsed_s)
        self._metrics.commit_metadata_truncated.inc(done.truncated)
        due = frozenset(self._corrupted & self.tracker.assigned)
        if rewind and due:
            await self._rewind(due)

    async def _rewind(self, tps: frozenset[TopicPartition]) -> None:
        """Set corrupted partitions up again where their last transaction left them: their
        work is dropped as for a partition that moved (:meth:`_release`: queued cancelled,
        running forgotten, held replies never sent, the closed producer's transaction
        aborted), then each is assigned anew (:meth:`_set_up`): a new producer, whose
        ``InitProducerId`` fences the old one and completes or aborts its open transaction
        before the committed offset and kb1 metadata are read back and the client seeks
        there. Exactly once holds: the failed transaction either committed, and the offsets
        read back say so, or it is aborted and its records are computed again.

        A partition whose producer cannot start within ``--send-timeout-ms`` stays paused and
        corrupted; the next interval's commit tries again."""
        await self._release(tps)
        self.source.pause(tps)
        ready = await self._set_up(tps, timeout_s=self.settings.send_timeout_ms / 1000)
        self._resume(ready)
        log.info("rewound %s to their committed offsets", sorted(ready))

    def _update_gauges(self) -> None:
        m = self._metrics
        m.in_flight_records.set(self.flow.total_records)
        m.in_flight_tokens.set(self.flow.total_tokens)
        m.assigned_partitions.set(len(self.tracker.assigned))
        now = self._clock()
        if self._lag_refresh is None and now >= self._next_lag_s:
            self._next_lag_s = now + LAG_REFRESH_S
            self._lag_refresh = asyncio.ensure_future(self.refresh_lag())
            self._lag_refresh.add_done_callback(self._lag_refreshed)

    def _lag_refreshed(self, task: asyncio.Future[None]) -> None:
        self._lag_refresh = None
        if not task.cancelled() and task.exception() is not None:
            log.warning("lag refresh failed: %r", task.exception())

    async def refresh_lag(self) -> None:
        """Set ``kbatch_consumer_lag`` of every assigned partition: log end offset (asked of
        the broker, so a paused partition's value moves while its log grows) minus the
        committed offset — or, before this group's first commit, the offset this member
        started reading from (its first record taken, else its position). Run in the
        background every :data:`LAG_REFRESH_S` by :meth:`run`."""
        assigned = self.tracker.assigned
        ends = await self.source.end_offsets(assigned)
        for tp, end in ends.items():
            base = self.checkpoint.lag_base(tp)
            if base is None:  # nothing taken yet; its position may wait for an offset reset
                with contextlib.suppress(TimeoutError):
                    base = await asyncio.wait_for(self.source.position(tp), LAG_REFRESH_S)
            if base is None or tp not in self.tracker.assigned:  # revoked meanwhile
                continue
            self._metrics.lag.labels(tp[0], str(tp[1])).set(max(0, end - base))

    # ---- rebalance and shutdown -----------------------------------------------------------------

    async def on_assigned(self, tps: frozenset[TopicPartition]) -> None:
        """Go on with the suspended partitions given back without a break; drop the work of
        those that moved; start a new generation for the others; re-apply pauses aiokafka
        forgot (:mod:`consumer.handover`)."""
        self._metrics.rebalances.labels("assigned").inc()
        plan = handover(self.tracker.suspended, tps, self._revoked_in, self.source.membership())
        corrupted = plan.kept & self._corrupted  # its producer is closed: set up anew
        if corrupted:
            plan = Handover(plan.kept - corrupted, plan.moved | corrupted, plan.new | corrupted)
        self._corrupted -= self.tracker.suspended
        if plan.moved:
            await self._release(plan.moved)
        # Nothing of ``tps`` is taken in before every one of them is set up: a record polled
        # meanwhile would be dropped (not assigned yet; the position moves past it, so the
        # commit would too) or computed although the commit metadata names it.
        self.source.pause(tps)
        for tp in plan.kept:
            self.tracker.resume(tp)
            last = self.tracker.last_tracked(tp)
            if last is not None:  # the client would read again from the committed offset
                self.source.seek(tp, last + 1)
        ready = await self._set_up(plan.new)
        self._delivery.reopen(plan.kept)  # the replies answered meanwhile go out
        self._resume(plan.kept | ready)
        self.assigned_once = True
        if plan.kept or plan.moved:
            log.info(
                "assigned %s (kept the work of %s, dropped that of %s)",
                sorted(tps),
                sorted(plan.kept),
                sorted(plan.moved),
            )
        else:
            log.info("assigned %s", sorted(tps))

    async def on_revoked(self, tps: frozenset[TopicPartition]) -> None:
        """Commit what revoked partitions finished, at once; keep their work until the new
        assignment (:meth:`on_assigned`) says whether they stay.

        Their new replies are held; the ones already sent get up to
        :data:`REVOKE_SENDS_WAIT_S` to be acknowledged; the commit is bounded by the revoke's
        share (:data:`REVOKE_SHARE`) of the rebalance timeout. Nothing waits for the model.
        """
        self._metrics.rebalances.labels("revoked").inc()
        self._revoked_in = self.source.membership()
        if not tps:
            return
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = Deadline.after(
            self.settings.rebalance_timeout_ms / 1000 * REVOKE_SHARE, loop.time
        )
        try:
            await self._delivery.quiesce(tps, min(REVOKE_SENDS_WAIT_S, deadline.remaining_s()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.commit(only=tps, rewind=False), deadline.remaining_s())
        finally:  # also when the commit raised (TransactionError): the assignment decides
            for tp in tps:
                self.tracker.suspend(tp)
        kept = sum(self.tracker.pending(tp) for tp in tps)
        log.info(
            "revoked %s in %.1f s (%d records in flight kept until the assignment)",
            sorted(tps),
            loop.time() - started,
            kept,
        )

    async def _set_up(
        self, tps: frozenset[TopicPartition], timeout_s: float | None = None
    ) -> frozenset[TopicPartition]:
        """Assign ``tps`` (paused) anew: tracker and flow, then each one's checkpoint (the
        committed offset and what was answered above it, skipped; ``--exactly-once``: its
        producer first, started within ``timeout_s`` when given). Returns those set up; one
        whose producer did not start stays corrupted (:meth:`_rewind` tries again)."""
        for tp in tps:
            self.tracker.assign(tp)
            self.flow.assign(tp)
        ready: set[TopicPartition] = set()
        for tp in tps:
            try:
                await self.checkpoint.assign(tp, self.source, timeout_s)
            except KafkaUnavailableError as err:
                if timeout_s is None:
                    raise
                log.warning("%s: %s stays paused, tried again at the next commit", err, tp)
                self._corrupted.add(tp)
                continue
            self._corrupted.discard(tp)
            ready.add(tp)
        return frozenset(ready)

    def _resume(self, tps: frozenset[TopicPartition]) -> None:
        """Resume ``tps`` (paused while being set up), except those flow control holds."""
        self.flow.decide()
        paused = self.flow.reapply()
        self.source.resume(tps - paused)
        if paused:
            self.source.pause(paused)

    async def _release(self, tps: frozenset[TopicPartition]) -> None:
        """Suspended partitions that moved: their work is dropped (queued cancelled, running
        forgotten, held replies never sent) and their state forgotten; under
        ``--exactly-once`` their open transaction is aborted."""
        self._drop_unanswered(tps)
        self._delivery.drop(tps)
        for tp in tps:
            self.dedup.drop_partition(tp)
            self.tracker.revoke(tp)
            self.flow.revoke(tp)
            self._metrics.forget_partition(tp)
            await self.checkpoint.revoke(tp)  # --exactly-once: what was not committed is aborted

    async def finish(self, tps: frozenset[TopicPartition] | None, deadline: Deadline) -> bool:
        """Answer what ``tps`` (all assigned when None) hold and commit, all by ``deadline``.

        Every step is bounded by the one ``deadline`` (created once by the caller, on the
        event loop's clock): the chunk being tokenized, forming batches of everything queued
        (``engine.flush``), waiting for the answers to be acknowledged, and the commit, which
        keeps the last :data:`COMMIT_RESERVE_S` (at most a quarter of what is left). When the
        work steps run out of time, what is still queued is dropped (``engine.cancel_group``:
        never formed into a batch) and what is running is forgotten (its late outcome is not
        sent): those records stay uncommitted and are computed by the partition's next owner,
        and nothing sent is computed again by it unless a lower offset was left unanswered.

        Returns:
            True when every record of ``tps`` was answered in time.
        """
        targets = tps if tps is not None else self.tracker.assigned
        work = deadline.keeping(COMMIT_RESERVE_S)
        if self._submitting is not None:  # its items then are queued: flush and cancel see them
            # Its error, if any, is run()'s to raise.
            await asyncio.wait({self._submitting}, timeout=work.remaining_s())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.engine.flush(), work.remaining_s())
        done = False
        while True:
            done = all(self.tracker.pending(tp) == 0 for tp in targets)
            if done or work.expired:
                break
            self._progress.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._progress.wait(), work.remaining_s())
        if not done:
            self._drop_unanswered(frozenset(targets))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(
                self.commit(only=frozenset(targets), rewind=False), deadline.remaining_s()
            )
        if not done:
            left = {tp: self.tracker.pending(tp) for tp in targets if self.tracker.pending(tp)}
            log.warning("drain deadline passed with records unanswered: %s", left)
        return done

    def _drop_unanswered(self, tps: frozenset[TopicPartition]) -> None:
        """Stop working for ``tps``: queued items are cancelled, running ones forgotten."""
        for tp in tps:
            self.engine.cancel_group(tp)
        for item_id, pending in list(self._computing.items()):
            if pending.record.tp in tps:
                del self._computing[item_id]


def _status_of(record: OutRecord) -> str:
    """The ``kbatch-status`` header of a reply record; "" when it has none."""
    return (last_value(record.headers, STATUS) or b"").decode()
