"""Serve's replies on their way out: where each may go (:class:`Outbox`: the operator's
allow-list, :class:`~consumer.replies.topic_policy.ReplyTopicPolicy`), built together once per
loop iteration, sent as one batch, and counted when the broker acknowledges them
(:class:`ReplyAcks`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from consumer.batching.types import ItemOutcome, Lane
from consumer.finish.delivery import Delivery
from consumer.kafka.flow import FlowControl
from consumer.replies.builder import ReplyBuilder
from consumer.replies.topic_policy import ReplyTopicPolicy
from consumer.serve.metrics import Metrics
from consumer.serve.pending import Pending
from schemas.errors import ErrorCode
from schemas.headers import STATUS, last_value
from schemas.records import OutRecord, RecordDecodeError

if TYPE_CHECKING:
    from consumer.tracing.requests import RequestTracing

__all__ = ["Outbox", "ReplyAcks"]

log = logging.getLogger(__name__)


class Outbox:
    """The replies due in one loop iteration (a batch's outcomes, the answers of a poll
    chunk), built together and handed to delivery as one batch once the engine has had its
    turn to launch the next batch (the model does not wait while replies are built).

    It also decides where every reply may go, error replies included (CONTRACT.md
    §Error codes, ``reply_topic_not_allowed``: never a reply). A record's ``kafka_replyTopic``
    is checked against ``reply_topics`` once, when it is read — :meth:`addressed` for a request
    that decoded, :meth:`undecodable` for one that did not — and a refused record is only
    dead-lettered. Every later reply to a request that passed (admission's, an expiry, a dedup
    copy's, the model's outcome, an inference failure) goes to the address checked then.

    ``tracing`` (``--tracing``): each reply carries its request span's ``traceparent``.
    """

    def __init__(
        self,
        replies: ReplyBuilder,
        delivery: Delivery[Pending],
        reply_topics: ReplyTopicPolicy,
        tracing: RequestTracing | None = None,
    ) -> None:
        self._replies = replies
        self._delivery = delivery
        self._reply_topics = reply_topics
        self._tracing = tracing
        self._due: list[tuple[Pending, ItemOutcome | OutRecord, bool]] = []

    def add(self, pending: Pending, what: ItemOutcome | OutRecord, dedup: bool = False) -> None:
        """Make ``what`` (an outcome, or a reply built already) ``pending``'s reply, soon
        (``pending`` passed :meth:`addressed`)."""
        self._due.append((pending, what, dedup))
        if len(self._due) == 1:
            asyncio.get_running_loop().call_soon(self._send_due)

    def addressed(self, pending: Pending) -> bool:
        """Whether the decoded request ``pending`` may be answered where it asks; when not,
        it is dead-lettered ``reply_topic_not_allowed`` and nothing is written there."""
        assert pending.parsed is not None
        refusal = self._refusal(pending.parsed.address.topic)
        if refusal is None:
            return True
        self._dead_letter(pending, ErrorCode.REPLY_TOPIC_NOT_ALLOWED, refusal, None)
        return False

    def undecodable(self, pending: Pending, err: RecordDecodeError) -> None:
        """Dead-letter ``pending``, which failed to decode (``err``), and send it the error
        reply when it can be addressed. A record naming a reply topic it may not gets no
        reply: its dead letter is ``reply_topic_not_allowed``, its message naming the decode
        error too (a reply topic is checked first, as the headers are)."""
        refusal = self._refusal(err.address.topic)
        if refusal is not None:
            message = f"{refusal}; the request is also invalid ({err.code.value}: {err.message})"
            self._dead_letter(pending, ErrorCode.REPLY_TOPIC_NOT_ALLOWED, message, None)
        else:
            self._dead_letter(pending, err.code, err.message, err)

    def _refusal(self, topic: str | None) -> str | None:
        """Why no reply may go to ``topic`` (None: the configured reply topic), or None; the
        first refusal of a topic in a minute is logged."""
        refusal = self._reply_topics.check(topic)
        if refusal is None:
            return None
        if refusal.log:
            log.warning("dead-lettering requests: %s", refusal.message)
        return refusal.message

    def _dead_letter(
        self, pending: Pending, code: ErrorCode, message: str, err: RecordDecodeError | None
    ) -> None:
        """Dead-letter ``pending`` (and answer it when its decode error ``err`` is
        addressable: its reply topic was checked already)."""
        dlq = self._replies.dead_letter(pending.record, code, message)
        reply = (
            self._replies.decode_error_reply(err) if err is not None and err.addressable else None
        )
        if reply is not None and self._tracing is not None:
            self._tracing.dead_letter_reply(pending, reply)
        self._delivery.dead_letter(pending, dlq, code, reply)

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
            pending.status = (last_value(what.headers, STATUS) or b"").decode()
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


class ReplyAcks:
    """What serve does when delivery is done with a record (its
    :class:`~consumer.finish.delivery.DeliveryOwner`): count the replies and dead letters,
    end the request spans, release the record's flow credit and wake a drain waiting for it.
    """

    def __init__(
        self,
        metrics: Metrics,
        flow: FlowControl,
        progress: asyncio.Event,
        wall_clock_ms: Callable[[], int],
        tracing: RequestTracing | None = None,
    ) -> None:
        self._metrics = metrics
        self._flow = flow
        self._progress = progress
        self._wall_ms = wall_clock_ms
        self._tracing = tracing

    def on_delivered(self, delivered: Sequence[tuple[Pending, OutRecord]]) -> None:
        """These replies were acknowledged together (one producer batch's ack).

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
        """``pending``'s dead letter was acknowledged (``sent``) or skipped."""
        if sent:
            self._metrics.dead_letters.labels(code.value).inc()
        else:
            self._metrics.dead_letters_failed.labels(code.value).inc()
        if reply_sent:
            self._metrics.reply_status("error", pending.lane).inc()
        if self._tracing is not None:
            self._tracing.dead_lettered(pending, code.value)

    def on_finished(self, pending: Pending, completed: bool) -> None:
        """``pending`` is done; its flow credit is released when its offset was finished now
        (not after a revoke)."""
        if completed:
            self._flow.remove(pending.record.tp, 1, pending.n_tokens)
        self._progress.set()
