"""The rebalance, commit and drain half of ``kbatch serve``'s pipeline: which partitions this
member holds and reads, and what is committed for them.

* Commits, their kb1 metadata, the lag base and the read-back at assignment are the
  checkpoint's (:mod:`consumer.finish.checkpoint`), plain or ``--exactly-once``; this object
  calls it at the interval, at a revoke and at the drain, and counts what it did.
* A revoke waits for nothing slow: it holds the revoked partitions' new replies, waits for
  the replies already sent (one broker round trip) and commits what is finished, with its kb1
  metadata, at once. Their work (queued, running, answered and held) is kept until the new
  assignment: a partition given back to this member without a break goes on where it was
  (nothing recomputed, the held replies sent); one that moved has its queued work cancelled,
  its running work forgotten and its held replies dropped — the next owner computes those
  records (:mod:`consumer.serve.handover`).
* ``--exactly-once``: a partition whose transaction failed without a fence is rewound in place
  (new producer, committed offset, computed again: :meth:`Rebalancer.commit`); the member
  stops only when a producer was fenced.
* The drain (:meth:`Rebalancer.finish`) spends one deadline on every step.

Policy objects decide (:func:`~consumer.serve.handover.handover`, :class:`FlowControl`, the
checkpoint); this class does the I/O they decide on, through the source and the pipeline's
:class:`Work`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from typing import Protocol

from consumer.batching.types import ItemOutcome
from consumer.config import ServeSettings
from consumer.deadline import Deadline
from consumer.finish.checkpoint import Checkpoint, Committed
from consumer.finish.delivery import Delivery
from consumer.kafka.errors import KafkaUnavailableError, TransactionError
from consumer.kafka.flow import FlowControl
from consumer.kafka.offsets import OffsetTracker
from consumer.kafka.records import InRecord, TopicPartition
from consumer.serve.dedup import DedupCache
from consumer.serve.handover import NO_MEMBERSHIP, Handover, Membership, handover
from consumer.serve.metrics import Metrics
from consumer.serve.pending import Pending

__all__ = ["COMMIT_RESERVE_S", "REVOKE_SHARE", "Rebalancer", "SourceLike", "Work"]

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
    """What the pipeline needs of a group source (:class:`consumer.kafka.transport.GroupSource`)."""

    @property
    def incremental(self) -> bool: ...
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


class Work(Protocol):
    """What the rebalancer needs of the pipeline's work in progress."""

    async def settle(self, deadline: Deadline) -> None:
        """By ``deadline``: the chunk being tokenized is queued, and batches are formed of
        everything queued (``engine.flush``)."""

    def drop_unanswered(self, tps: frozenset[TopicPartition]) -> None:
        """Stop working for ``tps``: queued items cancelled, running ones forgotten."""


