"""Delivery: the one way a record read by serve or backfill is answered and finished.

::

    send([(pending, reply), ...]) ─► sink.send ─► broker ack ─┬─► owner.on_delivered
                                                              │   tracker.complete
                                                              │   owner.on_finished
                  DeliveryError (the reply can never exist) ──┴─► dead_letter(...)
    dead_letter(pending, dlq, code) ─► sink.send (whole, else cut) ─► owner.on_dead_lettered
                                                                      tracker.complete
                                                                      owner.on_finished

Rules (CONTRACT.md §Delivery):

* An offset is finished (:meth:`OffsetTracker.complete`) only once its reply or dead letter is
  acknowledged by the broker; then the owner is told (:meth:`DeliveryOwner.on_finished`) so that it
  releases the record's flow credit.
* A reply the broker can never take (a reply address that cannot exist, a value over the size
  limit) is dead-lettered ``invalid_request`` instead; one the broker's ACLs refuse
  (``TOPIC_AUTHORIZATION_FAILED``) is dead-lettered ``reply_topic_not_allowed``.
* A dead letter refused whole is sent cut to its first :data:`DEAD_LETTER_CUT_BYTES` (the full
  record stays in the source topic at its offset). Refused even cut, it is skipped: serve then
  finishes the offset anyway (a bad record never holds up its partition), backfill leaves it
  unfinished (the job exits non-zero and a rerun repeats it): ``finish_unsent_dead_letters``.
* When the sink closes first, nothing is finished: the record stays uncommitted and is
  answered after a restart.
* ``--exactly-once`` (``sourced`` given): each record's sends go to its input partition's
  transaction (``sourced.send_from``), and :meth:`Delivery.holding` bounds a transaction
  between commits (:class:`consumer.finish.gate.IntervalGate`).
* A revoke (both modes) quiesces its partitions too: their new replies are held until the
  next assignment says whether the partition stays (:meth:`Delivery.reopen`: sent) or moved
  (:meth:`Delivery.drop`: never sent, the next owner answers the records); a commit inside
  the revoke leaves that hold alone (it reopens only what it closed).

Policy (what to count, what finishing releases) is the owner's; this class does the I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from typing import Any, Generic, Protocol, TypeVar

from consumer.finish.gate import IntervalGate
from consumer.kafka.errors import (
    DeliveryDeniedError,
    DeliveryError,
    DeliveryTopicMissingError,
    SinkClosedError,
)
from consumer.kafka.offsets import OffsetTracker
from consumer.kafka.records import InRecord, TopicPartition
from consumer.replies.builder import ReplyBuilder
from schemas.errors import ErrorCode
from schemas.records import OutRecord, cut_dead_letter

__all__ = [
    "DEAD_LETTER_CUT_BYTES",
    "Delivery",
    "DeliveryOwner",
    "SinkLike",
    "SourcedSinkLike",
    "Tracked",
]

log = logging.getLogger(__name__)

DEAD_LETTER_CUT_BYTES = 64 * 1024
"""Value bytes kept when a dead letter is too large to produce whole (see
:func:`schemas.records.cut_dead_letter`)."""


class SinkLike(Protocol):
    """What delivery needs of :class:`consumer.kafka.sink.KafkaSink`."""

    async def send(self, records: Sequence[OutRecord]) -> list[asyncio.Future[None]]: ...


class SourcedSinkLike(Protocol):
    """``--exactly-once``: what delivery needs of
    :class:`consumer.kafka.transactions.TransactionalSink` (sends per input partition)."""

    async def send_from(
        self, tp: TopicPartition, records: Sequence[OutRecord]
    ) -> list[asyncio.Future[None]]: ...


class Tracked(Protocol):
    """A record read and tracked in the :class:`OffsetTracker` (its generation there)."""

    @property
    def record(self) -> InRecord: ...
    @property
    def generation(self) -> int: ...


P = TypeVar("P", bound=Tracked)
P_contra = TypeVar("P_contra", bound=Tracked, contravariant=True)

_SinkSend = Callable[[TopicPartition, Sequence[OutRecord]], Awaitable[list[asyncio.Future[None]]]]
_Held = tuple[P, OutRecord, ErrorCode | None, OutRecord | None]
"""A record held while its partition commits: its reply (code None), or its dead letter, code
and error reply."""


class DeliveryOwner(Protocol[P_contra]):
    """What :class:`Delivery` tells its owner (the pipeline, the backfill job); loop thread."""

    def on_delivered(self, delivered: Sequence[tuple[P_contra, OutRecord]]) -> None:
        """These replies (``(pending, reply)`` pairs) were acknowledged together, by one
        producer batch's ack (just before each is finished): per-batch bookkeeping, e.g.
        ``Counter.inc(n)``, happens once per call."""

    def on_dead_lettered(
        self, pending: P_contra, code: ErrorCode, sent: bool, reply_sent: bool
    ) -> None:
        """``pending``'s dead letter was acknowledged (``sent``) or refused even cut; its
        follow-up error reply, if one was given, acknowledged (``reply_sent``)."""

    def on_finished(self, pending: P_contra, completed: bool) -> None:
        """``pending`` needs nothing more from delivery: ``completed`` when its offset was
        finished in the tracker now (False: sink closed, revoked meanwhile, or given up)."""


class Delivery(Generic[P]):
    """Sends replies and dead letters; on the broker's ack finishes the offset.

    Args:
        sink: started; closing it turns every unacknowledged send into "not finished".
        tracker: the owner's offset tracker (``complete`` is called here).
        owner: told of every fate (see :class:`DeliveryOwner`).
        replies: builds the dead letter of a reply the broker refused.
        what: the name of a reply in that dead letter's message ("reply", "output record").
        finish_unsent_dead_letters: finish an offset whose dead letter was refused even cut.
        max_in_flight: at most this many records wait for the broker at once (None: no limit).
        sourced: ``--exactly-once``: sends go to the record's input partition's transaction
            through it (``sink`` is then unused), gated by :meth:`quiesce`/:meth:`reopen`.
        on_dead_letters_denied: called with the reason when the broker's ACLs refuse the
            dead-letter topic; the record is then left unfinished (re-read after a restart),
            never skipped. None: such a dead letter counts as refused even cut.
    """

    def __init__(
        self,
        sink: SinkLike,
        tracker: OffsetTracker,
        owner: DeliveryOwner[P],
        replies: ReplyBuilder,
        *,
        what: str = "reply",
        finish_unsent_dead_letters: bool = True,
        max_in_flight: int | None = None,
        sourced: SourcedSinkLike | None = None,
        on_dead_letters_denied: Callable[[str], None] | None = None,
    ) -> None:
        self._on_denied = on_dead_letters_denied
        # (input partition, records) → one ack future each; the partition picks the
        # transaction under --exactly-once and is ignored otherwise.
        self._sink_send: _SinkSend = (
            (lambda _tp, records: sink.send(records)) if sourced is None else sourced.send_from
        )
        # Per input partition: records started and held (commits under --exactly-once, and
        # revokes in both modes).
        self._gate: IntervalGate[_Held[P]] = IntervalGate()
        self._per_partition = sourced is not None  # one send task per input partition
        self._tracker = tracker
        self._owner = owner
        self._replies = replies
        self._what = what
        self._finish_unsent = finish_unsent_dead_letters
        self._slots = asyncio.Semaphore(max_in_flight) if max_in_flight else None
        self._tasks: set[asyncio.Task[None]] = set()
        self._open = 0  # records given and not yet finished
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def open(self) -> int:
        """Records given to :meth:`send` or :meth:`dead_letter` and not yet finished."""
        return self._open

    def send(self, batch: Sequence[tuple[P, OutRecord]]) -> None:
        """Send each ``pending``'s reply (one task for the batch); each is finished on its ack."""
        if batch:
            self._opened(len(batch))
            self._send_gated(batch)

    def dead_letter(
        self, pending: P, dlq: OutRecord, code: ErrorCode, reply: OutRecord | None = None
    ) -> None:
        """Send ``pending``'s dead letter (cut when refused whole), then ``reply`` (an error
        reply for the client, when it can be addressed); then finish it (see the rules)."""
        self._opened(1)
        if self._gate.admit(pending.record.tp, (pending, dlq, code, reply)):
            self._spawn(self._dead_letter(pending, dlq, code, reply))

    async def quiesce(
        self, tps: frozenset[TopicPartition], timeout_s: float
    ) -> frozenset[TopicPartition]:
        """A commit (``--exactly-once``) or a revoke begins: hold new records of ``tps`` and
        wait up to ``timeout_s`` seconds for their started ones; returns those of ``tps`` quiet
        now (their transactions hold the sends of exactly the records finished in the
        tracker)."""
        self._gate.close(tps)
        return await self._gate.quiet(tps, timeout_s)

    @contextlib.asynccontextmanager
    async def holding(
        self, tps: frozenset[TopicPartition], timeout_s: float
    ) -> AsyncIterator[frozenset[TopicPartition]]:
        """A commit (``--exactly-once``): :meth:`quiesce` ``tps``, give those quiet, then
        :meth:`reopen` those of ``tps`` it closed (a revoke's hold stays until the
        assignment)."""
        closed = self._gate.close(tps)
        try:
            yield await self._gate.quiet(tps, timeout_s)
        finally:
            self.reopen(closed)

    def drop(self, tps: frozenset[TopicPartition]) -> None:
        """``tps`` moved to another member: their held records are never sent, each is
        finished as not completed (its record stays uncommitted here)."""
        for pending, _, _, _ in self._gate.drop(tps):
            self._closed(pending, False)

    def reopen(self, tps: frozenset[TopicPartition]) -> None:
        """The commit or the revoke ended: start the records of ``tps`` held meanwhile."""
        sends: list[tuple[P, OutRecord]] = []
        for pending, record, code, reply in self._gate.reopen(tps):
            if code is None:
                sends.append((pending, record))
            else:
                self._spawn(self._dead_letter(pending, record, code, reply))
        self._send_by_partition(sends)

    async def wait(self, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` seconds until every record given is finished (or given up);
        returns how many are still open."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        return self._open

    # ---- internals ------------------------------------------------------------------------------

    def _opened(self, n: int) -> None:
        self._open += n
        self._idle.clear()

    def _send_gated(self, batch: Sequence[tuple[P, OutRecord]]) -> None:
        gate = self._gate
        self._send_by_partition(
            [
                (pending, record)
                for pending, record in batch
                if gate.admit(pending.record.tp, (pending, record, None, None))
            ]
        )

    def _send_by_partition(self, batch: Sequence[tuple[P, OutRecord]]) -> None:
        """One send task per input partition (its transaction) of started records; one for
        them all outside ``--exactly-once``."""
        if not self._per_partition:
            if batch:
                self._spawn(self._send(batch))
            return
        by_tp: dict[TopicPartition, list[tuple[P, OutRecord]]] = {}
        for pair in batch:
            by_tp.setdefault(pair[0].record.tp, []).append(pair)
        for part in by_tp.values():
            self._spawn(self._send(part))

    def _done(self, pending: P, completed: bool) -> None:
        self._gate.finished(pending.record.tp)
        self._closed(pending, completed)

    def _closed(self, pending: P, completed: bool) -> None:
        """``pending`` needs nothing more (its send ended, or it was held and dropped)."""
        self._open -= 1
        if self._open == 0:
            self._idle.set()
        self._owner.on_finished(pending, completed)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("a delivery task failed", exc_info=task.exception())

    async def _send(self, batch: Sequence[tuple[P, OutRecord]]) -> None:
        tp = batch[0][0].record.tp  # the only one under --exactly-once (_send_by_partition)
        if self._slots is None:
            acks = await self._sink_send(tp, [record for _, record in batch])
        else:
            acks = [await self._send_slotted(tp, record) for _, record in batch]
        # Records that share an ack future (one producer batch, KafkaSink.send) are finished
        # together by one callback.
        shared: dict[asyncio.Future[None], list[tuple[P, OutRecord]]] = {}
        for pair, ack in zip(batch, acks, strict=True):
            shared.setdefault(ack, []).append(pair)
        for ack, members in shared.items():
            ack.add_done_callback(functools.partial(self._acked, members))

    async def _send_slotted(self, tp: TopicPartition, record: OutRecord) -> asyncio.Future[None]:
        assert self._slots is not None
        slots = self._slots
        await slots.acquire()
        (ack,) = await self._sink_send(tp, [record])
        ack.add_done_callback(lambda _: slots.release())
        return ack

    async def _send_one(self, tp: TopicPartition, record: OutRecord) -> None:
        """Send one record of input partition ``tp``'s and wait for its ack (raises what its
        future raises)."""
        if self._slots is None:
            (ack,) = await self._sink_send(tp, [record])
        else:
            ack = await self._send_slotted(tp, record)
        await ack

    def _acked(self, members: list[tuple[P, OutRecord]], ack: asyncio.Future[None]) -> None:
        """The fate of ``members``, the records of one ack future."""
        err = None if ack.cancelled() else ack.exception()
        if ack.cancelled() or isinstance(err, SinkClosedError):
            for pending, _ in members:
                self._done(pending, False)  # answered after a restart
        elif err is None:
            self._owner.on_delivered(members)
            for pending, _ in members:
                self._finish(pending)
        else:  # DeliveryError: e.g. the client named a reply address that cannot exist
            message = f"the {self._what} could not be delivered: {err}"
            code = ErrorCode.INVALID_REQUEST
            if isinstance(err, DeliveryDeniedError):  # the broker's ACLs: kbatch may not write
                topic = members[0][1].topic or "the default topic"
                message = f"the {self._what} to {topic} is not allowed: {err}"
                code = ErrorCode.REPLY_TOPIC_NOT_ALLOWED
            for pending, _ in members:
                dlq = self._replies.dead_letter(pending.record, code, message)
                self._spawn(self._dead_letter(pending, dlq, code, None))  # still open

    async def _dead_letter(
        self, pending: P, dlq: OutRecord, code: ErrorCode, reply: OutRecord | None
    ) -> None:
        r = pending.record
        try:
            sent = await self._send_dead_letter(r, dlq)
        except SinkClosedError:
            self._done(pending, False)
            return
        except (DeliveryDeniedError, DeliveryTopicMissingError) as err:
            if self._on_denied is not None:  # kept unfinished: nothing is lost
                # a deleted topic too (records would be lost otherwise)
                denied = isinstance(err, DeliveryDeniedError)
                remedy = "grant WRITE on it" if denied else "create it"
                self._on_denied(f"the dead-letter topic {dlq.topic} refused: {err}; {remedy}")
                self._done(pending, False)
                return
            sent = False
        reply_sent = False
        if reply is not None:
            try:
                await self._send_one(r.tp, reply)
                reply_sent = True
            except (DeliveryError, SinkClosedError) as err:
                log.warning("error reply for %s@%d not delivered: %s", r.tp, r.offset, err)
        self._owner.on_dead_lettered(pending, code, sent, reply_sent)
        if sent or self._finish_unsent:
            self._finish(pending)
        else:
            self._done(pending, False)

    async def _send_dead_letter(self, r: InRecord, dlq: OutRecord) -> bool:
        """Send ``dlq``; False when the broker refused it even cut down.

        A dead letter can be refused whole — e.g. a 2 MiB value the broker took compressed
        whose copy is over the producer's request size — so it is then sent cut (its first
        :data:`DEAD_LETTER_CUT_BYTES`); the log names the offset to re-read it from.

        Raises:
            SinkClosedError: the sink closed first.
            DeliveryDeniedError: the broker's ACLs refuse the dead-letter topic.
            DeliveryTopicMissingError: the dead-letter topic does not exist.
        """
        try:
            await self._send_one(r.tp, dlq)
            return True
        except (DeliveryDeniedError, DeliveryTopicMissingError):
            raise  # cutting it would not help
        except DeliveryError as err:
            log.warning("dead letter for %s@%d refused (%s); sending it cut", r.tp, r.offset, err)
        try:
            await self._send_one(r.tp, cut_dead_letter(dlq, DEAD_LETTER_CUT_BYTES))
            return True
        except DeliveryError as err:  # one line, no traceback: the error says why
            log.error("dead letter for %s@%d refused, also cut: skipped (%s)", r.tp, r.offset, err)
            return False

    def _finish(self, pending: P) -> None:
        r = pending.record
        self._done(pending, self._tracker.complete(r.tp, r.offset, pending.generation))
