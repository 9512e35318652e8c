"""Request/reply over Kafka: send a text to kbatch and await its reply (docs/CONTRACT.md).

One :class:`RequestReplyClient` owns one producer and one **reply listener** shared by every
call. The listener is a plain consumer without a consumer group: at
:meth:`~RequestReplyClient.start` it assigns itself every partition of the reply topic (or
only ``reply_partition``) and fixes its position at the current end offset before any request
is sent, so no reply is missed and no group join (seconds of rebalance) delays the first
call. Several clients may share a reply topic: each reads every reply and keeps the ones whose
``kafka_correlationId`` it issued (others count as :attr:`~RequestReplyClient.stray_replies`).
A dead letter (a copy of a request with ``kbatch.error.*`` headers, CONTRACT.md §Dead letters)
is never a reply, even with this client's correlation id: a reply topic that is the server's
request or dead-letter topic is refused at construction, and a dead letter read is skipped
(:attr:`~RequestReplyClient.dead_letters_skipped`).
Giving each client instance its own ``reply_partition`` avoids reading the others' replies.

Each send carries a fresh 16-byte ``kafka_correlationId`` (as Spring's ``ReplyingKafkaTemplate``)
and ``kafka_replyTopic``. A call with ``retries`` re-sends an unanswered request after
``retry_after_s`` with the **same key** (the contract's idempotency key), so the server answers
the copy from the first computation (``dedup: true``) instead of computing again; whichever
attempt's reply arrives first completes the call, later ones are ignored. Every attempt sends
the value encoded once, byte for byte: a key stands for one input, and a key that the server
has in flight or answered within its dedup window for another text (rerank: query and
documents) is answered ``error`` ``idempotency_key_reused`` (contract 1.4) — give each
different request its own key (the default key is random).

Errors (all raised by :meth:`RequestReplyClient.request` unless noted)::

    ClientError                 base class
     ├── ClientClosedError      the client is not started, or was closed while the call waited
     ├── RequestTimeoutError    no reply within timeout_s (also a TimeoutError)
     ├── SendError              the request could not be produced (broker error), .retriable
     └── ReplyDecodeError       the reply to this call is not a valid version-1 reply

aiokafka errors are translated here, at the edge; ``ValueError`` (from the contract's models)
means the request itself is invalid (empty text, oversized meta) and was never sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import struct
import threading
import time
import uuid
from collections.abc import Awaitable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import numpy as np
import numpy.typing as npt
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError
from aiokafka.structs import ConsumerRecord

from consumer.kafka.admin import denied_topics
from consumer.kafka.aiokafka_errors import DENIALS, describe_denial
from consumer.kafka.client_config import FIRST_ANSWER_TIMEOUT_S, start_client
from consumer.kafka.errors import KafkaUnavailableError
from producer_tools.tracing import current_trace_headers, reply_context, reply_traceparent
from schemas import headers as H
from schemas.codec import Encoding, decode_reply, encode_request
from schemas.embedding import decode_embedding
from schemas.errors import DecodeError
from schemas.models import (
    Aggregation,
    ChunkedEmbedResult,
    Chunking,
    EmbedResult,
    EncodingFormat,
    Priority,
    Reply,
    Request,
    SparseResult,
    Task,
)
from schemas.sparse import decode_sparse

__all__ = [
    "ClientClosedError",
    "ClientError",
    "ReplyDecodeError",
    "ReplyEnvelope",
    "ReplyRecordMeta",
    "RequestReplyClient",
    "RequestReplyClientSync",
    "RequestTimeoutError",
    "SendError",
    "request_sync",
]

log = logging.getLogger(__name__)

CORRELATION_ID_BYTES = 16
_TOPIC_POLL_S = 0.25  # metadata poll while waiting for the topics to be created
"""Length of the random ``kafka_correlationId`` of each send (Spring sends 16 bytes)."""

_T = TypeVar("_T")


# ---- errors ----------------------------------------------------------------------------------


SERVE_DEFAULT_REPLY_TOPIC = "kbatch.replies"
"""``kbatch serve``'s default ``--reply-topic``, which its default ``--allowed-reply-topics``
allows."""


class ClientError(RuntimeError):
    """Base class of every error the request/reply client raises."""

    retriable: bool = False


class ClientClosedError(ClientError):
    """The client is not started, or it was closed while the call was waiting."""


class RequestTimeoutError(ClientError, TimeoutError):
    """No reply arrived within ``timeout_s`` (after ``attempts`` sends of the same key)."""

    retriable = True

    def __init__(
        self, key: bytes, timeout_s: float, attempts: int, topic: str, reply_topic: str = ""
    ) -> None:
        self.key = key
        self.timeout_s = timeout_s
        self.attempts = attempts
        self.topic = topic
        allowed = (  # serve's own --reply-topic (kbatch.replies by default) is always allowed
            f", and does it allow replies to {reply_topic!r} (--allowed-reply-topics: a reply "
            "topic it refuses gets only a dead letter)"
            if reply_topic and reply_topic != SERVE_DEFAULT_REPLY_TOPIC
            else ""
        )
        super().__init__(
            f"no reply to key {key!r} within {timeout_s:g} s after {attempts} send(s) to "
            f"{topic!r}: is a kbatch serve consuming that topic{allowed}?"
        )


class SendError(ClientError):
    """The request could not be produced; ``retriable`` says whether a resend may succeed."""

    def __init__(self, message: str, *, retriable: bool) -> None:
        super().__init__(message)
        self.retriable = retriable


class ReplyDecodeError(ClientError):
    """The reply to this call is not a valid version-1 reply (``schemas.errors.DecodeError``)."""


# ---- results ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReplyRecordMeta:
    """Where and how a reply record arrived.

    ``timestamp_ms`` is the record's Kafka timestamp (Unix epoch ms, the producer's clock);
    ``headers`` are the record's headers in order; ``status`` is the ``kbatch-status`` header.
    """

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    correlation_id: bytes
    status: str | None


@dataclass(frozen=True, slots=True)
class ReplyEnvelope:
    """The decoded reply of one call, with its record's metadata and the call's timing.

    ``sent_s`` (first send) and ``received_s`` are :func:`time.monotonic` seconds;
    ``attempts`` is how many times the key was sent, ``answered_attempt`` which of them
    (1-based) this reply answers.
    """

    reply: Reply
    record: ReplyRecordMeta
    key: bytes
    encoding: Encoding
    attempts: int
    answered_attempt: int
    sent_s: float
    received_s: float

    @property
    def latency_s(self) -> float:
        """Seconds from the first send to the reply's arrival."""
        return self.received_s - self.sent_s

    @property
    def traceparent(self) -> str | None:
        """The reply's ``traceparent``: kbatch's request span (None when kbatch runs without
        ``--tracing``); docs/TRACING.md."""
        return reply_traceparent(self.record.headers)

    def trace_context(self) -> Any:
        """An OpenTelemetry ``Context`` continuing the trace from kbatch's span (start the
        reply's handling span in it: ``tracer.start_span(name, context=env.trace_context())``).

        Raises:
            RuntimeError: ``opentelemetry-api`` is not installed.
        """
        return reply_context(self.record.headers)

    def embedding(self, *, unpack_bits: bool = True) -> npt.NDArray[Any] | None:
        """The reply's embedding as a numpy vector, whatever ``encoding_format`` carried it;
        None for a reply without one (error, classify).

        ``float`` and ``f32le``: ``(dim,)`` float32; ``f16le``: ``(dim,)`` float16;
        ``binary``: ``(dim,)`` uint8 of 0/1 bits, or with ``unpack_bits=False`` the
        ``(⌈dim/8⌉,)`` packed uint8 bytes as sent (what Hamming-distance indexes take).
        """
        result = self.reply.result
        if not isinstance(result, EmbedResult):
            return None
        return decode_embedding(
            result.embedding, result.format, result.dim, unpack_bits=unpack_bits
        )

    def chunks(self) -> list[tuple[int, int, npt.NDArray[Any]]] | None:
        """A chunked embed reply's chunks (contract 1.3, ``output: "chunks"``): each chunk's
        ``(start, end, vector)`` (characters of the request's text; the vector as
        :meth:`embedding` decodes one); None for a reply without chunks."""
        result = self.reply.result
        if not isinstance(result, ChunkedEmbedResult):
            return None
        return [
            (c.start, c.end, decode_embedding(c.embedding, result.format, result.dim))
            for c in result.chunks
        ]

    def sparse(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[Any]] | None:
        """A sparse reply's ``(indices int64, values)`` (float32, or float16 for ``f16le``),
        whatever ``encoding_format`` carried them; None for a reply without one."""
        result = self.reply.result
        if not isinstance(result, SparseResult):
            return None
        return decode_sparse(result.model_dump())

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict: the reply as the contract writes it (an embedding sent as bytes
        shown as its decoded list: floats, or 0/1 bits for ``binary``), plus the record and
        timing."""
        vector, sparse, chunks = self.embedding(), self.sparse(), self.chunks()
        decoded: dict[str, Any] = {}  # bytes have no JSON form: the decoded lists instead
        if chunks is not None:  # each chunk's vector decoded, as one embedding's
            decoded["chunks"] = [
                {"embedding": v.astype(float).tolist(), "start": a, "end": b} for a, b, v in chunks
            ]
        elif sparse is not None:
            decoded = {"indices": sparse[0].tolist(), "values": sparse[1].astype(float).tolist()}
        elif vector is not None:
            decoded["embedding"] = vector.tolist()
        exclude = {"result": set(decoded)} if decoded else None
        reply = self.reply.model_dump(mode="json", exclude_none=True, exclude=exclude)
        if decoded:
            reply["result"] = {**decoded, **reply["result"]}
        return {
            "reply": reply,
            "record": {
                "topic": self.record.topic,
                "partition": self.record.partition,
                "offset": self.record.offset,
                "timestamp_ms": self.record.timestamp_ms,
                "key": self.key.decode("utf-8", errors="replace"),
                "correlation_id": self.record.correlation_id.hex(),
                "status": self.record.status,
            },
            "attempts": self.attempts,
            "answered_attempt": self.answered_attempt,
            "latency_ms": round(self.latency_s * 1000, 3),
        }


@dataclass(slots=True)
class _Call:
    """One pending call: its future and the correlation id of each attempt."""

    future: asyncio.Future[tuple[Reply, ReplyRecordMeta, Encoding, float, int]]
    attempts: dict[bytes, int] = field(default_factory=dict)


# ---- the async client ------------------------------------------------------------------------


class RequestReplyClient:
    """Async request/reply client of kbatch; see the module docstring for the design.

    Args:
        bootstrap: Kafka bootstrap servers (``host:port,…``).
        request_topic: Topic kbatch serve consumes.
        reply_topic: Topic the replies should go to (sent as ``kafka_replyTopic``).
            :meth:`start` waits for it and the request topic to exist (``kbatch serve``
            creates its own topics as it starts; a client's own reply topic is created with
            ``kbatch topics create`` or the platform's tooling).
        reply_partition: Read only this partition and ask for replies there
            (``kafka_replyPartition``); default: all partitions, the server picks by key.
        encoding: Default encoding of requests (the reply comes back in the same).
        linger_ms: Producer linger: how long a send may wait to share a batch (latency cost).
        start_timeout_s: Most seconds :meth:`start` waits for the broker and topic metadata.
        kafka_options: Extra aiokafka keyword arguments for both clients (security settings).
        read_committed: Read replies with ``isolation_level=read_committed``: only replies of
            committed transactions (a server run with ``--exactly-once``).
        dead_letter_topic: The server's dead-letter topic (``kbatch serve --dlq-topic``), if
            known: refused as ``reply_topic``, as ``request_topic`` always is.
        propagate_trace: Send the current OpenTelemetry span's ``traceparent``/``tracestate``
            with each request (when ``opentelemetry-api`` is installed; docs/TRACING.md).

    Raises:
        ValueError: ``reply_topic`` is ``request_topic`` or ``dead_letter_topic`` (kbatch never
            replies there: the request would only be dead-lettered ``reply_topic_not_allowed``,
            and the client would read requests or dead letters, not replies).

    Use as ``async with RequestReplyClient(...) as client: await client.request("text")``.
    """

    def __init__(
        self,
        *,
        bootstrap: str,
        request_topic: str,
        reply_topic: str,
        reply_partition: int | None = None,
        encoding: Encoding = Encoding.MSGPACK,
        linger_ms: int = 1,
        start_timeout_s: float = 30.0,
        client_id: str = "kbatch-client",
        kafka_options: Mapping[str, Any] | None = None,
        read_committed: bool = False,
        dead_letter_topic: str | None = None,
        propagate_trace: bool = True,
    ) -> None:
        for role, topic in (("request", request_topic), ("dead-letter", dead_letter_topic)):
            if reply_topic == topic:
                raise ValueError(
                    f"the reply topic {reply_topic!r} is the server's {role} topic, where it "
                    "never replies: name a reply topic of your own (`kbatch topics create "
                    "NAME`, allowed by the server's --allowed-reply-topics)"
                )
        if reply_partition is not None and reply_partition < 0:
            raise ValueError(f"reply_partition must be >= 0, got {reply_partition}")
        if start_timeout_s <= 0:
            raise ValueError(f"start_timeout_s must be > 0, got {start_timeout_s}")
        self.bootstrap = bootstrap
        self.request_topic = request_topic
        self.reply_topic = reply_topic
        self.reply_partition = reply_partition
        self.encoding = encoding
        self._linger_ms = linger_ms
        self._start_timeout_s = start_timeout_s
        self._client_id = client_id
        self._kafka_options = dict(kafka_options or {})
        self._isolation_level = "read_committed" if read_committed else "read_uncommitted"
        self._propagate_trace = propagate_trace
        self._producer: AIOKafkaProducer | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._listener: asyncio.Task[None] | None = None
        self._broken: ClientError | None = None  # the reply listener was denied its topic
        self._calls: dict[bytes, _Call] = {}
        self._state: Literal["new", "started", "closed"] = "new"
        self._missing_topics: list[str] = []
        self._started_producer = False  # the broker answered the producer's start
        self._reply_headers: list[tuple[str, bytes]] = [(H.REPLY_TOPIC, reply_topic.encode())]
        if reply_partition is not None:
            self._reply_headers.append((H.REPLY_PARTITION, struct.pack(">i", reply_partition)))
        self.sent = 0
        """Records produced so far (retries included)."""
        self.stray_replies = 0
        """Replies read whose correlation id no pending call owns (late, or another client's)."""
        self.dead_letters_skipped = 0
        """Dead letters read on the reply topic (``kbatch.error.code`` header): not replies."""

    # ---- life cycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect, assign the reply partitions and fix their start at the end offset.

        Raises:
            ClientError: the broker did not answer, or the request or reply topic did not
                exist within ``start_timeout_s``.
        """
        if self._state != "new":
            raise ClientClosedError(f"a client can start once (state: {self._state})")
        self._state = "started"
        try:
            await asyncio.wait_for(self._connect(), self._start_timeout_s)
        except (KafkaError, KafkaUnavailableError, OSError, TimeoutError) as exc:
            await self.close()
            missing = self._missing_topics
            connected = self._producer is not None and self._started_producer
            reason = (
                f"topics {missing} do not exist (`kbatch serve` creates its own request, "
                "reply and dead-letter topics; create others: `kbatch topics create NAME`)"
                if missing
                else str(exc)
                if isinstance(exc, KafkaUnavailableError)  # a refused login names its cause
                else "no answer on an open connection (is it a Kafka listener, and does "
                "--security-protocol match it?)"
                if isinstance(exc, TimeoutError) and not connected
                else repr(exc)
            )
            within = f" within {self._start_timeout_s:g} s" if isinstance(exc, TimeoutError) else ""
            raise ClientError(
                f"cannot start the client on {self.bootstrap} (reply topic "
                f"{self.reply_topic!r}){within}: {reason}"
            ) from exc
        except BaseException:
            await self.close()
            raise

    async def _connect(self) -> None:
        self._producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            client_id=self._client_id,
            acks="all",
            linger_ms=self._linger_ms,
            **self._kafka_options,
        )
        await start_client(
            self._producer.start, self._producer.stop, "the producer", FIRST_ANSWER_TIMEOUT_S
        )
        self._started_producer = True
        partitions = await self._wait_for_topics()
        if self.reply_partition is not None:
            if self.reply_partition not in partitions:
                raise ClientError(
                    f"reply topic {self.reply_topic!r} has partitions {partitions}, "
                    f"not {self.reply_partition}"
                )
            partitions = [self.reply_partition]
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            client_id=f"{self._client_id}-replies",
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="latest",
            isolation_level=self._isolation_level,
            **self._kafka_options,
        )
        await self._consumer.start()
        tps = [TopicPartition(self.reply_topic, p) for p in partitions]
        self._consumer.assign(tps)
        await self._consumer.seek_to_end(*tps)
        for tp in tps:  # resolve the end offsets now: replies to later sends are all after them
            await self._consumer.position(tp)
        self._listener = asyncio.create_task(self._listen(), name="kbatch-reply-listener")

    async def _wait_for_topics(self) -> list[int]:
        """Poll cluster metadata until the request and reply topics exist (a ``kbatch serve``
        started just before creates them); the reply topic's partitions. The caller's deadline
        ends the wait; :attr:`_missing_topics` names what was still missing then."""
        assert self._producer is not None
        wanted = (self.request_topic, self.reply_topic)
        while True:
            metadata = await self._producer.client.fetch_all_metadata()
            self._missing_topics = [t for t in wanted if t not in metadata.topics()]
            if not self._missing_topics:
                return sorted(await self._producer.partitions_for(self.reply_topic))
            denied = await denied_topics(self._producer.client, self._missing_topics)
            if denied:  # hidden by the broker's ACLs, not missing: no use waiting
                raise ClientError(
                    f"the broker denies this principal the topics {denied} "
                    "(TOPIC_AUTHORIZATION_FAILED): a client may write its requests and read "
                    "its own reply topic (docs/SECURITY.md)"
                )
            await asyncio.sleep(_TOPIC_POLL_S)

    async def close(self) -> None:
        """Fail pending calls with :class:`ClientClosedError`, flush, disconnect. Idempotent."""
        if self._state == "closed":
            return
        self._state = "closed"
        self._fail_all(ClientClosedError("the client was closed while the call waited"))
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):  # logged by the listener
                await self._listener
        if self._producer is not None:
            await self._producer.stop()
        if self._consumer is not None:
            await self._consumer.stop()

    async def __aenter__(self) -> RequestReplyClient:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def in_flight(self) -> int:
        """Calls waiting for their reply."""
        return len({id(c) for c in self._calls.values()})

    # ---- calls -------------------------------------------------------------------------------

    async def request(
        self,
        text: str,
        key: str | bytes | None = None,
        *,
        timeout_s: float = 30.0,
        deadline_ms: int | None = None,
        task: Task | None = None,
        meta: dict[str, Any] | None = None,
        truncate: bool | None = None,
        encoding: Encoding | None = None,
        retries: int = 0,
        retry_after_s: float | None = None,
        dimensions: int | None = None,
        normalize: bool | None = None,
        prompt_name: str | None = None,
        encoding_format: EncodingFormat | None = None,
        documents: Sequence[str] | None = None,
        top_n: int | None = None,
        top_k: int | None = None,
        aggregation: Aggregation | None = None,
        redact: bool | None = None,
        priority: Priority | None = None,
        chunking: Chunking | Mapping[str, Any] | None = None,
        trace_headers: Sequence[tuple[str, bytes]] | None = None,
    ) -> ReplyEnvelope:
        """Send ``text`` and return its reply (any status: ok, error or expired).

        The embedding comes back as a numpy vector from :meth:`ReplyEnvelope.embedding`,
        whichever ``encoding_format`` carried it.

        Args:
            text: The input (non-empty).
            key: Idempotency key (str as UTF-8, at most 256 bytes); default: a random one.
                One key, one input: reused for another text within the server's dedup window,
                the reply is the error ``idempotency_key_reused`` (contract 1.4).
            timeout_s: Most seconds from the first send to the reply, retries included.
            deadline_ms: Unix epoch ms after which the server answers ``expired`` unread.
            task, meta, truncate: The contract's request fields.
            encoding: Request encoding; default: the client's.
            retries: Extra sends of the same key while no reply has come.
            retry_after_s: Seconds between sends; default ``timeout_s / (retries + 1)``.
            dimensions, normalize, prompt_name, encoding_format: the embed options of
                contract 1.1 (docs/CONTRACT.md §Embed options); ``encoding_format`` also
                carries a sparse result (float, f32le, f16le).
            documents, top_n: rerank (contract 1.2): ``text`` is the query, scored against
                each document; ``top_n`` adds the best ``top_n`` as ``result.top``.
            top_k: sparse (1.2): keep the ``top_k`` largest weights.
            aggregation, redact: token-classify (1.2): how tokens become entities; also the
                redacted text.
            priority: any task (1.2): ``"live"`` (the server's default) or ``"bulk"``
                (computed in the capacity live requests leave idle; docs/CONTRACT.md §Priority).
            chunking: embed (1.3): ``{"max_tokens", "overlap", "output"}`` (or a
                :class:`~schemas.models.Chunking`): embed the text in chunks; ``output``
                ``"pooled"`` answers one vector (:meth:`ReplyEnvelope.embedding`),
                ``"chunks"`` each chunk's (:meth:`ReplyEnvelope.chunks`).
            trace_headers: ``traceparent``/``tracestate`` headers to send (every attempt);
                default: the current OpenTelemetry span's (``propagate_trace``). The reply's
                :attr:`ReplyEnvelope.traceparent` is kbatch's span, their child.

        Raises:
            RequestTimeoutError: no reply within ``timeout_s``.
            SendError: the broker refused or did not acknowledge a send.
            ReplyDecodeError: the reply is not a valid version-1 reply.
            ClientClosedError: the client is not started or was closed meanwhile.
            ValueError: an invalid request (empty text, bad key, bad arguments), not sent.
        """
        self._check_call(timeout_s, retries, retry_after_s)
        raw_key = _key_bytes(key)
        request = Request(
            text=text, task=task, deadline_ms=deadline_ms, truncate=truncate, meta=meta,
            dimensions=dimensions, normalize=normalize, prompt_name=prompt_name,
            encoding_format=encoding_format, top_n=top_n, top_k=top_k, aggregation=aggregation,
            redact=redact, priority=priority,
            documents=None if documents is None else list(documents),
            chunking=None if chunking is None else Chunking.model_validate(chunking),
        )  # fmt: skip
        return await self._exchange(
            request, raw_key, encoding, timeout_s, retries, retry_after_s, trace_headers
        )

    def _check_call(self, timeout_s: float, retries: int, retry_after_s: float | None) -> None:
        """Raise :meth:`request`'s ClientClosedError, broken-client or ValueError for its
        timing arguments, before anything is encoded or sent."""
        if self._state != "started" or self._producer is None:
            raise ClientClosedError(f"the client is not running (state: {self._state})")
        if self._broken is not None:  # no reply could ever be read
            raise self._broken
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        if retry_after_s is not None and retry_after_s <= 0:
            raise ValueError(f"retry_after_s must be > 0, got {retry_after_s}")

    async def _exchange(
        self,
        request: Request,
        raw_key: bytes,
        encoding: Encoding | None,
        timeout_s: float,
        retries: int,
        retry_after_s: float | None,
        trace_headers: Sequence[tuple[str, bytes]] | None,
    ) -> ReplyEnvelope:
        """Encode ``request`` and send it (again every ``retry_after_s`` while no reply has
        come, ``retries`` times at most) until its reply or ``timeout_s``; :meth:`request`'s
        arguments, checked by :meth:`_check_call`."""
        enc = encoding or self.encoding
        value = encode_request(request, enc)
        if trace_headers is None:
            trace_headers = current_trace_headers() if self._propagate_trace else ()
        interval_s = retry_after_s if retry_after_s is not None else timeout_s / (retries + 1)
        call = _Call(asyncio.get_running_loop().create_future())
        first_sent_s = time.monotonic()
        deadline_s = first_sent_s + timeout_s
        try:
            for attempt in range(1, retries + 2):
                correlation_id = os.urandom(CORRELATION_ID_BYTES)
                call.attempts[correlation_id] = attempt
                self._calls[correlation_id] = call
                attempt_sent_s = time.monotonic()
                await self._send(raw_key, value, correlation_id, enc, deadline_s, trace_headers)
                last = attempt > retries
                wait_until_s = deadline_s if last else min(deadline_s, attempt_sent_s + interval_s)
                done, _ = await asyncio.wait(
                    [call.future], timeout=max(0.0, wait_until_s - time.monotonic())
                )
                if done:
                    break
                if last or time.monotonic() >= deadline_s:
                    raise RequestTimeoutError(
                        raw_key, timeout_s, attempt, self.request_topic, self.reply_topic
                    )
            reply, record, reply_encoding, received_s, answered = call.future.result()
        finally:
            for cid in call.attempts:
                self._calls.pop(cid, None)
            if not call.future.done():
                call.future.cancel()
        return ReplyEnvelope(
            reply=reply,
            record=record,
            key=raw_key,
            encoding=reply_encoding,
            attempts=len(call.attempts),
            answered_attempt=answered,
            sent_s=first_sent_s,
            received_s=received_s,
        )

    async def _send(
        self,
        key: bytes,
        value: bytes,
        correlation_id: bytes,
        enc: Encoding,
        deadline_s: float,
        trace_headers: Sequence[tuple[str, bytes]] = (),
    ) -> None:
        assert self._producer is not None
        headers = [
            *self._reply_headers,
            (H.CORRELATION_ID, correlation_id),
            (H.CONTENT_TYPE, enc.value.encode()),
            *trace_headers,
        ]
        try:
            ack = await self._producer.send(self.request_topic, value, key=key, headers=headers)
            self.sent += 1
            # The ack normally precedes the reply; bound it by the call's deadline anyway.
            await asyncio.wait_for(ack, max(0.001, deadline_s - time.monotonic()))
        except TimeoutError:
            return  # unacknowledged yet: the reply wait decides (and times out) from here
        except KafkaError as exc:
            raise SendError(
                f"cannot produce to {self.request_topic!r}: {exc!r}",
                retriable=bool(getattr(exc, "retriable", False)),
            ) from exc

    # ---- the listener ------------------------------------------------------------------------

    async def _listen(self) -> None:
        assert self._consumer is not None
        try:
            while True:
                batches = await self._consumer.getmany(timeout_ms=500, max_records=1000)
                received_s = time.monotonic()
                for records in batches.values():
                    for record in records:
                        self._dispatch(record, received_s)
        except DENIALS as exc:  # this principal may not read the reply topic: one line
            self._broken = ClientError(
                f"not allowed to read the reply topic {self.reply_topic!r}: {describe_denial(exc)}"
            )
            log.error("%s", self._broken)
            self._fail_all(self._broken)
        except Exception as exc:  # no call can complete any more: fail them, loudly
            log.exception("reply listener on %r failed", self.reply_topic)
            self._fail_all(ClientError(f"the reply listener failed: {exc!r}"))
            raise

    def _dispatch(self, record: ConsumerRecord[bytes, bytes], received_s: float) -> None:
        headers = tuple((k, v) for k, v in record.headers)
        if H.last_value(headers, H.ERROR_CODE) is not None:  # a dead letter: the request's copy
            self.dead_letters_skipped += 1
            return
        correlation_id = H.last_value(headers, H.CORRELATION_ID)
        call = self._calls.get(correlation_id) if correlation_id is not None else None
        if call is None or correlation_id is None or call.future.done():
            self.stray_replies += 1
            return
        status = H.last_value(headers, H.STATUS)
        meta = ReplyRecordMeta(
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            timestamp_ms=record.timestamp,
            key=record.key,
            headers=headers,
            correlation_id=correlation_id,
            status=status.decode("ascii", errors="replace") if status is not None else None,
        )
        try:
            enc = Encoding.from_content_type(H.last_value(headers, H.CONTENT_TYPE))
            reply = decode_reply(record.value or b"", enc)
        except DecodeError as exc:
            call.future.set_exception(
                ReplyDecodeError(
                    f"invalid reply at {record.topic}[{record.partition}]@{record.offset}: {exc}"
                )
            )
            return
        call.future.set_result((reply, meta, enc, received_s, call.attempts[correlation_id]))

    def _fail_all(self, exc: ClientError) -> None:
        for call in self._calls.values():
            if not call.future.done():
                call.future.set_exception(exc)
        self._calls.clear()


def _key_bytes(key: str | bytes | None) -> bytes:
    if key is None:
        return uuid.uuid4().hex.encode()
    raw = key.encode("utf-8") if isinstance(key, str) else bytes(key)
    if not raw or len(raw) > 256:
        raise ValueError(f"a key must be 1 to 256 bytes (CONTRACT.md), got {len(raw)}")
    return raw


# ---- sync wrapper for scripts ----------------------------------------------------------------


class RequestReplyClientSync:
    """A blocking facade for scripts: the async client runs on its own event-loop thread.

    Takes the same keyword arguments as :class:`RequestReplyClient`; usable from any thread,
    including one that runs an event loop of its own (a notebook). ``with`` closes it.

    Raises what :meth:`RequestReplyClient.start` and :meth:`~RequestReplyClient.request` raise.
    """

    def __init__(self, **client_kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="kbatch-client-loop", daemon=True
        )
        self._thread.start()
        self._client = RequestReplyClient(**client_kwargs)
        try:
            self._run(self._client.start())
        except BaseException:
            self._stop_loop()
            raise

    def _run(self, coro: Coroutine[Any, Any, _T] | Awaitable[_T]) -> _T:
        async def wrap() -> _T:
            return await coro

        return asyncio.run_coroutine_threadsafe(wrap(), self._loop).result()

    def request(self, text: str, key: str | bytes | None = None, **kwargs: Any) -> ReplyEnvelope:
        """Blocking :meth:`RequestReplyClient.request` (same arguments)."""
        if self._loop.is_closed():
            raise ClientClosedError("the client was closed")
        return self._run(self._client.request(text, key, **kwargs))

    def close(self) -> None:
        """Close the client and stop its thread. Idempotent."""
        if self._loop.is_closed():
            return
        try:
            self._run(self._client.close())
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> RequestReplyClientSync:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def request_sync(
    text: str,
    key: str | bytes | None = None,
    *,
    bootstrap: str,
    request_topic: str,
    reply_topic: str,
    **request_kwargs: Any,
) -> ReplyEnvelope:
    """One blocking call with a client of its own (connects, sends, waits, closes).

    ``request_kwargs`` are :meth:`RequestReplyClient.request`'s keyword arguments. For many
    calls keep one :class:`RequestReplyClientSync` instead: each start costs a connection.
    """
    with RequestReplyClientSync(
        bootstrap=bootstrap, request_topic=request_topic, reply_topic=reply_topic
    ) as client:
        return client.request(text, key, **request_kwargs)