@dataclass(eq=False)
class Rebalancer:
    """Assigns, revokes, rewinds, commits and drains the partitions of one serve member.

    Attributes:
        settings: serve's settings (``rebalance_timeout_ms``, ``send_timeout_ms``).
        source: the Kafka source (pause, resume, seek, membership, end offsets).
        work: the pipeline's work in progress (:class:`Work`).
        tracker, flow, dedup, delivery, checkpoint, metrics: the pipeline's, shared.
        progress: set whenever a record is finished (the drain waits on it).
        clock: monotonic seconds (the lag refresh's cadence).
    """

    settings: ServeSettings
    source: SourceLike
    work: Work
    _: KW_ONLY
    tracker: OffsetTracker
    flow: FlowControl
    dedup: DedupCache[Pending, ItemOutcome]
    delivery: Delivery[Pending]
    checkpoint: Checkpoint
    metrics: Metrics
    progress: asyncio.Event
    clock: Callable[[], float]

    def __post_init__(self) -> None:
        self.assigned_once = False
        self.intake_blocked: str | None = None
        """Why intake is paused for good (the dead-letter topic denied), else None."""
        self._revoked_in = NO_MEMBERSHIP  # the membership the last revoke was made in
        # --exactly-once: partitions whose transaction failed (producer closed) and that wait
        # to be set up anew (commit, _rewind, on_assigned).
        self._corrupted: set[TopicPartition] = set()
        self._lag_refresh: asyncio.Future[None] | None = None
        self._next_lag_s = -math.inf

    async def commit(
        self, only: frozenset[TopicPartition] | None = None, *, rewind: bool = True
    ) -> None:
        """Commit every partition's safe offset (those in ``only`` when given): the
        checkpoint's :meth:`~consumer.finish.checkpoint.Checkpoint.commit`, plus its metrics.

        ``--exactly-once``: a partition whose transaction failed without a fence (no verdict
        on the commit, a send without a verdict, an abort) is *corrupted*, as Kafka Streams
        calls it: its producer is closed, and with ``rewind`` (the commit interval's commit)
        it is set up again at once (:meth:`_rewind`); else (a revoke, the drain) the next
        assignment sets it up anew, never keeping its work. ``kbatch_transaction_recoveries_
        total{reason}`` counts each such partition.

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
                self.metrics.transaction_recoveries.labels(reason).inc()
            self._corrupted |= err.failed.keys()
            done = Committed(err.committed)
        if done.offsets:
            self.metrics.commit_time.observe(done.elapsed_s)
        self.metrics.commit_metadata_truncated.inc(done.truncated)
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

    def update_gauges(self) -> None:
        """After a commit: the in-flight and assignment gauges; a lag refresh when due."""
        m = self.metrics
        m.in_flight_records.set(self.flow.total_records)
        m.in_flight_tokens.set(self.flow.total_tokens)
        m.assigned_partitions.set(len(self.tracker.assigned))
        now = self.clock()
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
        started reading from (its first record taken, else its position) — and the lag
        seconds that follow (:meth:`Metrics.show_lag`). Run in the background every
        :data:`LAG_REFRESH_S` (:meth:`update_gauges`)."""
        assigned = self.tracker.assigned
        ends = await self.source.end_offsets(assigned)
        lags: dict[TopicPartition, tuple[int, int]] = {}
        for tp, end in ends.items():
            base = self.checkpoint.lag_base(tp)
            if base is None:  # nothing taken yet; its position may wait for an offset reset
                with contextlib.suppress(TimeoutError):
                    base = await asyncio.wait_for(self.source.position(tp), LAG_REFRESH_S)
            if base is None or tp not in self.tracker.assigned:  # revoked meanwhile
                continue
            lags[tp] = (base, max(0, end - base))
        self.metrics.show_lag(self.clock(), lags)

    def dead_letters_denied(self, reason: str) -> None:
        """Delivery: the broker's ACLs refuse the dead-letter topic, or it does not exist (it
        was deleted while serve ran). Intake pauses for good (readiness says why); what is
        unfinished stays uncommitted and is read again after a restart with the permission
        granted or the topic made: nothing is lost. ``reason`` ends with the remedy."""
        if self.intake_blocked is None:
            log.error("%s, then restart: intake paused", reason)
        self.intake_blocked = reason
        self.source.pause(self.tracker.assigned)

    def apply_flow(self) -> None:
        """Pause and resume partitions as flow control decides (all paused once intake is
        blocked)."""
        if self.intake_blocked is not None:
            self.source.pause(self.tracker.assigned)  # a rebalance resumed them
            return
        decision = self.flow.decide()
        if decision.pause:
            self.source.pause(decision.pause)
            self.metrics.pauses.inc(len(decision.pause))
        if decision.resume:
            self.source.resume(decision.resume)
        self.metrics.paused_partitions.set(len(self.flow.paused))

    def stop(self) -> None:
        """The loop ended: no more lag refreshes."""
        if self._lag_refresh is not None:
            self._lag_refresh.cancel()

    async def on_assigned(self, tps: frozenset[TopicPartition]) -> None:
        """Eager (the classic protocol, ``tps`` the whole new assignment): go on with the
        suspended partitions given back without a break; drop the work of those that moved;
        start a new generation for the others; re-apply the pauses the client forgot
        (:mod:`consumer.serve.handover`). Incremental (``source.incremental``, ``tps`` the
        partitions added): set those up; the others never stopped."""
        self.metrics.rebalances.labels("assigned").inc()
        if self.source.incremental:
            plan = Handover(frozenset(), frozenset(), tps - self.tracker.assigned)
        else:
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
        self.delivery.reopen(plan.kept)  # the replies answered meanwhile go out
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
        """Commit what revoked partitions finished, at once. Eager: keep their work until the
        new assignment (:meth:`on_assigned`) says whether they stay. Incremental
        (``source.incremental``: only the partitions that move are revoked): drop it at once
        (:meth:`_release`), as for a partition that moved.

        Their new replies are held; the ones already sent get up to
        :data:`REVOKE_SENDS_WAIT_S` to be acknowledged; the commit is bounded by the revoke's
        share (:data:`REVOKE_SHARE`) of the rebalance timeout. Nothing waits for the model.
        """
        self.metrics.rebalances.labels("revoked").inc()
        self._revoked_in = self.source.membership()
        if not tps:
            return
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = Deadline.after(
            self.settings.rebalance_timeout_ms / 1000 * REVOKE_SHARE, loop.time
        )
        try:
            await self.delivery.quiesce(tps, min(REVOKE_SENDS_WAIT_S, deadline.remaining_s()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.commit(only=tps, rewind=False), deadline.remaining_s())
        finally:  # also when the commit raised (TransactionError): the assignment decides
            for tp in tps:
                self.tracker.suspend(tp)
        if self.source.incremental:  # these move: nothing comes back to this member
            dropped = sum(self.tracker.pending(tp) for tp in tps)
            await self._release(tps)
            self._corrupted -= tps
            log.info(
                "revoked %s in %.1f s (%d records in flight left to the next owner)",
                sorted(tps),
                loop.time() - started,
                dropped,
            )
            return
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
        self.work.drop_unanswered(tps)
        self.delivery.drop(tps)
        for tp in tps:
            self.dedup.drop_partition(tp)
            self.tracker.revoke(tp)
            self.flow.revoke(tp)
            self.metrics.forget_partition(tp)
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
        await self.work.settle(work)
        done = False
        while True:
            done = all(self.tracker.pending(tp) == 0 for tp in targets)
            if done or work.expired:
                break
            self.progress.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.progress.wait(), work.remaining_s())
        if not done:
            self.work.drop_unanswered(frozenset(targets))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(
                self.commit(only=frozenset(targets), rewind=False), deadline.remaining_s()
            )
        if not done:
            left = {tp: self.tracker.pending(tp) for tp in targets if self.tracker.pending(tp)}
            log.warning("drain deadline passed with records unanswered: %s", left)
        return done
