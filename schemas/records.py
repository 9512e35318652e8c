"""Request, reply and dead-letter records as raw parts (CONTRACT.md §Request record, §Reply
record, §Dead letters).

Pure functions on ``key: bytes | None``, ``value: bytes | None`` and
``headers: Sequence[tuple[str, bytes | None]]`` (the shapes aiokafka's ``ConsumerRecord`` has);
nothing here imports a Kafka client or does I/O. The sink sends ``OutRecord``s.

Typical use in the pipeline::

    try:
        parsed = parse_request_record(rec.key, rec.value, rec.headers, max_text_bytes=...)
    except RecordDecodeError as exc:
        out = [build_dead_letter(rec.key, rec.value, rec.headers, exc.code, exc.message,
                                 rec.topic, rec.partition, rec.offset, dlq_topic)]
        if exc.addressable:
            out.append(build_error_reply(exc, model=model_info))
    ...
    out = build_reply_record(reply, key=parsed.key, address=parsed.address,
                             encoding=parsed.encoding)
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Final, TypeVar

from schemas import headers as h
from schemas.codec import (
    DEFAULT_MAX_META_BYTES,
    DEFAULT_MAX_TEXT_BYTES,
    Encoding,
    decode_request,
    encode_reply_wire,
    header_text,
)
from schemas.errors import DecodeError, EncodeError, ErrorCode
from schemas.models import ErrorInfo, ModelInfo, Reply, Request

__all__ = [
    "MAX_KEY_BYTES",
    "OutRecord",
    "ParsedRequest",
    "RecordDecodeError",
    "ReplyAddress",
    "build_dead_letter",
    "build_error_reply",
    "build_reply_record",
    "parse_request_record",
    "reply_record",
]

MAX_KEY_BYTES: Final = 256
"""Longest request key (CONTRACT.md §Request record, key)."""

_T = TypeVar("_T")

_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
"""A legal Kafka topic name (the broker's own rule, ``Topic.validate``)."""

Headers = Sequence[tuple[str, bytes | None]]
"""Record headers as (name, value) pairs; Kafka allows a null value."""


# OutRecord, ReplyAddress and ParsedRequest are built once per request on the serving path, so
# they are slotted but not ``frozen`` (a frozen ``__init__`` sets each field through
# ``object.__setattr__``: OutRecord 1.8 → 0.5 µs). They are read-only all the same: nothing
# changes one after it is built.


@dataclass(slots=True)
class OutRecord:
    """A record to send. ``topic`` None means the configured reply topic; ``partition`` None
    lets the producer's default partitioner (murmur2 of the key) choose. ``key``, ``value`` and
    header values are None only where the source record's were (dead letters keep them).
    Read-only by convention (not ``frozen``: see above)."""

    topic: str | None
    partition: int | None
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


@dataclass(slots=True)
class ReplyAddress:
    """Where a reply goes, read from the request headers (CONTRACT.md §Reply record).

    ``topic``: ``kafka_replyTopic`` or None (the configured reply topic); ``partition``:
    ``kafka_replyPartition`` or None (by key); ``correlation_id``: ``kafka_correlationId``
    verbatim, or None when the request had none.
    """

    topic: str | None = None
    partition: int | None = None
    correlation_id: bytes | None = None


class RecordDecodeError(DecodeError):
    """A request record that cannot be served, with what was recovered to answer it anyway.

    Raised by ``schemas.records.parse_request_record``. The caller writes a dead letter
    (``build_dead_letter``) and, when ``addressable``, an error reply (``build_error_reply``).

    Attributes:
        key: the record key when non-empty, else None (an empty key counts as no key).
        address: the reply address as far as the headers could be read; a malformed header
            leaves its part None (configured reply topic / partition by key).
        encoding: the request's encoding, or None when ``content-type`` was unknown.
    """

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        key: bytes | None,
        address: ReplyAddress,
        encoding: Encoding | None,
        meta: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(code, message, meta=meta)
        self.key: bytes | None = key or None
        self.address: ReplyAddress = address
        self.encoding: Encoding | None = encoding

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled (a process pool's result) as a call: the keyword-only fields in a partial.
        rebuild = partial(
            RecordDecodeError, key=self.key, address=self.address, encoding=self.encoding,
            meta=self.meta,
        )  # fmt: skip
        return (rebuild, (self.code, self.message))

    @property
    def addressable(self) -> bool:
        """Whether the client can be answered: a non-empty key or a ``kafka_correlationId``.

        CONTRACT.md §Dead letters.
        """
        return self.key is not None or self.address.correlation_id is not None

    @property
    def reply_encoding(self) -> Encoding:
        """The encoding of the error reply: the request's, msgpack when it was unknown."""
        return self.encoding if self.encoding is not None else Encoding.MSGPACK


@dataclass(slots=True)
class ParsedRequest:
    """A request record that can be served: its non-empty ``key`` (≤ ``MAX_KEY_BYTES``), the
    validated ``request``, the reply ``address`` and the ``encoding`` the reply must use."""

    key: bytes
    request: Request
    address: ReplyAddress
    encoding: Encoding


_KNOWN_TOPICS: dict[bytes, str] = {}
"""``kafka_replyTopic`` values already checked (most clients use a handful of reply topics)."""

_MAX_KNOWN_TOPICS: Final = 1024
"""At most this many are remembered."""


def _reply_topic(raw: bytes | None) -> str | None:
    if raw is None:
        return None
    known = _KNOWN_TOPICS.get(raw)
    if known is not None:
        return known
    topic = header_text(raw, h.REPLY_TOPIC)
    if not _TOPIC_NAME.fullmatch(topic) or topic in (".", ".."):
        raise DecodeError(
            ErrorCode.INVALID_REQUEST,
            f"the {h.REPLY_TOPIC} header {topic[:100]!r} is not a legal topic name "
            "(1-249 of A-Z a-z 0-9 . _ -)",
        )
    if len(_KNOWN_TOPICS) < _MAX_KNOWN_TOPICS:
        _KNOWN_TOPICS[bytes(raw)] = topic
    return topic


def _reply_partition(raw: bytes | None) -> int | None:
    if raw is None:
        return None
    if len(raw) != h.REPLY_PARTITION_BYTES:
        raise DecodeError(
            ErrorCode.INVALID_REQUEST,
            f"the {h.REPLY_PARTITION} header is {len(raw)} bytes; it must be a 4-byte "
            "big-endian int",
        )
    (partition,) = struct.unpack(">i", raw)
    if partition < 0:
        raise DecodeError(
            ErrorCode.INVALID_REQUEST,
            f"the {h.REPLY_PARTITION} header is {partition}; a partition is never negative",
        )
    return int(partition)


def _recovered(
    parse: Callable[[bytes | None], _T], raw: bytes | None, problems: list[DecodeError]
) -> _T | None:
    """``parse(raw)``, or None with its :class:`DecodeError` added to ``problems``."""
    try:
        return parse(raw)
    except DecodeError as exc:
        problems.append(exc)
        return None


def _key_and_value_problems(key: bytes | None, value: bytes | None) -> list[DecodeError]:
    """What a request record's key (required, at most ``MAX_KEY_BYTES``) and value (not a
    tombstone) break, in that order."""
    problems = []
    if key is None:
        problems.append(
            DecodeError(
                ErrorCode.INVALID_REQUEST,
                "the record has no key (an empty key counts as none); the key is the "
                "request's idempotency key and is required",
            )
        )
    elif len(key) > MAX_KEY_BYTES:
        problems.append(
            DecodeError(
                ErrorCode.INVALID_REQUEST,
                f"the record key is {len(key)} bytes; at most {MAX_KEY_BYTES} are accepted",
            )
        )
    if value is None:
        problems.append(
            DecodeError(ErrorCode.INVALID_REQUEST, "the record has no value (a tombstone)")
        )
    return problems


def parse_request_record(
    key: bytes | None,
    value: bytes | None,
    headers: Headers,
    *,
    max_text_bytes: int = DEFAULT_MAX_TEXT_BYTES,
    max_meta_bytes: int = DEFAULT_MAX_META_BYTES,
) -> ParsedRequest:
    """Read a request record (CONTRACT.md §Request record).

    Checks, in order: ``content-type``, ``kafka_replyTopic`` (UTF-8, a legal topic name),
    ``kafka_replyPartition`` (exactly 4 bytes, big-endian signed, not negative), the key
    (present, non-empty, at most ``MAX_KEY_BYTES``), then the value (``decode_request``).
    ``kafka_correlationId`` is opaque and always recovered. For repeated headers the last wins.

    Raises:
        RecordDecodeError: with the first problem's code and message, plus everything that
            could still be recovered — the non-empty key, each well-formed part of the reply
            address, the encoding, and ``meta`` when the value decoded that far — so an
            ``addressable`` record gets an error reply (CONTRACT.md §Dead letters).
    """
    found = h.last_values(headers)
    problems: list[DecodeError] = []
    encoding = _recovered(Encoding.from_content_type, found.get(h.CONTENT_TYPE), problems)
    topic = _recovered(_reply_topic, found.get(h.REPLY_TOPIC), problems)
    partition = _recovered(_reply_partition, found.get(h.REPLY_PARTITION), problems)
    address = ReplyAddress(topic, partition, found.get(h.CORRELATION_ID))
    key = bytes(key) if key else None
    problems.extend(_key_and_value_problems(key, value))

    if problems:
        meta = None
        if encoding is not None and value is not None:
            try:  # only to echo meta in the error reply
                meta = decode_request(
                    value, encoding, max_text_bytes=max_text_bytes, max_meta_bytes=max_meta_bytes
                ).meta
            except DecodeError as exc:
                meta = exc.meta
        first = problems[0]
        raise RecordDecodeError(
            first.code, first.message, key=key, address=address, encoding=encoding, meta=meta
        )
    assert key is not None and value is not None and encoding is not None
    try:
        request = decode_request(
            value, encoding, max_text_bytes=max_text_bytes, max_meta_bytes=max_meta_bytes
        )
    except DecodeError as exc:
        raise RecordDecodeError(
            exc.code, exc.message, key=key, address=address, encoding=encoding, meta=exc.meta
        ) from exc
    return ParsedRequest(key=key, request=request, address=address, encoding=encoding)


def build_reply_record(
    reply: Reply, *, key: bytes | None, address: ReplyAddress, encoding: Encoding
) -> OutRecord:
    """The reply record for one request record (CONTRACT.md §Reply record).

    Topic and partition from ``address`` (None: configured reply topic / by key); ``key`` copied
    byte for byte; headers ``kafka_correlationId`` (when the request had one), ``content-type``
    and ``kbatch-status``; the value is ``reply`` in ``encoding`` (the request's).

    Raises:
        EncodeError: when ``reply.meta`` cannot be carried by ``encoding``.
    """
    return reply_record(reply.to_wire(), key=key, address=address, encoding=encoding)


_CONTENT_TYPES: Final = {e: (h.CONTENT_TYPE, e.value.encode("ascii")) for e in Encoding}
_STATUSES: Final = {s: (h.STATUS, s.encode("ascii")) for s in ("ok", "error", "expired")}


def reply_record(
    wire: dict[str, Any], *, key: bytes | None, address: ReplyAddress, encoding: Encoding
) -> OutRecord:
    """:func:`build_reply_record` for a reply in wire form (``Reply.to_wire()`` or
    ``schemas.models.reply_wire``), not validated again: the serving path's builder.

    Raises:
        EncodeError: when ``wire["meta"]`` cannot be carried by ``encoding``.
    """
    headers: list[tuple[str, bytes | None]] = []
    if address.correlation_id is not None:
        headers.append((h.CORRELATION_ID, address.correlation_id))
    headers.append(_CONTENT_TYPES[encoding])
    status: str = wire["status"]
    headers.append(_STATUSES.get(status) or (h.STATUS, status.encode("ascii")))
    return OutRecord(
        topic=address.topic,
        partition=address.partition,
        key=key,
        value=encode_reply_wire(wire, encoding),
        headers=headers,
    )


def build_error_reply(error: RecordDecodeError, *, model: ModelInfo) -> OutRecord:
    """The ``error`` reply for a record that could not be served but can be addressed.

    Encoded in the request's encoding, msgpack when it was unknown; echoes the request's
    ``meta`` when it was recovered (CONTRACT.md §Dead letters, §Request record ``meta``).

    Raises:
        ValueError: when ``error.addressable`` is false (no key and no correlation id).
    """
    if not error.addressable:
        raise ValueError("the record has neither a key nor a kafka_correlationId to answer")
    info = ErrorInfo(code=error.code, message=error.message)
    reply = Reply(status="error", error=info, model=model, meta=error.meta)
    try:
        return build_reply_record(
            reply, key=error.key, address=error.address, encoding=error.reply_encoding
        )
    except EncodeError:  # a recovered meta that cannot be echoed: answer without it
        reply = Reply(status="error", error=info, model=model)
        return build_reply_record(
            reply, key=error.key, address=error.address, encoding=error.reply_encoding
        )


def cut_dead_letter(dead_letter: OutRecord, max_value_bytes: int) -> OutRecord:
    """``dead_letter`` with its value cut to its first ``max_value_bytes`` bytes and an
    ``kbatch.dlq.original-value-bytes`` header (the original length) — for a record the broker
    accepted compressed but whose copy is too large to produce. Key and headers unchanged.

    Raises ``ValueError`` for a negative ``max_value_bytes``.
    """
    if max_value_bytes < 0:
        raise ValueError(f"max_value_bytes must be >= 0, got {max_value_bytes}")
    value = dead_letter.value or b""
    return OutRecord(
        topic=dead_letter.topic,
        partition=dead_letter.partition,
        key=dead_letter.key,
        value=value[:max_value_bytes],
        headers=[*dead_letter.headers, (h.ORIGINAL_VALUE_BYTES, str(len(value)).encode())],
    )


def build_dead_letter(
    key: bytes | None,
    value: bytes | None,
    headers: Headers,
    code: ErrorCode,
    message: str,
    source_topic: str,
    source_partition: int,
    source_offset: int,
    dlq_topic: str,
) -> OutRecord:
    """The dead-letter record for a record that cannot be served (CONTRACT.md §Dead letters).

    The original key, value and headers unchanged (order and repeats kept, null values too),
    followed by ``kbatch.error.code``, ``kbatch.error.message``, ``kbatch.source.topic``,
    ``kbatch.source.partition`` and ``kbatch.source.offset`` as UTF-8 strings (partition and
    offset in decimal). Headers already carrying these names (a re-driven dead letter) stay;
    readers take the last of each name. Partition None: chosen by key.
    """
    added = [
        (h.ERROR_CODE, str(ErrorCode(code))),
        (h.ERROR_MESSAGE, message),
        (h.SOURCE_TOPIC, source_topic),
        (h.SOURCE_PARTITION, str(int(source_partition))),
        (h.SOURCE_OFFSET, str(int(source_offset))),
    ]
    out: list[tuple[str, bytes | None]] = [
        (name, None if raw is None else bytes(raw)) for name, raw in headers
    ]
    out.extend((name, text.encode("utf-8", "replace")) for name, text in added)
    return OutRecord(
        topic=dlq_topic,
        partition=None,
        key=None if key is None else bytes(key),
        value=None if value is None else bytes(value),
        headers=out,
    )
