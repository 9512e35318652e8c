"""The one readable flow of ``kbatch serve``.

    poll → track → decode → admit → dedup → engine.submit ─┐
                                                           ▼ (engine: buckets → batches → model)
    commit ◄─ offsets.complete ◄─ broker ack ◄─ delivery.send ◄─ on_outcomes → replies (+ copies)

Rules this module keeps (CONTRACT.md §Delivery):

* An offset is finished only when its reply or dead letter is acknowledged (:class:`OffsetTracker`);
  those answered above the committed one are skipped by a new owner (commit metadata, kb1).
* A key in flight or answered within the dedup window is never computed twice (:class:`DedupCache`);
  a copy with another input is answered ``idempotency_key_reused``, never the first one's result.
* A burst pauses partitions instead of growing memory (:class:`FlowControl`); polling goes on
  while paused so the member stays in its group.

Policy objects decide — what a request gets (:func:`consumer.serve.admission.admit`), dedup,
flow — and this class does the I/O; rebalances, commits and the drain are the
:class:`~consumer.serve.rebalance.Rebalancer`'s, replies leave by the
:class:`~consumer.serve.outbox.Outbox`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from consumer.batching.engine import EngineClosedError
from consumer.batching.routes import OutcomeCallback
from consumer.batching.types import InferenceItem, ItemOutcome
from consumer.config import ServeSettings, project
from consumer.deadline import Deadline
from consumer.finish.checkpoint import TransactionalSinkLike, checkpoint_for
from consumer.finish.delivery import Delivery, SinkLike
from consumer.kafka.flow import FlowConfig, FlowControl
from consumer.kafka.offsets import OffsetTracker
from consumer.kafka.records import InRecord, TopicPartition
from consumer.replies.builder import ReplyBuilder
from consumer.replies.topic_policy import ReplyTopicPolicy
from consumer.serve.admission import Expire, Refuse, admit
from consumer.serve.dedup import DedupCache, DedupKind
from consumer.serve.metrics import Metrics
from consumer.serve.outbox import Outbox, ReplyAcks
from consumer.serve.pending import Pending
from consumer.serve.rebalance import Rebalancer, SourceLike
from schemas.errors import ErrorCode
from schemas.records import RecordDecodeError, parse_request_record

if TYPE_CHECKING:
    from consumer.kafka.transport import GroupSource, RebalanceHandler
    from consumer.tracing.requests import RequestTracing

__all__ = ["FIRST_POLL_RECORDS", "EngineLike", "Pending", "Pipeline", "SourceLike"]

log = logging.getLogger(__name__)


class EngineLike(Protocol):
    """What the pipeline needs of :class:`consumer.batching.engine.Engine`."""

    async def submit(
        self, items: Sequence[InferenceItem], on_outcomes: OutcomeCallback | None = None
    ) -> list[int]: ...
    def cancel_group(self, group: object) -> list[int]: ...
    async def flush(self) -> None: ...


FIRST_POLL_RECORDS = 64
"""``max_records`` of the first poll after start-up or an empty poll; each non-empty poll doubles
it up to ``poll_max_records`` (a 500-record first chunk delayed the first reply by its whole
decode)."""


@dataclass(slots=True)
class _Chunk:
    """What one poll chunk took in, counted into flow control and metrics once per chunk."""

    consumed: dict[str, int] = field(default_factory=dict)  # records per topic
    taken: dict[TopicPartition, int] = field(default_factory=dict)  # tracked per partition
    skipped: int = 0  # answered before a crash (commit metadata)


class Pipeline:
    """Owns the policy objects and does the I/O they decide on. One per ``kbatch serve``.

    Args:
        sink: the reply producer (unused under ``--exactly-once``).
        source: builds the Kafka source from its rebalance handler (this pipeline).
        engine: the :class:`~consumer.batching.engine.Engine` or its fan-out, started before
            :meth:`run`; each submit names :meth:`on_outcomes` as its callback.
        clock: monotonic seconds; ``wall_clock_ms``: Unix epoch milliseconds.
        transactions: ``--exactly-once``: the per-partition transactional sink; it picks the
            checkpoint, once (:func:`consumer.finish.checkpoint.checkpoint_for`).
        tracing: ``--tracing``: each request's span, its ``traceparent`` on the reply
            (:mod:`consumer.tracing.requests`); None adds nothing per record.
    """

    def __init__(
        self,
        settings: ServeSettings,
        sink: SinkLike,
        replies: ReplyBuilder,
        metrics: Metrics,
        *,
        source: Callable[[RebalanceHandler], GroupSource],
        engine: EngineLike,
        clock: Callable[[], float] = time.monotonic,
        wall_clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
        transactions: TransactionalSinkLike | None = None,
        tracing: RequestTracing | None = None,
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.source = source(self)
        self._tracing = tracing
        self._replies = replies
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
        progress = asyncio.Event()  # set whenever a record is finished (the drain waits)
        self._delivery: Delivery[Pending] = Delivery(
            sink,
            self.tracker,
            ReplyAcks(metrics, self.flow, progress, wall_clock_ms, tracing),
            replies,
            sourced=transactions,
            on_dead_letters_denied=lambda reason: self._rebalance.dead_letters_denied(reason),
        )
        reply_topics = ReplyTopicPolicy(
            reply_topic=settings.reply_topic,
            request_topic=settings.request_topic,
            dlq_topic=settings.dead_letter_topic,
            allowed_pattern=settings.allowed_reply_topics,
            clock=clock,
        )
        self._outbox = Outbox(replies, self._delivery, reply_topics, tracing)
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
        self._rebalance = Rebalancer(
            settings,
            self.source,
            self,
            tracker=self.tracker,
            flow=self.flow,
            dedup=self.dedup,
            delivery=self._delivery,
            checkpoint=self.checkpoint,
            metrics=metrics,
            progress=progress,
            clock=clock,
        )
        self._key_reused = (
            ErrorCode.IDEMPOTENCY_KEY_REUSED,
            "this key is in flight or was answered within the dedup window "
            f"({settings.dedup_ttl_s:g} s) for another input (text; rerank: query and "
            "documents); a different request needs a key of its own",
        )
        self._resubmits: set[asyncio.Task[None]] = set()
        self._submitting: asyncio.Future[None] | None = None  # the chunk being tokenized

    # ---- the loop -----------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event, beat: Callable[[], None] = lambda: None) -> None:
        """Poll, feed and commit until ``stop`` is set (the drain is :meth:`finish`)."""
        s = self.settings
        self.checkpoint.restart_interval()
        chunk = min(FIRST_POLL_RECORDS, s.poll_max_records)
        while not stop.is_set():
            beat()
            records = await self.source.poll(chunk, s.poll_timeout_ms)
            # Start small after start-up or an idle spell: the first records are answered
            # sooner; double up to poll_max_records while a backlog keeps polls full.
            chunk = min(chunk * 2 if records else FIRST_POLL_RECORDS, s.poll_max_records)
            to_compute = self._accept(records) if records else []
            if to_compute:
                # This chunk tokenizes while the next one is polled and decoded; one chunk at
                # a time in the tokenizer, in order.
                await self._submitted()
                self._submitting = asyncio.ensure_future(self._submit(to_compute))
            self._apply_flow()
            if self.checkpoint.due():
                await self.commit()
                self._rebalance.update_gauges()
                self.checkpoint.restart_interval()
        self._rebalance.stop()

    async def take(self, records: Sequence[InRecord]) -> None:
        """Decode a poll chunk; answer what needs no model; submit the rest in one call."""
        to_compute = self._accept(records)
        if to_compute:
            await self._submit(to_compute)

    async def _submitted(self) -> None:
        """Wait for the chunk :meth:`run` handed to the engine, if any (re-raises its error);
        other waiters (a revoke, the shutdown) see it until it is done."""
        submitting = self._submitting
        if submitting is not None:
            if not submitting.done():  # done already: no wait (a wait costs a loop iteration)
                await asyncio.wait({submitting})
            if self._submitting is submitting:
                self._submitting = None
            submitting.result()

    # ---- intake: track → decode → admit -------------------------------------------------------

    def _accept(self, records: Sequence[InRecord]) -> list[tuple[Pending, InferenceItem]]:
        """Take a poll chunk in, record by record; answer what needs no model; the items to
        compute."""
        now, now_ms = self._clock(), self._wall_ms()
        chunk = _Chunk()
        to_compute: list[tuple[Pending, InferenceItem]] = []
        for record in records:
            pending = self._track(record, chunk)
            if pending is None or not self._decode(pending):
                continue
            item = self._admit(pending, now, now_ms)
            if item is not None:
                to_compute.append((pending, item))
        # Per chunk, not per record (nothing taken is finished before this returns).
        for tp, n in chunk.taken.items():
            self.flow.add(tp, n, 0)
        for topic, n in chunk.consumed.items():
            self._metrics.records_consumed.labels(topic).inc(n)
        if chunk.skipped:
            self._metrics.skipped_completed.inc(chunk.skipped)
        return to_compute

    def _track(self, record: InRecord, chunk: _Chunk) -> Pending | None:
        """Take ``record``'s offset in; None when it is not to be answered: fetched just
        before its partition was revoked, re-delivered, or answered before a crash."""
        generation = self.tracker.generation(record.tp)
        if generation is None:  # fetched just before its partition was revoked
            return None
        try:
            if self.tracker.skip_completed(record.tp, record.offset):
                chunk.skipped += 1  # answered before a crash (commit metadata): not again
                chunk.consumed[record.topic] = chunk.consumed.get(record.topic, 0) + 1
                return None
            self.tracker.track(record.tp, record.offset)
        except ValueError:  # an offset at or below one already taken: a re-delivery
            log.warning("skipping re-delivered %s@%d", record.tp, record.offset)
            return None
        self.checkpoint.took(record.tp, record.offset)
        chunk.taken[record.tp] = chunk.taken.get(record.tp, 0) + 1
        chunk.consumed[record.topic] = chunk.consumed.get(record.topic, 0) + 1
        return Pending(record, generation)

    def _decode(self, pending: Pending) -> bool:
        """Parse the request (its span starts first); dead-letter one that cannot be parsed or names
        a reply topic it may not. False: answered."""
        record = pending.record
        if self._tracing is not None:  # from the headers: a record that fails to decode too
            pending.trace = self._tracing.received(record)
        try:
            pending.parsed = parse_request_record(
                record.key,
                record.value,
                record.headers,
                max_text_bytes=self.settings.max_text_bytes,
            )
        except RecordDecodeError as err:  # its reply topic is checked all the same
            self._outbox.undecodable(pending, err)
            return False
        return self._outbox.addressed(pending)  # nothing is written to a refused topic

    def _admit(self, pending: Pending, now: float, now_ms: int) -> InferenceItem | None:
        """Execute the admission verdict (:func:`~consumer.serve.admission.admit`) and the
        dedup decision: answer at once, wait for a copy, or return the item to compute."""
        assert pending.parsed is not None
        request = pending.parsed.request
        pending.lane = request.priority or "live"  # not in the dedup key: a retry is the same
        verdict = admit(
            request, pending.record.key, self.settings.task, self._replies.profile, now, now_ms
        )
        if isinstance(verdict, Refuse):
            self._outbox.add(
                pending, self._replies.error(pending.parsed, verdict.code, verdict.message)
            )
            return None
        if isinstance(verdict, Expire):
            self._metrics.expired.inc()
            self._outbox.add(
                pending, self._replies.expired(pending.parsed, late_ms=verdict.late_ms)
            )
            return None
        key = pending.dedup_key = verdict.dedup_key
        item_id = next(self._ids)
        decision = self.dedup.begin(key, pending.record.tp, now, item_id, verdict.digest)
        if decision.kind is DedupKind.REUSED:
            self._metrics.key_reused.inc()
            self._outbox.add(pending, self._replies.error(pending.parsed, *self._key_reused))
            return None
        if pending.trace is not None:
            self._trace_dedup(pending, decision.kind, decision.item_id)
        if decision.kind is DedupKind.DONE:
            assert decision.result is not None
            self._metrics.dedup_hits.inc()
            self._outbox.add(pending, decision.result, dedup=True)
            return None
        if decision.kind is DedupKind.IN_FLIGHT:
            self._metrics.dedup_hits.inc()
            pending.dedup_of = decision.item_id
            self.dedup.attach_waiter(key, pending)
            return None
        pending.item_id = item_id
        self._computing[item_id] = pending
        return verdict.item(item_id, request, pending.record.tp, pending.lane, now, pending.trace)

    async def _submit(self, to_compute: list[tuple[Pending, InferenceItem]]) -> None:
        n_tokens = await self.engine.submit([item for _, item in to_compute], self.on_outcomes)
        tokens: dict[TopicPartition, int] = {}  # counted into flow control once per partition
        for (pending, item), n in zip(to_compute, n_tokens, strict=True):
            if self._computing.get(item.item_id) is pending:
                pending.n_tokens = n
                tokens[pending.record.tp] = tokens.get(pending.record.tp, 0) + n
        for tp, n in tokens.items():
            self.flow.add(tp, 0, n)

    def _trace_dedup(self, pending: Pending, kind: DedupKind, item_id: int | None) -> None:
        """``--tracing``: mark a dedup copy's span (``in_flight``: linked to the computing
        request's span)."""
        assert self._tracing is not None
        if kind is DedupKind.DONE:
            self._tracing.dedup(pending.trace, "answered", None)
        elif kind is DedupKind.IN_FLIGHT:
            computing = self._computing.get(item_id) if item_id is not None else None
            self._tracing.dedup(pending.trace, "in_flight", computing and computing.trace)

    # ---- outcomes → replies -------------------------------------------------------------------

    def on_outcomes(self, outcomes: Sequence[ItemOutcome]) -> None:
        """The engine's callback (event loop thread), a batch's outcomes together: reply to
        each record and its waiting copies (the :class:`~consumer.serve.outbox.Outbox` builds
        and sends the replies due in this loop iteration together)."""
        now = self._clock()
        for outcome in outcomes:
            pending = self._computing.pop(outcome.item_id, None)
            if pending is None or pending.parsed is None:
                continue  # its partition was revoked meanwhile
            self._outbox.add(pending, outcome)
            key = pending.dedup_key
            if outcome.status == "ok":
                waiters = self.dedup.finish(key, outcome, now, item_id=outcome.item_id)
            else:
                waiters = self.dedup.fail(key, item_id=outcome.item_id)
            if outcome.status == "expired":
                self._readmit(waiters)  # each copy is judged by its own deadline
                continue
            for waiter in waiters:
                self._outbox.add(waiter, outcome, dedup=True)

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

    # ---- the work in progress, for the rebalancer (consumer.serve.rebalance.Work) -------------

    async def settle(self, deadline: Deadline) -> None:
        """By ``deadline``: the chunk being tokenized is queued (its error, if any, is
        :meth:`run`'s to raise) and batches are formed of everything queued."""
        if self._submitting is not None:  # its items then are queued: flush and cancel see them
            await asyncio.wait({self._submitting}, timeout=deadline.remaining_s())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.engine.flush(), deadline.remaining_s())

    def drop_unanswered(self, tps: frozenset[TopicPartition]) -> None:
        """Stop working for ``tps``: queued items are cancelled, running ones forgotten."""
        for tp in tps:
            self.engine.cancel_group(tp)
        for item_id, pending in list(self._computing.items()):
            if pending.record.tp in tps:
                del self._computing[item_id]

    # ---- partitions: flow, rebalance, commit and drain (consumer.serve.rebalance) -------------

    @property
    def intake_blocked(self) -> str | None:
        """Why intake is paused for good (the dead-letter topic denied), else None."""
        return self._rebalance.intake_blocked

    @property
    def assigned_once(self) -> bool:
        """Whether partitions were ever assigned (readiness)."""
        return self._rebalance.assigned_once

    def _apply_flow(self) -> None:
        self._rebalance.apply_flow()

    async def on_assigned(self, tps: frozenset[TopicPartition]) -> None:
        """The source's rebalance handler: :meth:`Rebalancer.on_assigned`."""
        await self._rebalance.on_assigned(tps)

    async def on_revoked(self, tps: frozenset[TopicPartition]) -> None:
        """The source's rebalance handler: :meth:`Rebalancer.on_revoked`."""
        await self._rebalance.on_revoked(tps)

    async def commit(
        self, only: frozenset[TopicPartition] | None = None, *, rewind: bool = True
    ) -> None:
        """:meth:`Rebalancer.commit` (raises ``TransactionError`` when a producer was fenced)."""
        await self._rebalance.commit(only, rewind=rewind)

    async def finish(self, tps: frozenset[TopicPartition] | None, deadline: Deadline) -> bool:
        """The drain: :meth:`Rebalancer.finish`."""
        return await self._rebalance.finish(tps, deadline)

    async def refresh_lag(self) -> None:
        """``kbatch_consumer_lag`` now: :meth:`Rebalancer.refresh_lag`."""
        await self._rebalance.refresh_lag()
